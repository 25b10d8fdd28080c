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

// Attached is a guard filter the kernel has on a link's ingress.
type Attached struct {
	Link string `json:"link"`
	// ID and Tag are the kernel's for the program (Tag as Program.Tag
	// computes it for box's own build).
	ID  uint32 `json:"id"`
	Tag string `json:"tag"`
	// DirectAction is the filter's mode: the program's verdict is final.
	DirectAction bool `json:"direct_action"`
}

// Attach loads p and puts it on link's clsact ingress hook (adding the
// clsact qdisc where there is none), replacing a guard already there in
// one step: the link is never without one once it had one.
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
	prog := coll.Programs[ProgramName]
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return Attached{}, fmt.Errorf("adding a clsact qdisc to %s: %w (another ingress qdisc there? tc qdisc show dev %s)", link, err, link)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: filterHandle, Protocol: unix.ETH_P_ALL, Priority: filterPriority},
		Fd:          prog.FD(), Name: ProgramName, DirectAction: true,
	}
	if err := h.FilterReplace(f); err != nil {
		return Attached{}, fmt.Errorf("attaching the guard to %s's ingress: %w", link, err)
	}
	found, err := Find(h, link)
	if err != nil {
		return Attached{}, err
	}
	if len(found) != 1 {
		return Attached{}, fmt.Errorf("attached the guard to %s, but the kernel lists %d of it there", link, len(found))
	}
	return found[0], nil
}

// Find lists the guard filters on link's ingress, as the kernel has them
// (none where there is no clsact qdisc).
func Find(h *netlink.Handle, link string) ([]Attached, error) {
	l, err := h.LinkByName(link)
	if err != nil {
		return nil, fmt.Errorf("reading the guard on %s: %w", link, err)
	}
	fs, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no ingress qdisc
		}
		return nil, fmt.Errorf("reading %s's ingress filters: %w", link, err)
	}
	var out []Attached
	for _, f := range fs {
		b, ok := f.(*netlink.BpfFilter)
		if !ok || b.Name != ProgramName || b.Attrs().Handle != filterHandle || b.Attrs().Priority != filterPriority {
			continue
		}
		out = append(out, Attached{Link: link, ID: uint32(b.Id), Tag: b.Tag, DirectAction: b.DirectAction})
	}
	return out, nil
}

// Detach removes the guard from link's ingress (nothing to do where it is
// not attached). The clsact qdisc stays: another tool may hold filters
// on it.
func Detach(h *netlink.Handle, link string) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("detaching the guard from %s: %w", link, err)
	}
	found, err := Find(h, link)
	if err != nil || len(found) == 0 {
		return err
	}
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: filterHandle, Protocol: unix.ETH_P_ALL, Priority: filterPriority}}
	if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detaching the guard from %s: %w", link, err)
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
