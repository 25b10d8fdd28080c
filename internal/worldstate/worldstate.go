// Package worldstate is what a hermetic world's state file says (the
// world the project builds on this machine, fixtures/world, docs/world.md):
// where the file is, the live world it describes, and the fixed
// addresses, names and ports of the world's plan. It does no I/O but
// read the state file and check the world's processes live, so that a
// caller that only runs in a world (drill run) reads it without the code
// that builds one. fixtures/world writes the file, and names these types
// and values as its own.
package worldstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Default locations and names.
const (
	DefaultName = "boxw"
	// StateRoot holds one folder per world, named after it.
	StateRoot = "/run/box-world"
	// StateEnv names a state file to use instead of the default.
	StateEnv = "BOX_WORLD_STATE"
	// StateVersion is the version of the world a state file describes: it
	// changes when the world gains or loses something, so that a world
	// built before is rebuilt rather than taken for this one. 2: the host
	// services, the host's /etc and the LAN resolver. 3: the second canary
	// and the rebinding name. 4: cluster worlds (members). 5: the stand-ins
	// (image server, Debian mirror, npm registry) and the world's CA. 6:
	// the witness nameserver and the bulk server (egress.go). 7: the btrfs
	// pool (pool.go). 8: a LAN host in a routed prefix that is not
	// private (RoutedPublic), in both shapes, and a private address behind
	// the default route (Modem).
	StateVersion = 8
)

// Names of the world's namespaces and links, derived from its name.
type Names struct {
	World       string `json:"world"` // the world's name
	HostNS      string `json:"host_ns"`
	InetNS      string `json:"inet_ns"`
	LANNS       string `json:"lan_ns"`
	Uplink      string `json:"uplink"`        // host side of the uplink
	UplinkPeer  string `json:"uplink_peer"`   // internet side
	LANLink     string `json:"lan_link"`      // host side of the LAN link
	LANLinkPeer string `json:"lan_link_peer"` // LAN side (the router's, routed)
	// The routed shape only: the router namespace and its link to the LAN.
	RouterNS       string `json:"router_ns"`
	RouterLink     string `json:"router_link"`      // router side
	RouterLinkPeer string `json:"router_link_peer"` // LAN side
	// The machine's links (machine.go): its uplink and LAN ends, in the
	// host namespace until incusd moves them into the machine, and their
	// peers in the internet and LAN namespaces.
	MachineUp      string `json:"machine_up"`
	MachineUpPeer  string `json:"machine_up_peer"`
	MachineLAN     string `json:"machine_lan"`
	MachineLANPeer string `json:"machine_lan_peer"`
}

// NamesFor derives every name from the world's name.
func NamesFor(name string) Names {
	return Names{
		World: name, HostNS: name + "-host", InetNS: name + "-inet", LANNS: name + "-lan",
		Uplink: name + "-up", UplinkPeer: name + "-inet",
		LANLink: name + "-lan", LANLinkPeer: name + "-lanr",
		RouterNS: name + "-rtr", RouterLink: name + "-rtl", RouterLinkPeer: name + "-rtp",
		MachineUp: name + "-mup", MachineUpPeer: name + "-mupi", MachineLAN: name + "-mln", MachineLANPeer: name + "-mlni",
	}
}

// HostFQDN is the host's own name in the internal zone, e.g.
// "boxw-host.corp.internal.", standing for its LAN address (LANHostSide);
// the LAN resolver and the host's hosts file both know it.
func (n Names) HostFQDN() string { return n.HostNS + "." + InternalZone }

// ZoneNames is every name the LAN resolver holds: InternalNames and the
// host's own name.
func (n Names) ZoneNames() []InternalName {
	return append(append([]InternalName(nil), InternalNames...),
		InternalName{Name: n.HostFQDN(), Addr: LANHostSide.Addr()})
}

