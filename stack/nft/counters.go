package nft

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Counting chains are the drill's witness after the filter: a packet a box
// sends to a host address that a capture on the bridge sees may still be
// dropped by the input hook; one counted by a chain that runs after every
// filter was accepted, whether or not anything listens. They count only
// (policy accept, no verdict in any rule) and live in a table of their
// own, which the drill deletes after its run.

// CounterPriority is the counting chain's priority on the input hook:
// after filter (0), security (50) and source NAT (100), so only packets
// every filter accepted are counted.
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
}

func (k CountKey) String() string {
	if k.Proto == "icmp" {
		return fmt.Sprintf("icmp %s>%s", k.Src, k.Dst)
	}
	return fmt.Sprintf("%s %s>%s:%d", k.Proto, k.Src, k.Dst, k.Port)
}

func (k CountKey) rule() (Rule, error) {
	if !k.Src.Is4() || !k.Dst.Is4() {
		return Rule{}, fmt.Errorf("count key %s: IPv4 addresses only", k)
	}
	parts := []part{ipAddr("saddr", 12, k.Src), ipAddr("daddr", 16, k.Dst)}
	switch k.Proto {
	case "tcp", "udp":
		parts = append(parts, dport(k.Proto, k.Port))
	case "icmp":
		parts = append(parts, icmpType(unix.IPPROTO_ICMP, 8, "icmp type echo-request"))
	default:
		return Rule{}, fmt.Errorf("count key %s: protocol %q is not tcp, udp or icmp", k, k.Proto)
	}
	return rule(part{"counter", []expr.Any{&expr.Counter{}}}, parts...), nil
}

// InstallCounters creates the counting table (inet, named table, which must
// start with CounterPrefix) in namespace netns (an fd; 0 for the current
// one) with one counting rule per key, in one batch.
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
	ch := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(CounterPriority), Policy: policyOf("accept")})
	for _, k := range keys {
		r, err := k.rule()
		if err != nil {
			return err
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: []byte(k.String())})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("creating counting table inet %s: %w", table, err)
	}
	return nil
}

// ReadCounters returns the packets each key's rule counted, by the key's
// String.
func ReadCounters(netns int, table string) (map[string]uint64, error) {
	c, done, err := dial(Config{NetNS: netns})
	if err != nil {
		return nil, err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: table}
	rules, err := c.GetRules(t, &nftables.Chain{Name: "input", Table: t})
	if err != nil {
		return nil, fmt.Errorf("reading counting table inet %s: %w", table, err)
	}
	out := map[string]uint64{}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				out[string(r.UserData)] += ctr.Packets
			}
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
