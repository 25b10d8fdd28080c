package incus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Instance is a container or VM as GET /1.0/instances/{name} returns it.
type Instance struct {
	Name            string                       `json:"name"`
	Description     string                       `json:"description"`
	Status          string                       `json:"status"`
	StatusCode      int                          `json:"status_code"`
	Type            string                       `json:"type"` // "container" or "virtual-machine"
	Architecture    string                       `json:"architecture"`
	Location        string                       `json:"location"`
	Project         string                       `json:"project"`
	Ephemeral       bool                         `json:"ephemeral"`
	Stateful        bool                         `json:"stateful"`
	CreatedAt       time.Time                    `json:"created_at"`
	LastUsedAt      time.Time                    `json:"last_used_at"`
	Config          map[string]string            `json:"config"`
	Devices         map[string]map[string]string `json:"devices"`
	Profiles        []string                     `json:"profiles"`
	ExpandedConfig  map[string]string            `json:"expanded_config"`
	ExpandedDevices map[string]map[string]string `json:"expanded_devices"`
}

// Writable is a copy of the part of i that UpdateInstance accepts, for the
// read-modify-write a PUT needs; changing it leaves i alone.
func (i *Instance) Writable() InstancePut {
	var devices map[string]map[string]string
	if i.Devices != nil {
		devices = make(map[string]map[string]string, len(i.Devices))
		for k, d := range i.Devices {
			devices[k] = maps.Clone(d)
		}
	}
	return InstancePut{
		Description:  i.Description,
		Config:       maps.Clone(i.Config),
		Devices:      devices,
		Profiles:     slices.Clone(i.Profiles),
		Ephemeral:    i.Ephemeral,
		Stateful:     i.Stateful,
		Architecture: i.Architecture,
	}
}

// InstancePut is the whole writable state of an instance. PUT replaces it
// all: a nil Config or Devices clears them, so start from Writable().
type InstancePut struct {
	Description  string                       `json:"description"`
	Config       map[string]string            `json:"config"`
	Devices      map[string]map[string]string `json:"devices"`
	Profiles     []string                     `json:"profiles"`
	Ephemeral    bool                         `json:"ephemeral"`
	Stateful     bool                         `json:"stateful"`
	Architecture string                       `json:"architecture"`
}

// InstanceSource says where a new instance's root comes from: an image
// (by Alias or Fingerprint, on this server or pulled from an image server),
// a copy of another instance, or nothing.
type InstanceSource struct {
	Type        string `json:"type"` // "image", "copy" or "none"
	Alias       string `json:"alias,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Properties pick an image by its properties instead (os, release,
	// variant...).
	Properties map[string]string `json:"properties,omitempty"`
	// Source is the instance ("inst") or snapshot ("inst/snap") to copy.
	Source       string `json:"source,omitempty"`
	InstanceOnly bool   `json:"instance_only,omitempty"`
	Live         bool   `json:"live,omitempty"`
	// Server, Protocol and Mode "pull" have incusd pull the image from an
	// image server itself (and cache it), as the incus CLI asks for
	// images:ALIAS: Server is its URL, Protocol "simplestreams" (or
	// "incus"). Certificate is the server's certificate (PEM) to pin, for
	// a server the system's CAs do not vouch for; Secret is a token for
	// an Incus server's private image.
	Server      string `json:"server,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Mode        string `json:"mode,omitempty"`
	Certificate string `json:"certificate,omitempty"`
	Secret      string `json:"secret,omitempty"`
}

// InstancesPost creates an instance. A nil Profiles gets the project's
// "default" profile; an empty non-nil slice gets no profile at all.
type InstancesPost struct {
	Name        string `json:"name"`
	Type        string `json:"type,omitempty"` // "container" or "virtual-machine"
	Description string `json:"description,omitempty"`
	// Architecture is needed by a copy to another cluster member.
	Architecture string                       `json:"architecture,omitempty"`
	Source       InstanceSource               `json:"source"`
	Config       map[string]string            `json:"config,omitempty"`
	Devices      map[string]map[string]string `json:"devices,omitempty"`
	Profiles     []string                     `json:"profiles"`
	Ephemeral    bool                         `json:"ephemeral"`
	Start        bool                         `json:"start"`
}

// InstanceState is the runtime state (GET /1.0/instances/{name}/state).
type InstanceState struct {
	Status     string                     `json:"status"`
	StatusCode int                        `json:"status_code"`
	Pid        int64                      `json:"pid"`
	Processes  int64                      `json:"processes"`
	StartedAt  time.Time                  `json:"started_at"`
	Network    map[string]InstanceNetwork `json:"network"`
	// Disk is each disk's usage, by device name; a volume whose usage the
	// pool cannot measure (a dir pool without project quotas) is absent.
	Disk map[string]InstanceDisk `json:"disk,omitempty"`
}

