package drill

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
)

// The DHCP lies (L-DHCP). box-a sends, from its own port, MAC and address
// (or none, as a client asking does), messages naming clients that are
// not it: a release of box-b's lease, a decline of clone-a's address, a
// DISCOVER and a request for each of as many made-up hardware addresses
// as the pool has addresses, eight made-up client identifiers on its own
// hardware address, and its own MAC at the head of an 8-byte IEEE 802
// address and of a 16-byte Ethernet one. None is witnessed on the wire: what counts
// is what the server did, read from its lease file in the host's
// namespace before and after the probes (box-b's and clone-a's leases
// gone, a lease for anything made up: fail). That silence proves
// something only if the server answered in the window: box-a's own
// DISCOVER, after the lies, must have renewed its lease. After the
// probes a box is minted, and must get its address (the pool was not
// taken). Every lease the lies got is released afterwards.

const (
	// dhcpOwnDelay is when box-a asks for its own lease, the server's
	// control: after the lies.
	dhcpOwnDelay = spoofDelay + 600*time.Millisecond
	// dhcpOwnID is that control.
	dhcpOwnID = "ctl-dhcp-own"
	// dhcpClientIDs is how many made-up client identifiers box-a uses:
	// each would be a lease of its own.
	dhcpClientIDs = 8
	// newLeaseWait bounds the wait for the box minted after the lies.
	newLeaseWait = 20 * time.Second
	// floodDeadline fits a pool's worth of made-up clients, paced as the
	// probe paces them, on a loaded machine (docs/measurements.md, "DHCP").
	floodDeadline = 2500 * time.Millisecond
)

// buildSpoofDHCP adds the DHCP lies and the server's control.
func buildSpoofDHCP(b *builder) {
	t := b.t
	if t.A.MAC == nil || t.B.MAC == nil || t.C.MAC == nil || !t.B.IP.IsValid() || !t.C.IP.IsValid() || t.GatewayMAC == nil || !t.DHCPFirst.IsValid() {
		return
	}
	delay := int(spoofDelay.Milliseconds())
	b.reference(PlaceA, probes.ProbeSpec{ID: dhcpOwnID, Kind: probes.KindDHCPForge, Via: t.Subnet, DHCP: probes.DHCPDiscover,
		DelayMS: int(dhcpOwnDelay.Milliseconds()), DeadlineMS: int(probeDeadline.Milliseconds())})
	prefix := t.DHCPPrefix[:]
	ownLong := append(append([]byte{}, t.A.MAC...), append(prefix, 0, 1, 2, 3, 4, 5, 6)...)
	for _, l := range []struct {
		what string
		ch   Channel
		spec probes.ProbeSpec
	}{
		{"DHCP release of box-b's lease, naming its hardware address and " + t.B.IP.String(), ChannelDHCPRelease,
			probes.ProbeSpec{Kind: probes.KindDHCPForge, DHCP: probes.DHCPRelease, ClientHW: t.B.MAC.String(), Target: t.B.IP, ServerID: t.Gateway, DstMAC: t.GatewayMAC.String()}},
		{"DHCP decline of clone-a's address " + t.C.IP.String() + ", naming its hardware address", ChannelDHCPDecline,
			probes.ProbeSpec{Kind: probes.KindDHCPForge, DHCP: probes.DHCPDecline, ClientHW: t.C.MAC.String(), Target: t.C.IP, ServerID: t.Gateway}},
		{fmt.Sprintf("DHCP for %d made-up hardware addresses, the pool's size", t.DHCPSize), ChannelDHCPStarve,
			probes.ProbeSpec{Kind: probes.KindDHCPFlood, Count: t.DHCPSize, HWPrefix: hexBytes(prefix), Target: t.DHCPFirst,
				DeadlineMS: int(floodDeadline.Milliseconds())}},
		{fmt.Sprintf("DHCP for %d made-up client identifiers on box-a's hardware address", dhcpClientIDs), ChannelDHCPClientID,
			probes.ProbeSpec{Kind: probes.KindDHCPFlood, Count: dhcpClientIDs, ClientID: clientIDPrefix(prefix)}},
		// Of 8 bytes: dnsmasq takes an htype-6 message naming a box's
		// 6-byte MAC for that box (measured), and then leases nothing new.
		{"DHCP for box-a's MAC and 2 bytes more as an IEEE 802 address (htype 6, hlen 8)", ChannelDHCPHType,
			probes.ProbeSpec{Kind: probes.KindDHCPForge, DHCP: probes.DHCPDiscover, HType: 6, ClientHW: hexBytes(ownLong[:8])}},
		{"DHCP for box-a's MAC and 10 bytes more (hlen 16)", ChannelDHCPHType,
			probes.ProbeSpec{Kind: probes.KindDHCPForge, DHCP: probes.DHCPDiscover, ClientHW: hexBytes(ownLong)}},
	} {
		l.spec.Via, l.spec.DelayMS = t.Subnet, delay
		b.probe(Action{Claim: SpoofID, Channel: l.ch, From: PlaceA, Target: l.what, TargetKey: "dhcp-server", Expect: ExpectNoLease}, l.spec)
	}
}

