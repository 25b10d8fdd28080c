package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/box-isolation/box/drill/topo"
	"github.com/box-isolation/box/internal/witnesslog"
	"github.com/box-isolation/box/probes"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/model"
)

// AllowID is C-ALLOW: a box under an egress allowlist reaches what it
// allows and nothing else.
const AllowID ClaimID = "C-ALLOW"

var claimAllow = Claim{
	ID: AllowID, From: "box-w, under an egress allowlist (the canary's name, and a name that resolves to a LAN host); box-a, open",
	To: "the allowed canary by name; its address with another TLS server name or HTTP Host; QUIC to it; a second canary by address and by Host; a public resolver straight and over HTTPS; " +
		"names under the canary's name, beside it and elsewhere (witnessed at their authoritative nameserver); the LAN host the allowed name resolves to",
	Channels: []Channel{ChannelTCP, ChannelUDP, ChannelDNS, ChannelTLS, ChannelHTTP, ChannelQUIC, ChannelDoH},
	Expect: "box-w reaches the allowed canary by name and nothing else, and none of its questions for other names leaves the host; " +
		"box-a reaches what box-w may not, and its questions reach the authoritative nameserver (they were there to be blocked)",
	Layers:   []model.LayerID{model.LayerEgress},
	Why:      "an allowlist that leaks is a false sense of safety: a shared address lets in every name on it, a name carried in DNS questions is a tunnel to anyone's nameserver, QUIC and DNS over HTTPS slip past name checks, and an allowed name that points at the LAN is a way in (DNS rebinding)",
	Modes:    Modes{World: Runs, Host: Never, Why: "it needs the world's second canary, its witness nameserver and a witness in its internet"},
	Evidence: []Evidence{EvidenceProbes},
	mint:     mintAllowBox,
	prepare:  serveAllowEgress,
	build:    buildAllow,
	refine:   refineAllow,
	// box-w's blocks count only if its controls, the allowed canary by
	// name (through the proxy and straight), were reached.
	judge: func(r *run, c Claim, rs []Result) []Result { return judgeProbes(r, c, placeControlled(rs, PlaceW)) },
}

// C-ALLOW: a box under an egress allowlist (box-w: the canary's name, and
// a name that resolves to a LAN host) reaches the allowed canary by name,
// over HTTP (through box's egress proxy) and on a port no proxy takes
// (through the allow set): its controls; if they fail the claim fails,
// and its blocks prove nothing. It reaches nothing else:
//
//   - the allowed canary's own address with another TLS server name or
//     HTTP Host (the proxy refuses), nor QUIC to it (dropped);
//   - the second canary by address, or by address with its HTTP Host;
//   - the public resolver, straight or over HTTPS without a name;
//   - names under the allowed name, beside it and elsewhere: each
//     question is answered at the gateway and must not reach the witness
//     nameserver authoritative for it (box-a's question for the same
//     zone must: the witness's silence proves nothing otherwise);
//   - the LAN host its allowed name resolves to (the ACL still holds).
//
// Open box-a reaches the second canary, QUIC and the resolver's HTTPS
// port: they were there to be blocked. Witnesses run in the world's
// internet namespace: a probe that speaks TLS, HTTP or QUIC carries its
// nonce (the proxy dials from the host, so a SYN is not whose it was); a
// bare SYN is known by the host's NAT address and the port it pinned.

// Ports of C-ALLOW's probes. The second canary's by box-w by address and
// by box-a each their own, so a witness that sees a SYN (which carries no
// nonce) knows whose it was after the host's NAT.
const (
	allowHTTPPort   = 80
	allowTLSPort    = 443
	allowByAddrPort = 8080 // the world's Canary2AltPort
	allowOpenPort   = 443
)

// allowDeadline gives a probe by name the time to ask the resolver and
// still see TCP's first retransmission.
const allowDeadline = 2500 * time.Millisecond

// allowNames is box-w's allowlist.
func allowNames(t Scene) []string {
	return []string{strings.TrimSuffix(t.PublicName, "."), strings.TrimSuffix(t.Allow.RebindName, ".")}
}

