package model

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/box-isolation/box/stack/incus"
)

// KernelPort is a link as the census needs it.
type KernelPort struct {
	Exists   bool
	Master   string // the name of the bridge it is a port of, "" for none
	Isolated bool
	// peer names a veth's other end when it is in the host's own
	// namespace: plugged into no instance at all.
	Peer string
}

// JoinCensus puts another member's census into the local one: its
// instances as that member's kernel has them (the local census judged
// them by their definition only), and its bridge's ports.
func (c *Census) JoinCensus(m *Census) {
	if c == nil || m == nil {
		return
	}
	for _, s := range m.Siblings {
		i := slices.IndexFunc(c.Siblings, func(o Sibling) bool {
			return s.Name != "" && o.Name == s.Name && o.Project == s.Project
		})
		if i >= 0 {
			c.Siblings[i] = s
		} else {
			c.Siblings = append(c.Siblings, s)
		}
	}
	c.Ports = append(c.Ports, m.Ports...)
}

// Sibling is one instance on the stack's bridge, or a port on it that no
// instance claims.
type Sibling struct {
	Name    string `json:"name,omitempty"` // empty for a port no instance claims
	Project string `json:"project,omitempty"`
	Status  string `json:"status,omitempty"`
	Type    string `json:"type,omitempty"`
	Box     bool   `json:"box"`            // carries box's tag
	Port    string `json:"port,omitempty"` // its port on the bridge, while it runs
	// Member is the cluster member it is placed on (empty off a cluster).
	Member string `json:"member,omitempty"`
	// Problems is what takes it off the stack, each with its fix.
	Problems []Problem `json:"problems"`
	// Allowed is what the census reports as it is, with why it is allowed.
	Allowed []string `json:"allowed,omitempty"`
}

// Problem is one way a sibling is off the stack.
type Problem struct {
	What string `json:"what"`
	Fix  string `json:"fix"`
}

// OnStack reports whether the census found nothing wrong with the sibling.
func (s Sibling) OnStack() bool { return len(s.Problems) == 0 }

// Label names the sibling for people: "box web", "instance db (project
// p)", "port veth1234".
func (s Sibling) Label() string {
	what := "instance"
	if s.Box {
		what = "box"
	}
	switch {
	case s.Name == "":
		return "port " + s.Port
	case s.Project != "" && s.Project != "default":
		return fmt.Sprintf("%s %s (project %s)", what, s.Name, s.Project)
	}
	return what + " " + s.Name
}

// Census is what the fleet census saw.
type Census struct {
	Bridge string `json:"bridge"`
	// Ports are the bridge's ports as the kernel lists them.
	Ports []string `json:"ports"`
	// SetChecked says port-set membership was checked (the bridge drop
	// matches a set of ports on this kernel, and the set exists).
	SetChecked bool      `json:"set_checked"`
	Siblings   []Sibling `json:"siblings"`
}

// Sibling finds an instance of the census by project and name.
func (c *Census) Sibling(project, name string) (Sibling, bool) {
	for _, s := range c.Siblings {
		if s.Name == name && ProjectOf(s.Project) == ProjectOf(project) {
			return s, true
		}
	}
	return Sibling{}, false
}

// Findings turns the census's problems into Verify findings, one per
// problem, each naming the sibling.
func (c *Census) Findings() []Finding {
	var out []Finding
	for _, s := range c.Siblings {
		for _, p := range s.Problems {
			out = append(out, Finding{Layer: LayerFleet, Object: s.Label(), Problem: p.What, Fix: p.Fix})
		}
	}
	return out
}

// BridgeNIC is one of an instance's NICs on the bridge, as Incus recorded
// it: the host-side port (volatile.<nic>.host_name, empty while stopped)
// and the MAC it gave the NIC (volatile.<nic>.hwaddr, or the NIC's own
// hwaddr), which the box cannot change.
type BridgeNIC struct {
	Dev, Port, Mac string
}

// BridgeNICs lists an instance's NICs on bridge, in device name order.
func BridgeNICs(bridge string, i *incus.Instance) []BridgeNIC {
	var out []BridgeNIC
	for _, name := range SortedKeys(i.ExpandedDevices) {
		d := i.ExpandedDevices[name]
		if !IsNIC(d) || !OnBridge(bridge, d) {
			continue
		}
		mac := i.Config["volatile."+name+".hwaddr"]
		if mac == "" {
			mac = d["hwaddr"]
		}
		out = append(out, BridgeNIC{Dev: name, Port: i.Config["volatile."+name+".host_name"], Mac: mac})
	}
	return out
}

// PortsOf lists the host-side ports of an instance's NICs on bridge.
func PortsOf(bridge string, i *incus.Instance) []string {
	var out []string
	for _, n := range BridgeNICs(bridge, i) {
		out = append(out, n.Port)
	}
	return out
}