// clientIDPrefix is the run's made-up client identifiers' prefix: type
// 255 (RFC 4361's, no hardware type) and the run's prefix.
func clientIDPrefix(prefix []byte) string { return hexBytes(append([]byte{0xff}, prefix...)) }

func hexBytes(b []byte) string {
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

// dhcpRun is what the run read at the DHCP server around the lies, and
// the box minted after them.
type dhcpRun struct {
	before, after   stack.DHCPPool
	beforeErr       string
	afterErr        string
	newBox, newAddr string
	newErr          string
	newRefused      bool // the stack refused to mint it (no address free)
	released        int
	unreleased      []stack.DHCPLease
}

// hasDHCPLies says whether the scenario sends the DHCP lies.
func hasDHCPLies(sc *Scenario) bool {
	if sc == nil {
		return false
	}
	return slices.ContainsFunc(sc.Actions, func(a Action) bool { return a.Claim == SpoofID && a.Expect == ExpectNoLease })
}

// readLeasesBefore reads the lease file before the probes.
func readLeasesBefore(h *stack.Host) *dhcpRun {
	d := &dhcpRun{}
	pool, err := h.Addresses().DHCPLeases()
	if err != nil {
		d.beforeErr = err.Error()
	}
	d.before = pool
	return d
}

// dhcpOf is what the DHCP server held around the lies, nil when they were
// not sent.
func dhcpOf(s claimStates) *dhcpRun {
	if sp := stateOf[spoofRun](s, SpoofID); sp != nil {
		return sp.dhcp
	}
	return nil
}

// afterSpoof reads the lease file after the probes, mints a box (it must
// get its address), and releases every lease the lies got.
func afterSpoof(ctx context.Context, r *run) {
	d := dhcpOf(r.state)
	if d == nil {
		return
	}
	t0 := time.Now()
	// The reading waits for the server to settle while the box is minted:
	// the new box's lease is its own, no answer to a lie.
	read := make(chan struct{})
	go func() {
		defer close(read)
		pool, err := settledLeases(ctx, r.cfg.Host)
		if err != nil {
			d.afterErr = err.Error()
		}
		d.after = pool
	}()
	d.newBox = r.boxName("d") // minted after the DHCP lies
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := boxes.NewManager(r.cfg.Host).Mint(mctx, boxes.MintRequest{Name: d.newBox, Image: r.cfg.Image, Type: probeType, Stamps: r.stamps()}); err != nil {
		d.newErr, d.newRefused = err.Error(), strings.Contains(err.Error(), "is taken by a box or a lease") || strings.Contains(err.Error(), "is full")
	} else if ip, err := r.cfg.Host.Addresses().Wait(mctx, d.newBox, newLeaseWait); err != nil {
		d.newErr = err.Error()
	} else {
		d.newAddr = ip.String()
	}
	<-read
	d.release(context.WithoutCancel(ctx), r)
	r.cfg.logf("%s: DHCP server read, a box minted after the lies (%s), %d lease(s) released, in %s", SpoofID, cmp.Or(d.newAddr, "no address"), d.released, time.Since(t0).Round(time.Millisecond))
}

// settleWait bounds how long the after reading waits for the DHCP server
// to work through what the lies queued (a pool's worth of messages takes
// it a second or two on a loaded machine); settleStep is how long the
// lease file must stay the same.
const (
	settleWait = 5 * time.Second
	settleStep = 400 * time.Millisecond
)

// settledLeases reads the lease file once it stopped changing.
func settledLeases(ctx context.Context, h *stack.Host) (stack.DHCPPool, error) {
	prev, err := h.Addresses().DHCPLeases()
	for deadline := time.Now().Add(settleWait); err == nil && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return prev, nil
		case <-time.After(settleStep):
		}
		cur, cerr := h.Addresses().DHCPLeases()
		if cerr != nil || slices.Equal(cur.Leases, prev.Leases) {
			return cur, cerr
		}
		prev = cur
	}
	return prev, err
}

