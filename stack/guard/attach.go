package guard

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// filterHandle and filterPriority are the guard's filter on the clsact
// ingress hook: one of its own, replaced in place.
const (
	filterHandle   = 0xb0c5
	filterPriority = 0xb0c5
)

// Attached is a guard filter the kernel has on a link.
type Attached struct {
	Link string `json:"link"`
	Hook string `json:"hook"` // Ingress or Egress
	Name string `json:"program"`
	// ID and Tag are the kernel's for the program (Tag as Program.Tag
	// computes it for box's own build).
	ID  uint32 `json:"id"`
	Tag string `json:"tag"`
	// DirectAction is the filter's mode: the program's verdict is final.
	DirectAction bool `json:"direct_action"`
}

// Attach loads p and puts it on its hook of link (the clsact qdisc's
// ingress or egress; the qdisc added where there is none), replacing a
// guard already there in one step: the link is never without one once it
// had one.
func Attach(h *netlink.Handle, link string, p *Program) (Attached, error) {
	l, err := h.LinkByName(link)
	if err != nil {
		return Attached{}, fmt.Errorf("attaching the guard to %s: %w", link, err)
	}
	coll, err := ebpf.NewCollection(p.spec)
	if err != nil {
		return Attached{}, fmt.Errorf("loading the guard: %w", err)
	}
	defer coll.Close() // the filter holds the program, the program its map
	prog := coll.Programs[p.name]
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return Attached{}, fmt.Errorf("adding a clsact qdisc to %s: %w (another ingress qdisc there? tc qdisc show dev %s)", link, err, link)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: parents[p.hook], Handle: filterHandle, Protocol: unix.ETH_P_ALL, Priority: filterPriority},
		Fd:          prog.FD(), Name: p.name, DirectAction: true,
	}
	if err := h.FilterReplace(f); err != nil {
		return Attached{}, fmt.Errorf("attaching the guard to %s's %s: %w", link, p.hook, err)
	}
	found, err := Find(h, link)
	if err != nil {
		return Attached{}, err
	}
	var on []Attached
	for _, a := range found {
		if a.Hook == p.hook {
			on = append(on, a)
		}
	}
	if len(on) != 1 || on[0].Name != p.name {
		return Attached{}, fmt.Errorf("attached the guard to %s's %s, but the kernel lists %v there", link, p.hook, on)
	}
	return on[0], nil
}

// parents are the clsact qdisc's hooks as tc names their parents.
var parents = map[string]uint32{Ingress: netlink.HANDLE_MIN_INGRESS, Egress: netlink.HANDLE_MIN_EGRESS}

// Find lists the guard filters on link's ingress and egress, as the
// kernel has them (none where there is no clsact qdisc).
func Find(h *netlink.Handle, link string) ([]Attached, error) {
	l, err := h.LinkByName(link)
	if err != nil {
		return nil, fmt.Errorf("reading the guard on %s: %w", link, err)
	}
	var out []Attached
	for _, hook := range []string{Ingress, Egress} {
		fs, err := h.FilterList(l, parents[hook])
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no clsact qdisc
			}
			return nil, fmt.Errorf("reading %s's %s filters: %w", link, hook, err)
		}
		for _, f := range fs {
			b, ok := f.(*netlink.BpfFilter)
			if !ok || (b.Name != ProgramName && b.Name != UplinkProgramName) || b.Attrs().Handle != filterHandle || b.Attrs().Priority != filterPriority {
				continue
			}
			out = append(out, Attached{Link: link, Hook: hook, Name: b.Name, ID: uint32(b.Id), Tag: b.Tag, DirectAction: b.DirectAction})
		}
	}
	return out, nil
}

// Detach removes the guard from link, both hooks (nothing to do where it
// is not attached). The clsact qdisc stays: another tool may hold filters
// on it.
func Detach(h *netlink.Handle, link string) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("detaching the guard from %s: %w", link, err)
	}
	found, err := Find(h, link)
	if err != nil {
		return err
	}
	for _, a := range found {
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: parents[a.Hook], Handle: filterHandle, Protocol: unix.ETH_P_ALL, Priority: filterPriority}}
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detaching the guard from %s's %s: %w", link, a.Hook, err)
		}
	}
	return nil
}

// Counters reads the per-reason counters of the attached program id,
// summed over the CPUs.
func Counters(id uint32) (map[Reason]uint64, error) {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("opening the guard program %d: %w", id, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("reading the guard program %d: %w", id, err)
	}
	ids, ok := info.MapIDs()
	if !ok || len(ids) != 1 {
		return nil, fmt.Errorf("the guard program %d has %d maps, not its counters alone", id, len(ids))
	}
	m, err := ebpf.NewMapFromID(ids[0])
	if err != nil {
		return nil, fmt.Errorf("opening the guard's counters: %w", err)
	}
	defer m.Close()
	out := map[Reason]uint64{}
	for _, r := range Reasons() {
		var perCPU []uint64
		if err := m.Lookup(uint32(r), &perCPU); err != nil {
			return nil, fmt.Errorf("reading the guard's counter %s: %w", r, err)
		}
		for _, v := range perCPU {
			out[r] += v
		}
	}
	return out, nil
}