// nicOptions are the NIC settings that keep a box on the stack; anything
// else on its NIC was put there by someone (routes, its own ACLs, a VLAN).
var nicOptions = map[string]bool{
	"type": true, "name": true, "network": true, "security.port_isolation": true,
	"hwaddr": true, "host_name": true, "mtu": true, "ipv4.address": true,
	"boot.priority": true, "queue.tx.length": true,
	"limits.ingress": true, "limits.egress": true, "limits.max": true, "limits.priority": true,
}

// TakeCensus judges every instance on the bridge and every port on it.
// ports are the bridge's ports, links the kernel's view of every port
// named, members the bridge drop's port set (checked when setOK).
func TakeCensus(bridge string, insts []incus.Instance, ports []string, links map[string]KernelPort, members []string, setOK bool, member string) *Census {
	c := &Census{Bridge: bridge, Ports: append([]string{}, ports...), SetChecked: setOK, Siblings: []Sibling{}}
	claimed := map[string]bool{}
	for i := range insts {
		inst := &insts[i]
		if len(PortsOf(bridge, inst)) == 0 {
			continue
		}
		var s Sibling
		if member != "" && inst.Location != member && inst.Location != "" && inst.Location != "none" {
			s = JudgeDefinition(bridge, inst)
			s.Member = inst.Location
		} else {
			s = judgeInstance(bridge, inst, links, members, setOK)
			s.Member = member
		}
		if s.Port != "" {
			claimed[s.Port] = true
		}
		c.Siblings = append(c.Siblings, s)
	}
	for _, p := range ports {
		if claimed[p] {
			continue
		}
		pr := Problem{What: "is on " + bridge + " but no instance claims it: something outside Incus attached it",
			Fix: fmt.Sprintf("ip link set %s nomaster (or delete it)", p)}
		if peer := links[p].Peer; peer != "" {
			pr = Problem{What: fmt.Sprintf("is on %s but no instance claims it, and its other end %s is in the host's namespace, in no instance: left behind by an instance's NIC", bridge, peer),
				Fix: "ip link del " + p + " (removes both ends)"}
		}
		c.Siblings = append(c.Siblings, Sibling{Port: p, Problems: []Problem{pr}})
	}
	sort.SliceStable(c.Siblings, func(a, b int) bool {
		sa, sb := c.Siblings[a], c.Siblings[b]
		if sa.Project != sb.Project {
			return sa.Project < sb.Project
		}
		return sa.Name < sb.Name
	})
	return c
}

// judgeInstance checks one instance's expanded devices and config
// (judgeDefinition), and, while it runs, its port as the kernel has it.
func judgeInstance(bridge string, inst *incus.Instance, links map[string]KernelPort, members []string, setOK bool) Sibling {
	s := JudgeDefinition(bridge, inst)
	bad := func(what, fix string) { s.Problems = append(s.Problems, Problem{What: what, Fix: fix}) }
	if inst.Status != "Running" {
		return s
	}
	for _, port := range PortsOf(bridge, inst) {
		if port == "" {
			bad("runs, but Incus records no port for its NIC", "box doctor, after restarting it (box down/up)")
			continue
		}
		s.Port = port
		k := links[port]
		switch {
		case !k.Exists:
			bad(fmt.Sprintf("its port %s does not exist", port), "restart it (box down, box up) so its NIC is plugged again")
		case k.Master != bridge:
			bad(fmt.Sprintf("its port %s is not on %s (master %q)", port, bridge, k.Master), "restart it (box down, box up) so its NIC is plugged again")
		default:
			if !k.Isolated {
				bad(fmt.Sprintf("its port %s is not isolated (kernel flag)", port), FixEnsure)
			}
			if setOK && !slices.Contains(members, port) {
				bad(fmt.Sprintf("its port %s is not in the bridge drop's port set", port), FixEnsure)
			}
		}
	}
	return s
}