// release gives up every lease the lies got, reading the lease file again
// until it holds none (the server may still be granting some it had
// queued), and names in the report what it could not.
func (d *dhcpRun) release(ctx context.Context, r *run) {
	if len(d.madeUp(r.scene)) == 0 {
		return // the reading after the lies had settled: none came later
	}
	var left []stack.DHCPLease
	for try := 0; try < 5; try++ {
		pool, err := settledLeases(ctx, r.cfg.Host)
		if err != nil {
			r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("%s: the leases the DHCP lies got were not released: %v", SpoofID, err))
			return
		}
		made := d.madeUpOf(pool.Leases, r.scene)
		if len(made) == 0 {
			return
		}
		left, err = r.cfg.Host.Addresses().ReleaseLeases(ctx, made)
		d.released += len(made) - len(left)
		if err != nil {
			r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("%s: releasing the leases the DHCP lies got: %v", SpoofID, err))
			return
		}
	}
	d.unreleased = left
	if len(left) > 0 {
		r.rep.Problems = append(r.rep.Problems, fmt.Sprintf("%s: %d lease(s) the DHCP lies got are still held: they go at their expiry (box doctor names them)", SpoofID, len(left)))
	}
}

// madeUp are the leases of the after reading that the lies got: for a
// made-up hardware address or client identifier, for box-a's MAC as
// another type or length, or for box-a's MAC at another address than its
// own; none that was there before.
func (d *dhcpRun) madeUp(t Scene) []stack.DHCPLease { return d.madeUpOf(d.after.Leases, t) }

// madeUpOf is madeUp of another reading.
func (d *dhcpRun) madeUpOf(leases []stack.DHCPLease, t Scene) []stack.DHCPLease {
	var out []stack.DHCPLease
	for _, l := range leases {
		if slices.Contains(d.before.Leases, l) || dhcpLie(t, l) == "" {
			continue
		}
		out = append(out, l)
	}
	return out
}

// dhcpLie says which lie a lease is the server's answer to ("" for
// none): starve, client-id, htype or hlen.
func dhcpLie(t Scene, l stack.DHCPLease) string {
	prefix := hexBytes(t.DHCPPrefix[:])
	aMAC := t.A.MAC.String()
	switch {
	case strings.HasPrefix(l.Hwaddr, prefix):
		return "starve"
	case strings.HasPrefix(l.ClientID, clientIDPrefix(t.DHCPPrefix[:])):
		return "client-id"
	case strings.HasPrefix(l.Hwaddr, "06-") && strings.Contains(l.Hwaddr, aMAC):
		return "htype"
	case strings.HasPrefix(l.Hwaddr, aMAC) && len(l.Hwaddr) > len(aMAC):
		return "hlen"
	case l.Hwaddr == aMAC && l.Address != t.A.IP:
		return "client-id" // a lease of box-a's MAC at another address: keyed on something else
	}
	return ""
}

// leaseOf finds the lease of a hardware address in a reading.
func leaseOf(p stack.DHCPPool, mac net.HardwareAddr) (stack.DHCPLease, bool) {
	i := slices.IndexFunc(p.Leases, func(l stack.DHCPLease) bool { return l.Hwaddr == mac.String() })
	if i < 0 {
		return stack.DHCPLease{}, false
	}
	return p.Leases[i], true
}

