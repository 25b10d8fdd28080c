package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// The fleet census (claim C-FLEET). The probes meet only the drill's own
// fresh boxes; the boxes people work in were minted weeks ago and may have
// been changed since (a profile edit re-plugs their NICs, the escape hatch
// or plain incus adds devices). The census starts from the bridge, not
// from box's tag: every instance of any project whose NIC uses the bridge,
// running or stopped (stopped ones by their config), and every port the
// kernel has on the bridge, is a sibling, and each is checked for what
// could take it off the stack.

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
		if s.Name == name && model.ProjectOf(s.Project) == model.ProjectOf(project) {
			return s, true
		}
	}
	return Sibling{}, false
}

// Findings turns the census's problems into Verify findings, one per
// problem, each naming the sibling.
func (c *Census) Findings() []model.Finding {
	var out []model.Finding
	for _, s := range c.Siblings {
		for _, p := range s.Problems {
			out = append(out, model.Finding{Layer: model.LayerFleet, Object: s.Label(), Problem: p.What, Fix: p.Fix})
		}
	}
	return out
}

// censusOf takes the fleet census of the stack's bridge from a listing of
// every instance (Verify's, and BoxesOnStack's). On a cluster, member is
// the member g is on: an instance placed elsewhere is judged by what it is
// made of only, its port being in another member's kernel.
func censusOf(g *hostns.NS, insts []incus.Instance, member string) (*Census, error) {
	bridge := model.Current.Network
	ports, err := g.BridgePorts(bridge)
	if err != nil {
		return nil, err
	}
	members, setOK, err := nft.PortSetMembers(g.NFTConfig(model.Current))
	if err != nil {
		return nil, fmt.Errorf("reading the bridge drop's port set: %w", err)
	}
	links := map[string]model.KernelPort{}
	for _, p := range ports {
		links[p.Name] = g.LinkState(p.Name)
	}
	// A sibling's port that is not on the bridge: where is it?
	for _, i := range insts {
		for _, port := range portsOf(bridge, &i) {
			if _, ok := links[port]; ok || port == "" {
				continue
			}
			links[port] = g.LinkState(port)
		}
	}
	c := TakeCensus(bridge, insts, hostns.PortNames(ports), links, members, setOK, member)
	return c, nil
}

// bridgeNIC is one of an instance's NICs on the bridge, as Incus recorded
// it: the host-side port (volatile.<nic>.host_name, empty while stopped)
// and the MAC it gave the NIC (volatile.<nic>.hwaddr, or the NIC's own
// hwaddr), which the box cannot change.
type bridgeNIC struct {
	dev, port, mac string
}

// bridgeNICs lists an instance's NICs on bridge, in device name order.
func bridgeNICs(bridge string, i *incus.Instance) []bridgeNIC {
	var out []bridgeNIC
	for _, name := range model.SortedKeys(i.ExpandedDevices) {
		d := i.ExpandedDevices[name]
		if !model.IsNIC(d) || !model.OnBridge(bridge, d) {
			continue
		}
		mac := i.Config["volatile."+name+".hwaddr"]
		if mac == "" {
			mac = d["hwaddr"]
		}
		out = append(out, bridgeNIC{dev: name, port: i.Config["volatile."+name+".host_name"], mac: mac})
	}
	return out
}

