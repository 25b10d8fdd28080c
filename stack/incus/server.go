package incus

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Server is what GET /1.0 reports about the daemon.
type Server struct {
	APIVersion    string            `json:"api_version"`
	APIStatus     string            `json:"api_status"`
	APIExtensions []string          `json:"api_extensions"`
	Auth          string            `json:"auth"`
	Public        bool              `json:"public"`
	Environment   ServerEnvironment `json:"environment"`
	Config        map[string]any    `json:"config"`
}

// ServerEnvironment describes the host incusd runs on.
type ServerEnvironment struct {
	Addresses          []string          `json:"addresses"`
	Architectures      []string          `json:"architectures"`
	Certificate        string            `json:"certificate"`
	Driver             string            `json:"driver"` // e.g. "lxc | qemu"; see Drivers
	DriverVersion      string            `json:"driver_version"`
	Firewall           string            `json:"firewall"`
	Kernel             string            `json:"kernel"`
	KernelArchitecture string            `json:"kernel_architecture"`
	KernelFeatures     map[string]string `json:"kernel_features"`
	KernelVersion      string            `json:"kernel_version"`
	LXCFeatures        map[string]string `json:"lxc_features"`
	OSName             string            `json:"os_name"`
	OSVersion          string            `json:"os_version"`
	Project            string            `json:"project"`
	Server             string            `json:"server"`
	ServerClustered    bool              `json:"server_clustered"`
	ServerName         string            `json:"server_name"`
	ServerPid          int               `json:"server_pid"`
	ServerVersion      string            `json:"server_version"`
	StorageDriver      string            `json:"storage"`
	StorageVersion     string            `json:"storage_version"`
}

// Server fetches GET /1.0.
func (c *Client) Server(ctx context.Context) (*Server, error) {
	var s Server
	if _, err := c.get(ctx, "/1.0", nil, &s); err != nil {
		return nil, fmt.Errorf("getting server info: %w", err)
	}
	return &s, nil
}

// Drivers lists the instance drivers the server can run right now, e.g.
// ["lxc", "qemu"]. Incus drops a driver from this list when the host cannot
// run it, which is why it, not /dev/kvm, decides VM or container.
func (s *Server) Drivers() []string {
	var out []string
	for d := range strings.SplitSeq(s.Environment.Driver, "|") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// CanRunVMs reports whether the qemu driver is available.
func (s *Server) CanRunVMs() bool { return slices.Contains(s.Drivers(), "qemu") }

// HasExtension reports whether the server advertises an API extension.
func (s *Server) HasExtension(name string) bool { return slices.Contains(s.APIExtensions, name) }
