package incus

import (
	"context"
	"fmt"
	"net/http"
)

// ACLRule is one network ACL rule. Incus requires State on every rule; an
// empty State is sent as "enabled".
type ACLRule struct {
	Action          string `json:"action"` // "allow", "reject", "drop", "allow-stateless"
	Source          string `json:"source,omitempty"`
	Destination     string `json:"destination,omitempty"`
	Protocol        string `json:"protocol,omitempty"`
	SourcePort      string `json:"source_port,omitempty"`
	DestinationPort string `json:"destination_port,omitempty"`
	ICMPType        string `json:"icmp_type,omitempty"`
	ICMPCode        string `json:"icmp_code,omitempty"`
	Description     string `json:"description,omitempty"`
	State           string `json:"state,omitempty"` // "enabled", "disabled", "logged"
}

// NetworkACL is a network ACL (GET /1.0/network-acls/{name}).
type NetworkACL struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Egress      []ACLRule         `json:"egress"`
	Ingress     []ACLRule         `json:"ingress"`
	Config      map[string]string `json:"config"`
	UsedBy      []string          `json:"used_by,omitempty"`
}

// aclPut is what PUT accepts; Name and UsedBy are not writable.
type aclPut struct {
	Description string            `json:"description"`
	Egress      []ACLRule         `json:"egress"`
	Ingress     []ACLRule         `json:"ingress"`
	Config      map[string]string `json:"config"`
}

// withStates fills in the State Incus insists on ("State must be one of").
func withStates(rules []ACLRule) []ACLRule {
	out := make([]ACLRule, len(rules))
	for i, r := range rules {
		if r.State == "" {
			r.State = "enabled"
		}
		out[i] = r
	}
	return out
}

// NetworkACLs lists all network ACLs.
func (api Networks) ACLs(ctx context.Context) ([]NetworkACL, error) {
	c := api.c
	var out []NetworkACL
	if err := c.list(ctx, apiPath("network-acls"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing network ACLs: %w", err)
	}
	return out, nil
}

// NetworkACL fetches one ACL and its ETag for UpdateNetworkACL.
func (api Networks) ACL(ctx context.Context, name string) (*NetworkACL, string, error) {
	c := api.c
	var acl NetworkACL
	etag, err := c.get(ctx, apiPath("network-acls", name), nil, &acl)
	if err != nil {
		return nil, "", fmt.Errorf("getting network ACL %s: %w", name, err)
	}
	return &acl, etag, nil
}

// CreateNetworkACL creates an ACL. An existing one is a 400 in Incus, not a
// 409: use IsAlreadyExists.
func (api Networks) CreateACL(ctx context.Context, acl NetworkACL) error {
	c := api.c
	body := struct {
		Name string `json:"name"`
		aclPut
	}{acl.Name, aclPut{acl.Description, withStates(acl.Egress), withStates(acl.Ingress), acl.Config}}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("network-acls"), json: body}); err != nil {
		return fmt.Errorf("creating network ACL %s: %w", acl.Name, err)
	}
	return nil
}

// UpdateNetworkACL replaces an ACL's description, rules and config (acl.Name
// and acl.UsedBy are ignored). With an etag a concurrent change makes it
// fail with IsPreconditionFailed.
func (api Networks) UpdateACL(ctx context.Context, name string, acl NetworkACL, etag string) error {
	c := api.c
	body := aclPut{acl.Description, withStates(acl.Egress), withStates(acl.Ingress), acl.Config}
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("network-acls", name), json: body, etag: etag}); err != nil {
		return fmt.Errorf("updating network ACL %s: %w", name, err)
	}
	return nil
}

// DeleteNetworkACL deletes an ACL; Incus refuses while a network uses it.
func (api Networks) DeleteACL(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("network-acls", name)}); err != nil {
		return fmt.Errorf("deleting network ACL %s: %w", name, err)
	}
	return nil
}