// allowRun is C-ALLOW's state over a run.
type allowRun struct {
	// once reads the witness nameserver's log after the probes.
	once    sync.Once
	queries map[string]bool // names the witness was asked
	logErr  error
}

// mintAllowBox mints box-w under its allowlist. Without the world's
// second canary there is nothing to allow or deny.
func mintAllowBox(ctx context.Context, r *run) error {
	cfg := &r.cfg
	if !cfg.Topology.Allow.Valid() {
		r.skip(AllowID, "the topology has no second canary and internet witness (the hermetic world's)")
		return nil
	}
	r.locked(func() { keep(r.state, AllowID, &allowRun{}) })
	box := r.name(PlaceW, r.boxName("w"))
	names := allowNames(Scene{Topology: cfg.Topology})
	cfg.logf("allow: minting %s under the allowlist %s", box, strings.Join(names, " "))
	// Not provisioned: under its allowlist it reaches no package mirror.
	req, err := r.mintRequest(box, r.members.local(), false)
	if err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	req.Egress = names
	if err := mintProbeBox(ctx, cfg, req); err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	e, err := boxEnd(ctx, cfg.Host, PlaceW, box)
	if err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	r.addBox(e)
	return nil
}

// serveAllowEgress runs an egress service for box-w when none serves
// (box's resolver and proxy; box-guard-and-serve.service runs one on a
// host). It runs once every box is minted: until then C-TIER's port
// watcher, which the drill runs where no daemon does and stops after
// box-t, may be the one serving, and box-w would be left with none.
func serveAllowEgress(ctx context.Context, r *run) error {
	cfg := &r.cfg
	if stateOf[allowRun](r.state, AllowID) == nil || egress.Serving(cfg.Host.NetNS) {
		return nil
	}
	stop, err := serveEgress(ctx, cfg.Host)
	if err != nil {
		return fmt.Errorf("allow: %w", err)
	}
	cfg.logf("allow: no egress service ran; the drill runs one for box-w")
	r.later(func(context.Context) error { return stop() })
	return nil
}

// serveEgress runs box's egress service in this process until the
// returned function stops it.
func serveEgress(ctx context.Context, h *stack.Host) (func() error, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- egress.Serve(sctx, h.NetNS, io.Discard) }()
	deadline := time.Now().Add(5 * time.Second)
	for !egress.Serving(h.NetNS) {
		select {
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("starting an egress service: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return nil, errors.New("the egress service did not answer within 5 s")
		}
	}
	return func() error { cancel(); return <-done }, nil
}

// buildAllow adds box-w's probes, each blocked one witnessed in the
// internet's namespace (or on the LAN, or at the witness nameserver), and
// box-a's, which show each blocked path was there.
func buildAllow(b *builder) {
	t := b.t
	if !t.W.IP.IsValid() || !t.Allow.Valid() {
		return
	}
	w := allowScenario{b: b, t: t, al: t.Allow,
		allowed: strings.TrimSuffix(t.PublicName, "."), other: strings.TrimSuffix(t.Allow.OtherName, ".")}
	w.controls()
	w.otherNames()
	w.resolvers()
	w.tunnels()
	w.rebinding()
	w.open()
}

// allowScenario builds C-ALLOW's probes: box-w's, from the names it is
// allowed (allowed) and one it is not (other), and box-a's.
type allowScenario struct {
	b              *builder
	t              Scene
	al             topo.AllowTargets
	allowed, other string
}

// byName resolves name at the gateway first (an allowlist's set learns
// the answer), then connects.
func (w allowScenario) byName(n string, port int, speak, server string) probes.ProbeSpec {
	return probes.ProbeSpec{Kind: probes.KindTCP, Name: n, Resolver: w.t.Gateway, Port: port, Via: w.t.Subnet, Speak: speak, ServerName: server,
		DeadlineMS: int(allowDeadline.Milliseconds())}
}