// InstanceDisk is one disk's usage in bytes (Total: its quota, 0 when
// Incus reports none).
type InstanceDisk struct {
	Usage int64 `json:"usage"`
	Total int64 `json:"total,omitempty"`
}

// InstanceNetwork is one interface inside an instance; HostName is the
// host-side veth/tap.
type InstanceNetwork struct {
	Hwaddr    string           `json:"hwaddr"`
	HostName  string           `json:"host_name"`
	State     string           `json:"state"`
	Type      string           `json:"type"`
	MTU       int              `json:"mtu"`
	Addresses []NetworkAddress `json:"addresses"`
}

// NetworkAddress is an address on an interface (instance or network).
type NetworkAddress struct {
	Family  string `json:"family"` // "inet" or "inet6"
	Address string `json:"address"`
	Netmask string `json:"netmask"`
	Scope   string `json:"scope"` // "global", "link", "local"
}

// ListInstances lists the instances whose config matches every key/value in
// filter (nil lists all), filtered by the server in a single request.
// Values may contain single spaces, but not double quotes, other whitespace
// or nothing at all: the Incus filter language cannot express those, so they
// are refused here rather than silently matching something else.
func (api Instances) List(ctx context.Context, filter map[string]string) ([]Instance, error) {
	c := api.c
	expr, err := configFilter(filter)
	if err != nil {
		return nil, fmt.Errorf("listing instances: %w", err)
	}
	return c.Instances().Where(ctx, expr)
}

// InstancesWhere lists instances matching a raw Incus filter expression,
// e.g. `config.user.box eq 1 or config.user.claudebox eq 1` ("" for all).
func (api Instances) Where(ctx context.Context, rawFilter string) ([]Instance, error) {
	c := api.c
	var q url.Values
	if rawFilter != "" {
		q = url.Values{"filter": {rawFilter}}
	}
	var out []Instance
	if err := c.list(ctx, apiPath("instances"), q, &out); err != nil {
		return nil, fmt.Errorf("listing instances: %w", err)
	}
	return out, nil
}

// configFilter renders {"user.box": "1"} as `config.user.box eq 1`. Incus
// splits the filter on whitespace and only understands quotes that span
// several words (a quoted single word keeps its closing quote), so a value
// is quoted only when it contains whitespace.
func configFilter(filter map[string]string) (string, error) {
	keys := make([]string, 0, len(filter))
	for k := range filter {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	clauses := make([]string, 0, len(keys))
	for _, k := range keys {
		v := filter[k]
		switch {
		case k == "" || strings.ContainsFunc(k, unicode.IsSpace) || strings.Contains(k, `"`):
			return "", fmt.Errorf("config key %q cannot be used in an incus filter", k)
		case v == "" || strings.Contains(v, `"`) || strings.Join(strings.Fields(v), " ") != v:
			// Incus rejoins a quoted value's words with single spaces, so
			// only such values can be matched exactly.
			return "", fmt.Errorf("value %q of %s cannot be used in an incus filter (empty, quoted, or not single-spaced)", v, k)
		case strings.Contains(v, " "):
			v = `"` + v + `"`
		}
		clauses = append(clauses, "config."+k+" eq "+v)
	}
	return strings.Join(clauses, " and "), nil
}

// Instance fetches one instance and its ETag for UpdateInstance.
func (api Instances) Get(ctx context.Context, name string) (*Instance, string, error) {
	c := api.c
	var inst Instance
	etag, err := c.get(ctx, apiPath("instances", name), nil, &inst)
	if err != nil {
		return nil, "", fmt.Errorf("getting instance %s: %w", name, err)
	}
	return &inst, etag, nil
}

// InstanceState fetches the runtime state: status, init pid, interfaces.
func (api Instances) State(ctx context.Context, name string) (*InstanceState, error) {
	c := api.c
	var st InstanceState
	if _, err := c.get(ctx, apiPath("instances", name, "state"), nil, &st); err != nil {
		return nil, fmt.Errorf("getting state of instance %s: %w", name, err)
	}
	return &st, nil
}

// CreateInstance creates (and, with Start, starts) an instance and waits
// until Incus has finished.
func (api Instances) Create(ctx context.Context, req InstancesPost) error {
	c := api.c
	return c.Instances().CreateWithProgress(ctx, req, nil)
}

// CreateInstanceWithProgress is CreateInstance telling progress, while
// Incus works, each new line of progress it reports (ProgressText): an
// image pulled from an image server ("rootfs: 45% (12.34MB/s)"), then
// unpacked. A nil progress hears nothing.
func (api Instances) CreateWithProgress(ctx context.Context, req InstancesPost, progress func(string)) error {
	c := api.c
	if req.Name == "" {
		return errors.New("creating instance: no name given")
	}
	if _, err := c.doWatched(ctx, request{method: http.MethodPost, path: apiPath("instances"), json: req}, progress); err != nil {
		return fmt.Errorf("creating instance %s: %w", req.Name, err)
	}
	return nil
}

// SetInstanceState runs start, stop, restart, freeze or unfreeze and waits.
// For stop and restart, timeout is how long a clean shutdown may take (0
// means the server's default of 10 minutes); force kills at once instead.
func (api Instances) SetState(ctx context.Context, name, action string, timeout time.Duration, force bool) error {
	c := api.c
	secs := -1
	if timeout > 0 {
		secs = max(1, int(timeout.Round(time.Second)/time.Second))
	}
	body := map[string]any{"action": action, "timeout": secs, "force": force}
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("instances", name, "state"), json: body}); err != nil {
		return fmt.Errorf("%s instance %s: %w", action, name, err)
	}
	return nil
}

