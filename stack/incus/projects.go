package incus

import (
	"context"
	"fmt"
	"net/http"
)

// Project is an Incus project (GET /1.0/projects/{name}). Its objects are
// reached through Client.Project(name), not through this value.
type Project struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Config      map[string]string `json:"config"`
	UsedBy      []string          `json:"used_by,omitempty"`
}

type projectPut struct {
	Description string            `json:"description"`
	Config      map[string]string `json:"config"`
}

// ListProjects lists all projects the caller may see.
func (api Projects) List(ctx context.Context) ([]Project, error) {
	c := api.c
	var out []Project
	if err := c.list(ctx, apiPath("projects"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing projects: %w", err)
	}
	return out, nil
}

// GetProject fetches one project and its ETag for UpdateProject. (The name
// Project is taken by the method that scopes a client to a project.)
func (api Projects) Get(ctx context.Context, name string) (*Project, string, error) {
	c := api.c
	var p Project
	etag, err := c.get(ctx, apiPath("projects", name), nil, &p)
	if err != nil {
		return nil, "", fmt.Errorf("getting project %s: %w", name, err)
	}
	return &p, etag, nil
}

// CreateProject creates a project.
func (api Projects) Create(ctx context.Context, p Project) error {
	c := api.c
	body := struct {
		Name string `json:"name"`
		projectPut
	}{p.Name, projectPut{p.Description, p.Config}}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("projects"), json: body}); err != nil {
		return fmt.Errorf("creating project %s: %w", p.Name, err)
	}
	return nil
}

// UpdateProject replaces a project's description and config (p.Name and
// p.UsedBy are ignored). With an etag a concurrent change fails with
// IsPreconditionFailed.
func (api Projects) Update(ctx context.Context, name string, p Project, etag string) error {
	c := api.c
	body := projectPut{p.Description, p.Config}
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("projects", name), json: body, etag: etag}); err != nil {
		return fmt.Errorf("updating project %s: %w", name, err)
	}
	return nil
}

// DeleteProject deletes a project; Incus refuses unless it is empty.
func (api Projects) Delete(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("projects", name)}); err != nil {
		return fmt.Errorf("deleting project %s: %w", name, err)
	}
	return nil
}