func (w allowScenario) byAddr(a netip.Addr, port int, speak, server string) probes.ProbeSpec {
	return probes.ProbeSpec{Kind: probes.KindTCP, Target: a, Port: port, Via: w.t.Subnet, Speak: speak, ServerName: server}
}

func (w allowScenario) probe(from BoxEnd, ch Channel, target, key string, e Expectation, spec probes.ProbeSpec) *Action {
	return w.b.probe(Action{Claim: AllowID, Channel: ch, From: from.Place, Target: target, TargetKey: key, Expect: e}, spec)
}

// inetWitness watches the internet's namespace for a blocked probe.
func (w allowScenario) inetWitness(a *Action, dst netip.Addr, proto string, port int) {
	ws := probes.WitnessSpec{Via: w.al.InetVia, Proto: proto, Port: port, DstIP: dst}
	if a.Probe.Nonce != "" {
		// By the nonce alone: the proxy dials, and the gateway's
		// dnsmasq asks, from the host's own (NATed) address.
		ws.Nonces = []string{a.Probe.Nonce}
	} else {
		// A SYN carries no nonce: by the host's NATed source and the
		// source port this probe pinned.
		ws.SrcIPs, ws.SrcPort = []netip.Addr{w.al.InetNAT}, a.Probe.SrcPort
	}
	w.b.witness(a, PlaceInet, ws)
}

// nonced gives a blocked probe the nonce its witness looks for.
func nonced(spec probes.ProbeSpec) probes.ProbeSpec {
	spec.Nonce = probes.NewNonce()
	return spec
}

// pinned gives a blocked probe a source port of its own.
func (w allowScenario) pinned(spec probes.ProbeSpec) probes.ProbeSpec {
	spec.SrcPort = w.b.srcPort()
	return spec
}

// controls: the allowed canary by name, over HTTP through the proxy, and
// on a port no proxy takes, through the allow set.
func (w allowScenario) controls() {
	t, al, allowed := w.t, w.al, w.allowed
	w.probe(t.W, ChannelHTTP, "canary "+allowed+":80 (allowed, HTTP)", "internet", ExpectReach, w.byName(allowed, allowHTTPPort, probes.SpeakHTTP, "")).Greeting = t.CanaryGreeting
	if al.AltPort != 0 {
		w.probe(t.W, ChannelTCP, fmt.Sprintf("canary %s:%d (allowed)", allowed, al.AltPort), "internet", ExpectReach, w.byName(allowed, al.AltPort, "", "")).Greeting = t.CanaryGreeting
	}
}

// otherNames: the allowed canary's own address with another name (and
// QUIC to it), and the other canary, by its Host or by address.
func (w allowScenario) otherNames() {
	t, al, allowed, other := w.t, w.al, w.allowed, w.other
	a := w.probe(t.W, ChannelTLS, fmt.Sprintf("canary %s's address:443, TLS server name %s", allowed, other), "internet", ExpectBlocked,
		nonced(w.byName(allowed, allowTLSPort, probes.SpeakTLS, other)))
	w.inetWitness(a, t.Canary, "tcp", allowTLSPort)
	a = w.probe(t.W, ChannelHTTP, fmt.Sprintf("canary %s's address:80, HTTP Host %s", allowed, other), "internet", ExpectBlocked,
		nonced(w.byName(allowed, allowHTTPPort, probes.SpeakHTTP, other)))
	w.inetWitness(a, t.Canary, "tcp", allowHTTPPort)
	// QUIC to the allowed address (its name asked first by the controls).
	a = w.probe(t.W, ChannelQUIC, fmt.Sprintf("canary %s:443 over QUIC (UDP)", t.Canary), "internet", ExpectBlocked,
		probes.ProbeSpec{Kind: probes.KindUDP, Target: t.Canary, Port: allowTLSPort, Payload: probes.RequestQUIC, Nonce: probes.NewNonce(), Via: t.Subnet})
	w.inetWitness(a, t.Canary, "udp", allowTLSPort)

	a = w.probe(t.W, ChannelHTTP, fmt.Sprintf("second canary %s:80, HTTP Host %s", al.Other, other), "internet-2", ExpectBlocked,
		nonced(w.byAddr(al.Other, allowHTTPPort, probes.SpeakHTTP, other)))
	w.inetWitness(a, al.Other, "tcp", allowHTTPPort)
	a = w.probe(t.W, ChannelTCP, fmt.Sprintf("second canary %s:%d by address", al.Other, allowByAddrPort), "internet-2", ExpectBlocked,
		w.pinned(w.byAddr(al.Other, allowByAddrPort, "", "")))
	w.inetWitness(a, al.Other, "tcp", allowByAddrPort)
}

