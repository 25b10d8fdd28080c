package observation

import (
	"fmt"
	"strings"
)

// Outcome is what one probe, witness or listener saw. The set is closed and
// no value stands for two things: a verdict built on it can always tell
// "the packet arrived" (Reached, Refused) from "the packet was stopped"
// (Rejected, Silent) from "we could not tell" (Error).
type Outcome string

const (
	// Reached: the target answered and proved it was the target (it echoed
	// the probe's nonce, answered the ARP request for its own address, or the
	// resolver returned records for the name).
	Reached Outcome = "reached"
	// Refused: the packet arrived at the target's address and something there
	// answered, but not with what the probe asked for: a TCP RST, an ICMP
	// port-unreachable sent by the target itself, a TCP handshake with no
	// nonce echo, a UDP reply without the nonce, or a DNS reply without
	// records (NXDOMAIN, NODATA, REFUSED, SERVFAIL). Evidence says which.
	Refused Outcome = "refused"
	// Rejected: something other than the target's own stack said the packet
	// will not be delivered: ICMP admin-prohibited from anyone, or any ICMP
	// destination-unreachable from an address that is not the target. The
	// offender is named in the evidence.
	Rejected Outcome = "rejected"
	// Silent: nothing came back before the deadline. Our own stack giving
	// up (no ARP/NDP answer for the next hop) is not silence: the packet
	// never left, so that is an Error.
	Silent Outcome = "silent"
	// Error: the probe itself could not run or its answer cannot be
	// classified without merging two meanings; the reason says why.
	Error Outcome = "error"
)

// Outcomes lists every valid outcome, in a stable order.
func Outcomes() []Outcome { return []Outcome{Reached, Refused, Rejected, Silent, Error} }

// Valid reports whether o is one of the fixed outcomes.
func (o Outcome) Valid() bool {
	switch o {
	case Reached, Refused, Rejected, Silent, Error:
		return true
	}
	return false
}

// Arrived reports whether the outcome proves the packet arrived at the
// target's address (reached or refused). An isolation claim that expects
// "blocked" fails on either.
func (o Outcome) Arrived() bool { return o == Reached || o == Refused }

// Stopped reports whether the sender saw the packet stopped (rejected by
// policy or silent). On its own this is not "blocked": a verdict also needs
// the target's witness to have seen nothing.
func (o Outcome) Stopped() bool { return o == Rejected || o == Silent }

// MarshalText refuses to encode an outcome outside the fixed set, so a bug
// can never put a new meaning on the wire.
func (o Outcome) MarshalText() ([]byte, error) {
	if !o.Valid() {
		return nil, fmt.Errorf("outcome %q is not one of reached, refused, rejected, silent, error", string(o))
	}
	return []byte(o), nil
}

// UnmarshalText accepts only the fixed set.
func (o *Outcome) UnmarshalText(b []byte) error {
	v := Outcome(b)
	if !v.Valid() {
		return fmt.Errorf("outcome %q is not one of reached, refused, rejected, silent, error", Truncate(string(b), 32))
	}
	*o = v
	return nil
}

// Truncate shortens s for an error message and keeps it plain ASCII.
func Truncate(s string, n int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < n; i++ {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		} else {
			b.WriteByte('?')
		}
	}
	if len(s) > n {
		b.WriteString("...")
	}
	return b.String()
}
