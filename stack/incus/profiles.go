package incus

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Profile is a profile (GET /1.0/profiles/{name}).
type Profile struct {
	Name        string                       `json:"name"`
	Description string                       `json:"description"`
	Config      map[string]string            `json:"config"`
	Devices     map[string]map[string]string `json:"devices"`
	UsedBy      []string                     `json:"used_by,omitempty"`
}

type profilePut struct {
	Description string                       `json:"description"`
	Config      map[string]string            `json:"config"`
	Devices     map[string]map[string]string `json:"devices"`
}

// Profiles lists all profiles.
func (c *Client) Profiles(ctx context.Context) ([]Profile, error) {
	var out []Profile
	if err := c.list(ctx, apiPath("profiles"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing profiles: %w", err)
	}
	return out, nil
}

// HasProfile says whether the profile exists, from the list of profile
// names: a profile's own GET lists every instance using it, which beside
// many boxes is most of its cost.
func (c *Client) HasProfile(ctx context.Context, name string) (bool, error) {
	var urls []string
	if _, err := c.get(ctx, apiPath("profiles"), nil, &urls); err != nil {
		return false, fmt.Errorf("listing profiles: %w", err)
	}
	// Another project's URLs carry ?project=.
	return slices.ContainsFunc(urls, func(u string) bool {
		p, _, _ := strings.Cut(u, "?")
		return p == apiPath("profiles", name)
	}), nil
}

// Profile fetches one profile and its ETag for UpdateProfile.
func (c *Client) Profile(ctx context.Context, name string) (*Profile, string, error) {
	var p Profile
	etag, err := c.get(ctx, apiPath("profiles", name), nil, &p)
	if err != nil {
		return nil, "", fmt.Errorf("getting profile %s: %w", name, err)
	}
	return &p, etag, nil
}

// CreateProfile creates a profile. An existing one is a 500 in Incus, not a
// 409: use IsAlreadyExists.
func (c *Client) CreateProfile(ctx context.Context, p Profile) error {
	body := struct {
		Name string `json:"name"`
		profilePut
	}{p.Name, profilePut{p.Description, p.Config, p.Devices}}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("profiles"), json: body}); err != nil {
		return fmt.Errorf("creating profile %s: %w", p.Name, err)
	}
	return nil
}

// UpdateProfile replaces a profile's description, config and devices (p.Name
// and p.UsedBy are ignored); Incus applies the change to every instance
// using it. With an etag a concurrent change fails with IsPreconditionFailed.
func (c *Client) UpdateProfile(ctx context.Context, name string, p Profile, etag string) error {
	body := profilePut{p.Description, p.Config, p.Devices}
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("profiles", name), json: body, etag: etag}); err != nil {
		return fmt.Errorf("updating profile %s: %w", name, err)
	}
	return nil
}

// DeleteProfile deletes a profile; Incus refuses while instances use it.
func (c *Client) DeleteProfile(ctx context.Context, name string) error {
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("profiles", name)}); err != nil {
		return fmt.Errorf("deleting profile %s: %w", name, err)
	}
	return nil
}