// resolvers: not a public resolver straight, nor over HTTPS.
func (w allowScenario) resolvers() {
	t := w.t
	a := w.probe(t.W, ChannelUDP, "public resolver "+t.Upstream.String()+":53, straight", "resolver", ExpectBlocked,
		probes.ProbeSpec{Kind: probes.KindUDP, Target: t.Upstream, Port: 53, Payload: "nonce", Nonce: probes.NewNonce(), Via: t.Subnet})
	w.inetWitness(a, t.Upstream, "udp", 53)
	a = w.probe(t.W, ChannelDoH, "public resolver "+t.Upstream.String()+":443, TLS without a name (DNS over HTTPS)", "resolver", ExpectBlocked,
		nonced(w.byAddr(t.Upstream, allowTLSPort, probes.SpeakTLS, "")))
	w.inetWitness(a, t.Upstream, "tcp", allowTLSPort)
}

// tunnels: questions for other names, under the allowed name, beside it,
// and elsewhere. Each is judged at the witness nameserver, alive when
// box-a's question for the same zone got there.
func (w allowScenario) tunnels() {
	t, al := w.t, w.al
	if al.WitnessLog == "" || al.AttackerZone == "" {
		return
	}
	for i, zone := range []string{w.allowed, w.other, strings.TrimSuffix(al.AttackerZone, ".")} {
		q := probes.NewNonce() + "." + zone
		ctl := w.b.reference(PlaceA, probes.ProbeSpec{ID: fmt.Sprintf("allow-ctl-%d", i), Kind: probes.KindDNS, Target: t.Gateway, Name: probes.NewNonce() + "." + zone, QType: "TXT", Via: t.Subnet,
			DelayMS: int(probeDelay.Milliseconds()), DeadlineMS: int(probeDeadline.Milliseconds())})
		a := w.probe(t.W, ChannelDNS, q+" (TXT, at the gateway)", "witness-ns", ExpectNotForwarded,
			probes.ProbeSpec{Kind: probes.KindDNS, Target: t.Gateway, Name: q, QType: "TXT", Via: t.Subnet})
		a.Reference = ctl
	}
}

// rebinding: an allowed name that resolves to a LAN host stays
// unreachable.
func (w allowScenario) rebinding() {
	t, al := w.t, w.al
	if !t.LANVia.IsValid() {
		return
	}
	a := w.probe(t.W, ChannelHTTP, al.RebindName+":80 (allowed, resolves to "+al.RebindAddr.String()+")", "lan-rebind", ExpectBlocked,
		w.pinned(w.byName(strings.TrimSuffix(al.RebindName, "."), allowHTTPPort, probes.SpeakHTTP, "")))
	w.b.witness(a, PlaceLAN, probes.WitnessSpec{Via: t.LANVia, SrcIPs: []netip.Addr{t.W.IP, t.LANNAT}, Proto: "tcp", Port: 80, SrcPort: a.Probe.SrcPort, DstIP: al.RebindAddr})
}

