package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Counting chains are the drill's witness after the filter: a packet a box
// sends to a host address that a capture on the bridge sees may still be
// dropped by the input hook; one counted by a chain that runs after every
// filter was accepted, whether or not anything listens. They count only
// (policy accept, no verdict in any rule) and live in a table of their
// own, which the drill deletes after its run.

// CounterPriority is the counting chains' priority on the input and
// forward hooks: after filter (0), security (50) and source NAT (100), so
// only packets every filter accepted are counted.
const CounterPriority = 1000

// CounterPrefix starts the name of every counting table, so leftovers of
// an aborted run are found.
const CounterPrefix = "drill_"

// CountKey is one class of packets a counting chain counts: IPv4 from Src
// to Dst, over tcp or udp to Port, or icmp echo requests.
type CountKey struct {
	Src   netip.Addr
	Dst   netip.Addr
	Proto string // tcp, udp or icmp
	Port  uint16
	// SrcPort, when set, counts only the connection from that source port
	// (tcp and udp): one probe's, past a NAT that kept its port.
	SrcPort uint16
}

func (k CountKey) String() string {
	if k.Proto == "icmp" {
		return fmt.Sprintf("icmp %s>%s", k.Src, k.Dst)
	}
	if k.SrcPort != 0 {
		return fmt.Sprintf("%s %s:%d>%s:%d", k.Proto, k.Src, k.SrcPort, k.Dst, k.Port)
	}
	return fmt.Sprintf("%s %s>%s:%d", k.Proto, k.Src, k.Dst, k.Port)
}

func (k CountKey) rule() (Rule, error) {
	if !k.Src.Is4() || !k.Dst.Is4() {
		return Rule{}, fmt.Errorf("count key %s: IPv4 addresses only", k)
	}
	parts := []part{ipAddr("saddr", 12, k.Src)}
	switch k.Proto {
	case "tcp", "udp":
		// The connection's original destination, so a packet the host
		// forwards (DNAT) or redirects is counted by what the box aimed at.
		parts = append(parts, ctOriginalDst(k.Dst), l4proto(k.Proto), ctOriginalPort(k.Port, expr.CtKeyPROTODST, "proto-dst"))
		if k.SrcPort != 0 {
			parts = append(parts, ctOriginalPort(k.SrcPort, expr.CtKeyPROTOSRC, "proto-src"))
		}
	case "icmp":
		parts = append(parts, ipAddr("daddr", 16, k.Dst), icmpType(unix.IPPROTO_ICMP, 8, "icmp type echo-request"))
	default:
		return Rule{}, fmt.Errorf("count key %s: protocol %q is not tcp, udp or icmp", k, k.Proto)
	}
	// A named counter: both chains count into it, and it is read as an
	// object (google/nftables cannot decode the ct direction of a rule the
	// kernel lists).
	return rule(part{fmt.Sprintf("counter name %q", k.String()), []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: k.String()}}}, parts...), nil
}

// ctOriginalDst matches the connection's original destination address. In
// the inet family the kernel loads the tuple's whole 16-byte address; an
// IPv4 tuple holds the address first and zeros after it.
func ctOriginalDst(a netip.Addr) part {
	b := make([]byte, 16)
	a4 := a.As4()
	copy(b, a4[:])
	return part{"ct original ip daddr " + a.String(), []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDST, Direction: 0},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}}
}

// ctOriginalPort matches the connection's original destination (or
// source) port.
func ctOriginalPort(port uint16, key expr.CtKey, name string) part {
	return part{fmt.Sprintf("ct original %s %d", name, port), []expr.Any{
		&expr.Ct{Register: 1, Key: key, Direction: 0},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}}
}

// l4proto matches the transport protocol.
func l4proto(proto string) part {
	num := byte(unix.IPPROTO_TCP)
	if proto == "udp" {
		num = unix.IPPROTO_UDP
	}
	return part{"meta l4proto " + proto, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{num}},
	}}
}

// counterHooks are where the counting chains sit: input for what reaches
// the host, forward for what it forwards (a DNAT to elsewhere).
var counterHooks = []struct {
	name string
	hook *nftables.ChainHook
}{{"input", nftables.ChainHookInput}, {"forward", nftables.ChainHookForward}}

// InstallCounters creates the counting table (inet, named table, which must
// start with CounterPrefix) in namespace netns (an fd; 0 for the current
// one) with one counting rule per key; a failure leaves no table behind.
func InstallCounters(netns int, table string, keys []CountKey) error {
	if !strings.HasPrefix(table, CounterPrefix) {
		return fmt.Errorf("counting table %q must start with %q", table, CounterPrefix)
	}
	c, done, err := dial(Config{NetNS: netns})
	if err != nil {
		return err
	}
	defer done()
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	var chains []*nftables.Chain
	for _, h := range counterHooks {
		chains = append(chains, c.AddChain(&nftables.Chain{Name: h.name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: h.hook, Priority: nftables.ChainPriorityRef(CounterPriority), Policy: policyOf("accept")}))
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("creating counting table inet %s: %w", table, err)
	}
	// The keys in batches: every message of a batch is acknowledged, and a
	// few hundred keys' acknowledgements overflow the netlink socket's
	// receive buffer (ENOBUFS; docs/measurements.md, "A cluster").
	for len(keys) > 0 {
		n := min(len(keys), counterBatch)
		for _, k := range keys[:n] {
			c.AddObj(&nftables.CounterObj{Table: t, Name: k.String()})
		}
		for _, ch := range chains {
			for _, k := range keys[:n] {
				r, err := k.rule()
				if err != nil {
					return err
				}
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs})
			}
		}
		if err := c.Flush(); err != nil {
			c.DelTable(t)
			return errors.Join(fmt.Errorf("filling counting table inet %s: %w", table, err), c.Flush())
		}
		keys = keys[n:]
	}
	return nil
}

// counterBatch is how many keys go in one netlink batch.
const counterBatch = 16

// ReadCounters returns the packets each key's counter counted, by the
// key's String.
func ReadCounters(netns int, table string) (map[string]uint64, error) {
	c, done, err := dial(Config{NetNS: netns})
	if err != nil {
		return nil, err
	}
	defer done()
	objs, err := c.GetObjects(&nftables.Table{Family: nftables.TableFamilyINet, Name: table})
	if err != nil {
		return nil, fmt.Errorf("reading the counters of table inet %s: %w", table, err)
	}
	out := map[string]uint64{}
	for _, o := range objs {
		if ctr, ok := o.(*nftables.CounterObj); ok {
			out[ctr.Name] = ctr.Packets
		}
	}
	return out, nil
}

// DeleteCounters removes the counting tables: the named one, or (table
// empty) every table starting with CounterPrefix. It names what it
// removed.
func DeleteCounters(netns int, table string) ([]string, error) {
	c, done, err := dial(Config{NetNS: netns})
	if err != nil {
		return nil, err
	}
	defer done()
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	var removed []string
	for _, t := range ts {
		if (table == "" && strings.HasPrefix(t.Name, CounterPrefix)) || (table != "" && t.Name == table) {
			c.DelTable(t)
			removed = append(removed, "table inet "+t.Name)
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("deleting %s: %w", strings.Join(removed, ", "), err)
	}
	return removed, nil
}