// JudgeDefinition checks what an instance is made of, whatever its state:
// its expanded devices and config, by the census's rules. It is pure, so
// an instance that does not exist yet (a backup to import) is judged the
// same way.
func JudgeDefinition(bridge string, inst *incus.Instance) Sibling {
	_, box := IsBox(inst)
	s := Sibling{Name: inst.Name, Project: ProjectOf(inst.Project), Status: inst.Status, Type: inst.Type, Box: box, Problems: []Problem{}}
	// incusCmd renders an incus command line for this instance's project.
	incusCmd := func(format string, args ...any) string {
		cmd := fmt.Sprintf(format, args...)
		if s.Project != "default" {
			cmd += " --project " + s.Project
		}
		return cmd
	}
	bad := func(what, fix string) { s.Problems = append(s.Problems, Problem{What: what, Fix: fix}) }
	// Where a device comes from decides how to change it: args follow the
	// device name (key=value, or a key to unset).
	devFix := func(dev, change, args string) string {
		if _, local := inst.Devices[dev]; local {
			return incusCmd("incus config device %s %s %s %s", change, inst.Name, dev, args)
		}
		return incusCmd("incus config device override %s %s %s", inst.Name, dev, args) +
			fmt.Sprintf(" (it comes from a profile: %s)", strings.Join(inst.Profiles, ", "))
	}
	nics := 0
	for _, name := range SortedKeys(inst.ExpandedDevices) {
		d := inst.ExpandedDevices[name]
		switch d["type"] {
		case "nic":
			nics++
			if !OnBridge(bridge, d) {
				bad(fmt.Sprintf("has a second NIC %s on %s: a path off the stack", name, nicWhere(d)), incusCmd("incus config device remove %s %s", inst.Name, name))
				continue
			}
			if d["network"] != bridge {
				bad(fmt.Sprintf("NIC %s joins %s as a plain %s NIC (parent=%s), past the network's ACL", name, bridge, d["nictype"], bridge),
					incusCmd("incus config device remove %s %s", inst.Name, name)+"; give it network="+bridge+" (the box-net profile does)")
			}
			if d["security.port_isolation"] != "true" {
				bad(fmt.Sprintf("NIC %s has port isolation off (security.port_isolation=%q)", name, d["security.port_isolation"]),
					devFix(name, "set", "security.port_isolation=true"))
			}
			for _, k := range SortedKeys(d) {
				if !nicOptions[k] {
					bad(fmt.Sprintf("NIC %s sets %s=%s, which box does not make", name, k, d[k]), devFix(name, "unset", k))
				}
			}
		case "disk":
			if d["pool"] == "" || strings.HasPrefix(d["source"], "/") {
				bad(fmt.Sprintf("disk %s passes host path %q through", name, d["source"]), incusCmd("incus config device remove %s %s", inst.Name, name))
			}
		case "proxy":
			// box's own doors (box expose) are judged by what they are,
			// never by their name alone.
			why := JudgeDoor(inst, name)
			if why == "" {
				door := DoorOf(inst, name)
				s.Allowed = append(s.Allowed, fmt.Sprintf("door %s: %s on the host to port %d in the box (box expose): one-way, nothing listens inside", name, door.Host, door.Port))
				continue
			}
			what := fmt.Sprintf("proxy device %s (listen %s, connect %s", name, d["listen"], d["connect"])
			if d["bind"] != "" {
				what += ", bind " + d["bind"]
			}
			what += ") is a door between the box and the host"
			if strings.HasPrefix(name, DoorPrefix) || d[DoorTag] != "" {
				what += ", and not one of box's: " + why
			}
			bad(what, incusCmd("incus config device remove %s %s", inst.Name, name))
		case "none":
		case "tpm":
			s.Allowed = append(s.Allowed, fmt.Sprintf("device %s (tpm): an emulated TPM, nothing of the host's", name))
		default:
			bad(fmt.Sprintf("device %s (%s) passes host hardware or sockets through", name, d["type"]), incusCmd("incus config device remove %s %s", inst.Name, name))
		}
	}
	if nics != 1 {
		bad(fmt.Sprintf("has %d NICs, want exactly one on %s", nics, bridge), "remove every NIC but the one from the box-net profile")
	}
	for _, k := range SortedKeys(inst.ExpandedConfig) {
		v := inst.ExpandedConfig[k]
		switch {
		case k == "raw.lxc" || strings.HasPrefix(k, "raw.qemu"):
			bad(fmt.Sprintf("sets %s: raw configuration can add devices and mounts no census sees", k), incusCmd("incus config unset %s %s", inst.Name, k))
		case k == "security.privileged" && IncusTrue(v):
			bad("is privileged (security.privileged=true): root in the box is root on the host", incusCmd("incus config unset %s security.privileged", inst.Name))
		case NestingReason(k, v) != "":
			s.Allowed = append(s.Allowed, fmt.Sprintf("%s=%s: allowed, %s", k, v, NestingReason(k, v)))
		default:
			// The kernel boundary's keys (kernel.go).
			problem, allowed, ok := JudgeKernelKey(k, v)
			switch {
			case !ok:
			case problem != "":
				bad(problem, incusCmd("incus config unset %s %s", inst.Name, k)+RestartNote)
			case allowed != "":
				s.Allowed = append(s.Allowed, fmt.Sprintf("%s=%s: allowed, %s", k, OneLine(v), allowed))
			}
		}
	}
	return s
}

func nicWhere(d map[string]string) string {
	switch {
	case d["network"] != "":
		return "network " + d["network"]
	case d["parent"] != "":
		return d["nictype"] + " " + d["parent"]
	}
	return d["nictype"]
}