// open: box-a, open, reaches what box-w may not: it was there to be
// blocked.
func (w allowScenario) open() {
	t, al := w.t, w.al
	w.probe(t.A, ChannelHTTP, fmt.Sprintf("second canary %s:%d, HTTP Host %s (box-a is open)", al.Other, allowOpenPort, w.other), "internet-2", ExpectReach,
		w.byAddr(al.Other, allowOpenPort, probes.SpeakHTTP, w.other)).Greeting = al.OtherGreeting
	w.probe(t.A, ChannelQUIC, fmt.Sprintf("canary %s:443 over QUIC (box-a is open)", t.Canary), "internet", ExpectReach,
		probes.ProbeSpec{Kind: probes.KindUDP, Target: t.Canary, Port: allowTLSPort, Payload: probes.RequestQUIC, Via: t.Subnet}).Greeting = t.CanaryGreeting
	if al.ResolverGreeting != "" {
		w.probe(t.A, ChannelDoH, "public resolver "+t.Upstream.String()+":443 (box-a is open)", "resolver", ExpectReach,
			w.byAddr(t.Upstream, allowTLSPort, probes.SpeakTLS, "")).Greeting = al.ResolverGreeting
	}
}

// refineAllow judges the questions box-w must not have sent on, at the
// witness nameserver: a question of box-w's there fails, whatever box-w
// was told; its absence passes only when box-a's question for the same
// zone is there.
func refineAllow(r *run, res Result) Result {
	al := stateOf[allowRun](r.state, AllowID)
	if res.Expect != ExpectNotForwarded || res.Verdict == Fail || al == nil {
		return res
	}
	al.once.Do(func() {
		qs, err := witnesslog.Read(r.cfg.Topology.Allow.WitnessLog, r.rep.Started)
		al.logErr = err
		al.queries = map[string]bool{}
		for _, q := range qs {
			al.queries[strings.TrimSuffix(q.Name, ".")] = true
		}
	})
	if al.logErr != nil {
		return verdict(res, Inconclusive, "the witness nameserver's log could not be read: "+al.logErr.Error())
	}
	asked := strings.TrimSuffix(res.Probe.Name, ".")
	if al.queries[asked] {
		res.AtTarget = "the witness nameserver got " + asked
		return verdict(res, Fail, "the question left the host: its zone's authoritative nameserver got it (a DNS tunnel)")
	}
	ctl, ok := r.obs.get(res.Reference.At, res.Reference.ID)
	ctlName := ""
	if ok && ctl.Evidence.DNS != nil {
		ctlName = strings.TrimSuffix(ctl.Evidence.DNS.Name, ".")
	}
	if ctlName == "" || !al.queries[ctlName] {
		res.AtTarget = "the witness nameserver got neither this question nor box-a's for the same zone"
		return verdict(res, Inconclusive, "box-a's question for the same zone did not reach the witness nameserver ("+reportOf(ctl, ok)+"), so its silence proves nothing")
	}
	res.AtTarget = fmt.Sprintf("the witness nameserver got box-a's %s and not this one (%d questions in its log since the run began)", ctlName, len(al.queries))
	o := res.Obs
	told := "no answer"
	if o != nil && o.Evidence.DNS != nil && o.Evidence.DNS.Rcode != "" {
		told = o.Evidence.DNS.Rcode
		if o.Evidence.DNS.EDE != "" {
			told += " (" + o.Evidence.DNS.EDE + ")"
		}
	}
	return verdict(res, Pass, "answered at the gateway ("+told+") and never forwarded")
}

// The egress mutations: the whole table ("egress"), or one of its chains.
func dropEgressTable(ctx context.Context, h *stack.Host, _ []string) error {
	return deleteTable(h, nftables.TableFamilyINet, model.Current.NFTTable+"_egress")
}

// dropEgressChain is a mutation that deletes one chain of the egress table
// (its rules first: a chain must be empty to go).
func dropEgressChain(chain string) func(context.Context, *stack.Host, []string) error {
	return func(ctx context.Context, h *stack.Host, _ []string) error {
		return withNFT(h, func(conn *nftables.Conn) error {
			t := &nftables.Table{Family: nftables.TableFamilyINet, Name: model.Current.NFTTable + "_egress"}
			ch := &nftables.Chain{Table: t, Name: chain}
			conn.FlushChain(ch)
			conn.DelChain(ch)
			if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
			return nil // gone already (with its table: another mutation's)
		})
	}
}
