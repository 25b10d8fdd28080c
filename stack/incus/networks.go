package incus

import (
	"context"
	"fmt"
	"net/http"
)

// Network is a network as GET /1.0/networks/{name} returns it. Unmanaged
// host interfaces are listed too, with Managed false.
type Network struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Type        string            `json:"type"` // "bridge", "physical", ...
	Status      string            `json:"status"`
	Managed     bool              `json:"managed"`
	Config      map[string]string `json:"config"`
	UsedBy      []string          `json:"used_by"`
}

// NetworksPost creates a managed network.
type NetworksPost struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Type        string            `json:"type"`
	Config      map[string]string `json:"config"`
}

// NetworkPut is the writable state of a network; a PUT replaces all of
// Config, so start from the current one.
type NetworkPut struct {
	Description string            `json:"description"`
	Config      map[string]string `json:"config"`
}

// NetworkState is the kernel's view of a network's interface.
type NetworkState struct {
	Addresses []NetworkAddress `json:"addresses"`
	Hwaddr    string           `json:"hwaddr"`
	MTU       int              `json:"mtu"`
	State     string           `json:"state"` // "up" or "down"
	Type      string           `json:"type"`
}

// ListNetworks lists all networks.
func (api Networks) List(ctx context.Context) ([]Network, error) {
	c := api.c
	var out []Network
	if err := c.list(ctx, apiPath("networks"), nil, &out); err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	return out, nil
}

// Network fetches one network and its ETag for UpdateNetwork.
func (api Networks) Get(ctx context.Context, name string) (*Network, string, error) {
	c := api.c
	var n Network
	etag, err := c.get(ctx, apiPath("networks", name), nil, &n)
	if err != nil {
		return nil, "", fmt.Errorf("getting network %s: %w", name, err)
	}
	return &n, etag, nil
}

// CreateNetwork creates a managed network.
func (api Networks) Create(ctx context.Context, req NetworksPost) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("networks"), json: req}); err != nil {
		return fmt.Errorf("creating network %s: %w", req.Name, err)
	}
	return nil
}

// UpdateNetwork replaces a network's description and config; with an etag
// a concurrent change makes it fail with IsPreconditionFailed.
func (api Networks) Update(ctx context.Context, name string, put NetworkPut, etag string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("networks", name), json: put, etag: etag}); err != nil {
		return fmt.Errorf("updating network %s: %w", name, err)
	}
	return nil
}

// DeleteNetwork deletes a managed network; Incus refuses while it is in use.
func (api Networks) Delete(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("networks", name)}); err != nil {
		return fmt.Errorf("deleting network %s: %w", name, err)
	}
	return nil
}

// NetworkState fetches the state of a network's host interface.
func (api Networks) State(ctx context.Context, name string) (*NetworkState, error) {
	c := api.c
	var st NetworkState
	if _, err := c.get(ctx, apiPath("networks", name, "state"), nil, &st); err != nil {
		return nil, fmt.Errorf("getting state of network %s: %w", name, err)
	}
	return &st, nil
}

// NetworkLease is one DHCP lease of a managed network, as dnsmasq on the
// host granted it (GET /1.0/networks/{name}/leases): the host's account,
// not what an instance says about itself.
type NetworkLease struct {
	Hostname string `json:"hostname"`
	Hwaddr   string `json:"hwaddr"`
	Address  string `json:"address"`
	Type     string `json:"type"` // "dynamic", "static" or "gateway"
	Location string `json:"location"`
	Project  string `json:"project"`
}

// NetworkLeases lists a managed network's leases.
func (api Networks) Leases(ctx context.Context, name string) ([]NetworkLease, error) {
	c := api.c
	var out []NetworkLease
	if _, err := c.get(ctx, apiPath("networks", name, "leases"), nil, &out); err != nil {
		return nil, fmt.Errorf("reading leases of network %s: %w", name, err)
	}
	return out, nil
}