// judgeSpoofDHCP judges one DHCP lie by what the server did.
func judgeSpoofDHCP(ru *run, r Result) Result {
	d, t := dhcpOf(ru.state), ru.scene
	switch {
	case d == nil:
		return verdict(r, Inconclusive, "the DHCP server's lease file was not read")
	case d.beforeErr != "" || d.afterErr != "":
		return verdict(r, Inconclusive, "the DHCP server's lease file was not read ("+cmp.Or(d.beforeErr, d.afterErr)+"), so what the lie did is unknown")
	}
	// What the server did first: it fails the lie whatever the sender
	// saw (arrival beats error).
	var what string
	switch r.Channel {
	case ChannelDHCPRelease, ChannelDHCPDecline:
		who, e := "box-b", t.B
		if r.Channel == ChannelDHCPDecline {
			who, e = "clone-a", t.C
		}
		l, ok := leaseOf(d.before, e.MAC)
		if !ok || l.Address != e.IP {
			return verdict(r, Inconclusive, fmt.Sprintf("%s held no lease of %s before the lie (%s), so losing one could not show", who, e.IP, leaseText(l, ok)))
		}
		if l2, ok := leaseOf(d.after, e.MAC); !ok || l2.Address != e.IP {
			return verdict(r, Fail, fmt.Sprintf("%s's lease of %s went from the DHCP server's lease file (now: %s): the server took box-a's %s naming it", who, e.IP, leaseText(l2, ok), r.Channel))
		}
		what = fmt.Sprintf("%s's lease of %s is still in the DHCP server's lease file", who, e.IP)
	default:
		want := map[Channel]string{ChannelDHCPStarve: "starve", ChannelDHCPClientID: "client-id", ChannelDHCPHType: "hlen"}[r.Channel]
		if r.Channel == ChannelDHCPHType && r.Probe.HType != 0 {
			want = "htype"
		}
		var got []string
		for _, l := range d.madeUp(t) {
			if dhcpLie(t, l) == want {
				got = append(got, l.Hwaddr+" at "+l.Address.String())
			}
		}
		if len(got) > 0 {
			more := ""
			if r.Channel == ChannelDHCPStarve {
				more = fmt.Sprintf(" (%d of the pool's %d)", len(got), t.DHCPSize)
			}
			if len(got) > 4 {
				got = append(got[:4], fmt.Sprintf("and %d more", len(got)-4))
			}
			return verdict(r, Fail, fmt.Sprintf("the DHCP server leased addresses to the lie%s: %s", more, strings.Join(got, ", ")))
		}
		what = "the DHCP server leased nothing to the lie"
	}
	// Nothing happened: that counts only if the lie left, and the server
	// answered box-a's own DISCOVER after it.
	if r.Obs == nil || r.Obs.Outcome != probes.Silent {
		return verdict(r, Inconclusive, "the lie was not sent: "+r.Observed)
	}
	before, okB := leaseOf(d.before, t.A.MAC)
	after, okA := leaseOf(d.after, t.A.MAC)
	own, sent := ru.obs.get(PlaceA, dhcpOwnID)
	if !sent || own.Outcome != probes.Silent || !okB || !okA || !after.Expires.After(before.Expires) {
		return verdict(r, Inconclusive, fmt.Sprintf("%s, but the DHCP server did not renew box-a's own lease when it asked after the lies (before: %s, after: %s; its DISCOVER: %s), so its silence to them proves nothing",
			what, leaseText(before, okB), leaseText(after, okA), reportOf(own, sent)))
	}
	return verdict(r, Pass, fmt.Sprintf("%s; the server renewed box-a's own lease after them (to %s)", what, after.Expires.Format(time.TimeOnly)))
}

func leaseText(l stack.DHCPLease, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s until %s", l.Address, l.Expires.Format(time.TimeOnly))
}

// judgeNewLease judges the box minted after the lies.
func judgeNewLease(d *dhcpRun, r Result) Result {
	switch {
	case d == nil || d.newBox == "":
		return verdict(r, Inconclusive, "no box was minted after the lies")
	case d.newAddr != "":
		r.Observed = d.newAddr
		return verdict(r, Pass, d.newBox+" holds "+d.newAddr)
	case d.newRefused:
		r.Observed = "no address"
		return verdict(r, Fail, "the stack could give "+d.newBox+" no address: "+d.newErr)
	case strings.Contains(d.newErr, "has no address"):
		r.Observed = "no address"
		return verdict(r, Fail, d.newBox+" got no address: "+d.newErr)
	}
	return verdict(r, Inconclusive, "minting "+d.newBox+" failed for another reason than its address: "+d.newErr)
}