// EtcDir is /etc/netns/<host namespace>: `ip netns exec` bind-mounts every
// file in it over the same name in /etc, for the command it runs (incusd,
// and the dnsmasq incusd spawns, inherit those mounts). Only files that
// exist when the command starts are mounted. Down removes the folder.
func (n Names) EtcDir() string { return filepath.Join("/etc/netns", n.HostNS) }

// ResolvConf is the host namespace's resolv.conf: "search corp.internal"
// and the LAN resolver as its only nameserver, like a corporate host.
func (n Names) ResolvConf() string { return filepath.Join(n.EtcDir(), "resolv.conf") }

// HostsFile is the host namespace's hosts file: localhost, the host's own
// name (HostFQDN and its short form) at its LAN address, and HostOnlyNames.
// It is written before incusd starts, so incusd and its dnsmasq see it.
//
// A running incusd (and its dnsmasq) holds a bind mount of this file's
// inode, so whoever adds a name to it later must edit it IN PLACE: open
// it with O_TRUNC or O_APPEND and write (os.WriteFile on this path does).
// Writing a new file and renaming it over this path, as many editors and
// atomic-write helpers do, leaves them with the old content; a command
// started later with `ip netns exec` would see the new one. dnsmasq reads
// its hosts files at start and on SIGHUP.
func (n Names) HostsFile() string { return filepath.Join(n.EtcDir(), "hosts") }

// ClusterNS is the namespace holding the cluster LAN's bridge.
func (n Names) ClusterNS() string { return n.World + "-cl" }

// State is the live world, as written to its state file.
type State struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Names   Names  `json:"names"`
	// Nonce is the secret the world's greeters answer with: a reply that
	// carries it came from the world's own host, nobody else.
	Nonce           string `json:"nonce"`
	StateDir        string `json:"state_dir"`
	IncusDir        string `json:"incus_dir,omitempty"`
	IncusSocket     string `json:"incus_socket,omitempty"`
	IncusdPID       int    `json:"incusd_pid,omitempty"`
	IncusUserPID    int    `json:"incus_user_pid,omitempty"` // the incus-user activator (ServeIncusUser)
	ServicesPID     int    `json:"services_pid,omitempty"`
	BridgeNetfilter bool   `json:"bridge_netfilter"`
	Shape           string `json:"shape,omitempty"`
	// Members is a cluster world's members, the first being the host
	// namespace (IncusDir and IncusSocket are its); empty for a standalone
	// world.
	Members []Member  `json:"members,omitempty"`
	Created time.Time `json:"created"`

	// The stand-ins (standins.go). DataDir is the world's data folder.
	// IncusConf is an incus CLI configuration folder (INCUS_CONF) whose
	// "images" remote is ImageServerURL with the world's image server
	// certificate pinned; CACert the world CA's certificate (PEM), which
	// boxes of the world's Debian image trust; ImageDir what the image
	// server serves; DebianImage the cached build served as
	// debian/12/cloud ("" when none is); MirrorHosts the Debian mirror
	// names the repository stand-in answers.
	DataDir     string   `json:"data_dir,omitempty"`
	IncusConf   string   `json:"incus_conf,omitempty"`
	CACert      string   `json:"ca_cert,omitempty"`
	ImageDir    string   `json:"image_dir,omitempty"`
	DebianImage string   `json:"debian_image,omitempty"`
	MirrorHosts []string `json:"mirror_hosts,omitempty"`

	// Machine is the world's machine, when it has one (machine.go).
	Machine *MachineState `json:"machine,omitempty"`
}

// Clustered says whether this world is an Incus cluster.
func (s *State) Clustered() bool { return len(s.Members) > 0 }

// StatePath is where the state of a world with this state dir lives.
func StatePath(stateDir string) string { return filepath.Join(stateDir, "state.json") }

// Greeting is the line a world greeter sends first, naming who it is.
func (s *State) Greeting(role string) string {
	return "BOXWORLD " + role + " " + s.Nonce
}

// SSHBanner is the identification line the host's ssh stand-in sends first
// (without its CRLF): an SSH-2.0 version whose software part carries the
// world's nonce.
func (s *State) SSHBanner() string {
	return "SSH-2.0-BOXWORLD_" + s.Nonce
}