// UpdateInstance replaces the writable state of an instance. With a non-empty
// etag (from Instance) the PUT is refused with 412 if someone changed the
// instance since; check with IsPreconditionFailed.
func (api Instances) Update(ctx context.Context, name string, put InstancePut, etag string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodPut, path: apiPath("instances", name), json: put, etag: etag}); err != nil {
		return fmt.Errorf("updating instance %s: %w", name, err)
	}
	return nil
}

// RenameInstance renames a stopped instance. Incus refuses a running one
// only inside the operation, as a generic failure; so the state is checked
// first and a running instance gets a StatusError with Code 409 (IsConflict)
// that says to stop it.
func (api Instances) Rename(ctx context.Context, name, newName string) error {
	c := api.c
	st, err := c.Instances().State(ctx, name)
	if err != nil {
		return fmt.Errorf("renaming instance %s to %s: %w", name, newName, err)
	}
	if st.Status != "Stopped" {
		return fmt.Errorf("renaming instance %s to %s: %w", name, newName, &StatusError{
			Method: http.MethodPost, Path: apiPath("instances", name), Code: http.StatusConflict,
			Message: fmt.Sprintf("instance is %s; stop it first", strings.ToLower(st.Status)),
		})
	}
	body := map[string]any{"name": newName}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("instances", name), json: body}); err != nil {
		return fmt.Errorf("renaming instance %s to %s: %w", name, newName, err)
	}
	return nil
}

// DeleteInstance deletes an instance and its snapshots. Incus refuses a
// running instance (400 "Instance is running"): stop it first.
func (api Instances) Delete(ctx context.Context, name string) error {
	c := api.c
	if _, err := c.do(ctx, request{method: http.MethodDelete, path: apiPath("instances", name)}); err != nil {
		return fmt.Errorf("deleting instance %s: %w", name, err)
	}
	return nil
}

// WaitAddress waits until the instance has an IPv4 address inside subnet,
// read from Incus's view of its interfaces (whatever they are named, eth0
// in a container, enp5s0 in a VM), and returns it.
func (api Instances) WaitAddress(ctx context.Context, name string, subnet netip.Prefix, limit time.Duration) (netip.Addr, error) {
	c := api.c
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		if st, err := c.Instances().State(ctx, name); err == nil {
			for _, nic := range st.Network {
				for _, a := range nic.Addresses {
					if ip, err := netip.ParseAddr(a.Address); err == nil && subnet.Contains(ip) {
						return ip, nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return netip.Addr{}, fmt.Errorf("%s has no address in %s after %s", name, subnet, limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// AllInstances lists every instance of every project (all-projects=true),
// each naming its Project: what a census of a bridge must start from, since
// any project's instance may have a NIC on it.
func (api Instances) All(ctx context.Context) ([]Instance, error) {
	c := api.c
	var out []Instance
	// Incus refuses a project alongside all-projects.
	if err := c.Project("").list(ctx, apiPath("instances"), url.Values{"all-projects": {"true"}}, &out); err != nil {
		return nil, fmt.Errorf("listing instances of all projects: %w", err)
	}
	return out, nil
}

// MoveInstance moves a stopped instance to another cluster member and
// waits: POST /1.0/instances/NAME?target=MEMBER with {"migration": true}.
// On local storage the member pulls it, snapshots and all; its config and
// devices stay as they are.
func (api Instances) Move(ctx context.Context, name, member string) error {
	c := api.c
	if member == "" {
		return fmt.Errorf("moving instance %s: no member given", name)
	}
	body := map[string]any{"migration": true}
	if _, err := c.Target(member).do(ctx, request{method: http.MethodPost, path: apiPath("instances", name), json: body}); err != nil {
		return fmt.Errorf("moving instance %s to member %s: %w", name, member, err)
	}
	return nil
}
