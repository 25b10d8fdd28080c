package drill

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/probes"
)

func TestJudgeSpoof(t *testing.T) {
	sc := testTopology()
	sc.B.Port = "veth-b"
	b, a := sc.B, sc.A
	arp := Result{Action: Action{Claim: "C-SPOOF", Channel: "arp", Probe: probes.ProbeSpec{Kind: probes.KindARPSpoof, ARPSenderIP: b.IP}}, Verdict: Pass, Evidence: "dropped"}
	held := neighEvent{IP: b.IP, MAC: b.MAC.String(), State: "stale"}
	lied := neighEvent{IP: b.IP, MAC: a.MAC.String(), State: "stale"}
	fdb := neighEvent{FDB: true, MAC: b.MAC.String(), Port: "veth-a", State: "reachable"}
	before := observations{PlaceB: {spoofBeforeID: {Outcome: probes.Reached}}}

	r := judgeSpoof(arp, before, sc, []neighEvent{held}, "")
	assert.Equal(t, Pass, r.Verdict)
	assert.Contains(t, r.Evidence, "the host's neighbour entry for box-b: "+b.IP.String()+" at "+b.MAC.String())

	r = judgeSpoof(arp, before, sc, []neighEvent{held, fdb, lied}, "")
	assert.Equal(t, Fail, r.Verdict, "a pass on the wire fails on the host's own tables")
	assert.Contains(t, r.Evidence, "(box-b is "+b.MAC.String()+")", "the neighbour entry is named")
	assert.Contains(t, r.Evidence, "the bridge learned box-b's MAC on another port", "and the forwarding database")

	r = judgeSpoof(arp, before, sc, nil, "netlink refused")
	assert.Equal(t, Pass, r.Verdict)
	assert.Contains(t, r.Evidence, "was not watched (netlink refused)")

	other := arp
	other.Probe.ARPSenderIP = netip.MustParseAddr("10.88.0.1")
	assert.Equal(t, Pass, judgeSpoof(other, before, sc, []neighEvent{lied}, "").Verdict, "a lie about the gateway is judged by its witness alone")

	ret := Result{Action: Action{Claim: "C-SPOOF", Channel: "return-traffic", Reference: ProbeRef{At: PlaceB, ID: spoofBeforeID}}, Verdict: Fail, Evidence: "not reached"}
	r = judgeSpoof(ret, before, sc, []neighEvent{lied}, "")
	assert.Equal(t, Fail, r.Verdict)
	assert.Contains(t, r.Evidence, "its return traffic went missing")
	r = judgeSpoof(ret, observations{PlaceB: {spoofBeforeID: {Outcome: probes.Silent}}}, sc, nil, "")
	assert.Equal(t, Inconclusive, r.Verdict, "box-b never reached the canary at all: nothing to say about the lies")
}