// ErrNoWorld is returned by Load when no world is up.
var ErrNoWorld = errors.New("no hermetic world is up (build it with `make world` or `drill world up`)")

// Load reads the state of the running world: from $BOX_WORLD_STATE, else
// the default state dir. It checks that the world's processes are alive.
func Load() (*State, error) {
	path := os.Getenv(StateEnv)
	if path == "" {
		path = StatePath(filepath.Join(StateRoot, DefaultName))
	}
	return LoadFile(path)
}

// LoadFile reads a world state file and checks the world is alive.
func LoadFile(path string) (*State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoWorld
	}
	if err != nil {
		return nil, fmt.Errorf("reading world state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding world state %s: %w", path, err)
	}
	if s.Version != StateVersion {
		return nil, fmt.Errorf("world state %s has version %d, want %d: run `drill world down` and `drill world up`", path, s.Version, StateVersion)
	}
	for _, p := range []struct {
		pid  int
		what string
	}{{s.ServicesPID, "services"}, {s.IncusdPID, "incusd"}, {s.IncusUserPID, "incus-user activator"}} {
		if p.pid != 0 && !Alive(p.pid) {
			return nil, fmt.Errorf("the world's %s (pid %d) is not running: run `drill world down` and `drill world up`", p.what, p.pid)
		}
	}
	for _, m := range s.Members {
		if !Alive(m.IncusdPID) {
			return nil, fmt.Errorf("member %s's incusd (pid %d) is not running: run `drill world down` and `drill world up --cluster %d`", m.Name, m.IncusdPID, len(s.Members))
		}
	}
	return &s, nil
}

// Member is one cluster member of a world.
type Member struct {
	// Name is both the member's Incus name and its namespace's name.
	Name        string       `json:"name"`
	Index       int          `json:"index"` // 1-based
	IncusDir    string       `json:"incus_dir"`
	IncusSocket string       `json:"incus_socket"`
	IncusdPID   int          `json:"incusd_pid,omitempty"`
	ClusterAddr netip.Addr   `json:"cluster_addr"` // on ClusterLAN
	Uplink      netip.Prefix `json:"uplink"`       // its address toward the internet namespace
	LANSide     netip.Prefix `json:"lan_side"`     // its address toward the LAN namespace
	// Link names: the member's end and the peer's end of each of its links.
	UplinkLink, UplinkPeer   string `json:"-"`
	LANLink, LANPeer         string `json:"-"`
	ClusterLink, ClusterPeer string `json:"-"`
}

// MemberNetNS is BOX_MEMBER_NETNS for this world: every member but the
// first (the host namespace, BOX_NETNS) with its namespace.
func (s *State) MemberNetNS() map[string]string {
	out := map[string]string{}
	for _, m := range s.Members[min(1, len(s.Members)):] {
		out[m.Name] = m.Name
	}
	return out
}

// MachineState is the world's machine, as the state file records it.
type MachineState struct {
	Instance string       `json:"instance"`
	Key      string       `json:"key"`   // the cached machine's recipe key
	Cache    string       `json:"cache"` // its folder
	Built    bool         `json:"built"` // this bring-up built it (else it came from the cache)
	Debs     []MachineDeb `json:"debs"`
	Uplink   netip.Prefix `json:"uplink"`
	LAN      netip.Prefix `json:"lan"`
	// Durations of the bring-up's steps, in nanoseconds: the cached
	// machine built or imported, its first boot, the .debs installed,
	// box setup-host.
	BaseNS    int64 `json:"base_ns"`
	BootNS    int64 `json:"boot_ns"`
	InstallNS int64 `json:"install_ns"`
	SetupNS   int64 `json:"setup_ns"`
}

// MachineDeb is one .deb installed on the machine.
type MachineDeb struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// Alive reports whether a process of the world still runs (and is no
// zombie).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}
