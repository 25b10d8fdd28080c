package probes

import "github.com/box-isolation/box/probes/observation"

// Outcome is what one probe, witness or listener saw
// (observation.Outcome: the set is closed, and each value says one thing).
type Outcome = observation.Outcome

// The outcomes.
const (
	Reached  = observation.Reached
	Refused  = observation.Refused
	Rejected = observation.Rejected
	Silent   = observation.Silent
	Error    = observation.Error
)

// Outcomes lists every valid outcome, in a stable order.
func Outcomes() []Outcome { return observation.Outcomes() }

// localUnreachable is the reason for a probe our own stack could not send:
// no ARP/NDP answer for the next hop. The packet never left, so the probe
// says nothing about the path it was meant to test.
func localUnreachable(what string) string {
	return "our own stack gave up (" + what + "): no ARP/NDP answer for the next hop, so the packet never left and proves nothing"
}