// portsOf lists the host-side ports of an instance's NICs on bridge.
func portsOf(bridge string, i *incus.Instance) []string {
	var out []string
	for _, n := range bridgeNICs(bridge, i) {
		out = append(out, n.port)
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
func TakeCensus(bridge string, insts []incus.Instance, ports []string, links map[string]model.KernelPort, members []string, setOK bool, member string) *Census {
	c := &Census{Bridge: bridge, Ports: append([]string{}, ports...), SetChecked: setOK, Siblings: []Sibling{}}
	claimed := map[string]bool{}
	for i := range insts {
		inst := &insts[i]
		if len(portsOf(bridge, inst)) == 0 {
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
func judgeInstance(bridge string, inst *incus.Instance, links map[string]model.KernelPort, members []string, setOK bool) Sibling {
	s := JudgeDefinition(bridge, inst)
	bad := func(what, fix string) { s.Problems = append(s.Problems, Problem{What: what, Fix: fix}) }
	if inst.Status != "Running" {
		return s
	}
	for _, port := range portsOf(bridge, inst) {
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
				bad(fmt.Sprintf("its port %s is not isolated (kernel flag)", port), fixEnsure)
			}
			if setOK && !slices.Contains(members, port) {
				bad(fmt.Sprintf("its port %s is not in the bridge drop's port set", port), fixEnsure)
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
	_, box := model.IsBox(inst)
	s := Sibling{Name: inst.Name, Project: model.ProjectOf(inst.Project), Status: inst.Status, Type: inst.Type, Box: box, Problems: []Problem{}}
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
	for _, name := range model.SortedKeys(inst.ExpandedDevices) {
		d := inst.ExpandedDevices[name]
		switch d["type"] {
		case "nic":
			nics++
			if !model.OnBridge(bridge, d) {
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
			for _, k := range model.SortedKeys(d) {
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
			why := model.JudgeDoor(inst, name)
			if why == "" {
				door := model.DoorOf(inst, name)
				s.Allowed = append(s.Allowed, fmt.Sprintf("door %s: %s on the host to port %d in the box (box expose): one-way, nothing listens inside", name, door.Host, door.Port))
				continue
			}
			what := fmt.Sprintf("proxy device %s (listen %s, connect %s", name, d["listen"], d["connect"])
			if d["bind"] != "" {
				what += ", bind " + d["bind"]
			}
			what += ") is a door between the box and the host"
			if strings.HasPrefix(name, model.DoorPrefix) || d[model.DoorTag] != "" {
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
	for _, k := range model.SortedKeys(inst.ExpandedConfig) {
		v := inst.ExpandedConfig[k]
		switch {
		case k == "raw.lxc" || strings.HasPrefix(k, "raw.qemu"):
			bad(fmt.Sprintf("sets %s: raw configuration can add devices and mounts no census sees", k), incusCmd("incus config unset %s %s", inst.Name, k))
		case k == "security.privileged" && model.IncusTrue(v):
			bad("is privileged (security.privileged=true): root in the box is root on the host", incusCmd("incus config unset %s security.privileged", inst.Name))
		case model.NestingReason(k, v) != "":
			s.Allowed = append(s.Allowed, fmt.Sprintf("%s=%s: allowed, %s", k, v, model.NestingReason(k, v)))
		default:
			// The kernel boundary's keys (kernel.go).
			problem, allowed, ok := model.JudgeKernelKey(k, v)
			switch {
			case !ok:
			case problem != "":
				bad(problem, incusCmd("incus config unset %s %s", inst.Name, k)+model.RestartNote)
			case allowed != "":
				s.Allowed = append(s.Allowed, fmt.Sprintf("%s=%s: allowed, %s", k, model.OneLine(v), allowed))
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

// BoxesOnStack lists the boxes of the client's project as Boxes does,
// each marked by the fleet census, from one listing of every project's
// instances (the census needs them all). censusErr says why the boxes are
// unmarked when the census could not be taken (reading the kernel's view
// of the ports needs root).
func (host *Host) BoxesOnStack(ctx context.Context) (boxes []Box, censusErr, err error) {
	if host.Tier.Granted {
		boxes, err := Boxes(ctx, host.Incus)
		return boxes, errors.New("a granted user sees only their own project"), err
	}
	insts, err := host.Incus.Instances().All(ctx)
	if err != nil {
		// A client that may not list every project still lists its own.
		boxes, berr := Boxes(ctx, host.Incus)
		return boxes, err, berr
	}
	project := model.ProjectOf(host.Incus.ProjectName())
	boxes = []Box{}
	for i := range insts {
		if gen, ok := model.IsBox(&insts[i]); ok && model.ProjectOf(insts[i].Project) == project {
			boxes = append(boxes, boxOf(&insts[i], gen))
		}
	}
	sort.Slice(boxes, func(a, b int) bool { return boxes[a].Name < boxes[b].Name })
	g, err := host.OpenNS()
	if err != nil {
		return boxes, err, nil
	}
	defer g.Close()
	// Which member this is matters only on a cluster, which the listing
	// already shows (a standalone server places everything "none"): a
	// standalone list stays one request.
	member := ""
	if slices.ContainsFunc(insts, func(i incus.Instance) bool { return i.Location != "" && i.Location != "none" }) {
		ci, err := host.Cluster(ctx)
		if err != nil {
			return boxes, nil, err
		}
		member = ci.Local
	}
	c, err := censusOf(g, insts, member)
	if err != nil {
		return boxes, err, nil
	}
	markOnStack(c, project, boxes)
	return boxes, nil, nil
}

// markOnStack records the census's verdict on each box of project (as `box list`
// shows it): a box the census did not meet has no NIC on the bridge.
func markOnStack(c *Census, project string, boxes []Box) {
	for i := range boxes {
		b := &boxes[i]
		on := false
		s, ok := c.Sibling(project, b.Name)
		switch {
		case !ok:
			b.OffStack = []string{"has no NIC on " + c.Bridge}
		case s.OnStack():
			on = true
		default:
			for _, p := range s.Problems {
				b.OffStack = append(b.OffStack, p.What)
			}
		}
		b.OnStack = &on
	}
}
