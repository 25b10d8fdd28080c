package stack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
)

// NotABoxError is returned for an instance that exists but that box did
// not mint: every box verb refuses it.
type NotABoxError struct {
	Name   string
	Reason string
}

func (e *NotABoxError) Error() string {
	return fmt.Sprintf("%s is not a box: %s; box only touches instances it minted (manage it with incus directly)", e.Name, e.Reason)
}

// NoSuchBoxError is returned when no instance has the name.
type NoSuchBoxError struct{ Name string }

func (e *NoSuchBoxError) Error() string {
	return fmt.Sprintf("no box named %s (box list shows yours)", e.Name)
}

// Box is a box as `box list` and `box info` show it.
type Box struct {
	Name       string            `json:"name"`
	Status     string            `json:"status"`
	Type       string            `json:"type"`
	Generation string            `json:"generation"` // current or legacy tag
	Created    time.Time         `json:"created"`
	Stamps     map[string]string `json:"stamps"`
	Profiles   []string          `json:"profiles"`
	// Member is the cluster member the box is on; empty off a cluster.
	Member string `json:"member,omitempty"`
	// OnStack is what the fleet census says (nil when it could not be
	// taken, e.g. without the privileges to read nft); OffStack says why
	// not.
	OnStack  *bool    `json:"on_stack,omitempty"`
	OffStack []string `json:"off_stack,omitempty"`
	// Notes say what minting it decided on its own (no memory limit).
	Notes []string `json:"notes,omitempty"`
}

func boxOf(i *incus.Instance, gen string) Box {
	b := Box{Name: i.Name, Status: i.Status, Type: i.Type, Generation: gen, Created: i.CreatedAt, Stamps: map[string]string{}, Profiles: i.Profiles}
	if i.Location != "none" {
		// A standalone incusd says "none".
		b.Member = i.Location
	}
	for k, v := range i.Config {
		if strings.HasPrefix(k, model.StampPrefix) {
			b.Stamps[k] = v
		}
	}
	return b
}

// boxFilter is the one server-side filter for both tags.
var boxFilter = fmt.Sprintf("config.%s eq 1 or config.%s eq 1", model.Current.Tag, model.Legacy.Tag)

// Boxes lists every box, of either tag, in one request.
func Boxes(ctx context.Context, c *incus.Client) ([]Box, error) {
	insts, err := c.Instances().Where(ctx, boxFilter)
	if err != nil {
		return nil, fmt.Errorf("listing boxes: %w", err)
	}
	out := []Box{}
	for i := range insts {
		// The filter is the server's; the tag check is ours.
		if gen, ok := model.IsBox(&insts[i]); ok {
			out = append(out, boxOf(&insts[i], gen))
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, nil
}

// Resolve finds a box by name through the tag: every operation on a named
// box goes through here first.
func Resolve(ctx context.Context, c *incus.Client, name string) (*incus.Instance, string, error) {
	inst, etag, err := c.Instances().Get(ctx, name)
	if incus.IsNotFound(err) {
		return nil, "", &NoSuchBoxError{Name: name}
	}
	if err != nil {
		return nil, "", fmt.Errorf("looking up %s: %w", name, err)
	}
	if _, ok := model.IsBox(inst); !ok {
		return nil, "", &NotABoxError{Name: name, Reason: fmt.Sprintf("it has no %s=1 tag", model.Current.Tag)}
	}
	return inst, etag, nil
}

// Info returns one box.
func Info(ctx context.Context, c *incus.Client, name string) (*Box, error) {
	inst, _, err := Resolve(ctx, c, name)
	if err != nil {
		return nil, err
	}
	gen, _ := model.IsBox(inst)
	b := boxOf(inst, gen)
	return &b, nil
}

// NoStackError is a box verb on a host with no isolation stack.
type NoStackError struct{ Missing string }

func (e *NoStackError) Error() string {
	return fmt.Sprintf("there is no isolation stack on this host (%s is missing): run `box setup-host` first (as root)", e.Missing)
}

// RequireStack returns the stack's bridge with its etag, or a NoStackError
// naming what is missing; a daemon that does not answer is incus's own
// error.
func RequireStack(ctx context.Context, c *incus.Client) (*incus.Network, string, error) {
	net, etag, err := c.Networks().Get(ctx, model.Current.Network)
	if incus.IsNotFound(err) {
		return nil, "", &NoStackError{Missing: "network " + model.Current.Network}
	}
	if err != nil {
		return nil, "", err
	}
	if ok, err := c.HasProfile(ctx, model.Current.Profile); err != nil {
		return nil, "", err
	} else if !ok {
		return nil, "", &NoStackError{Missing: "profile " + model.Current.Profile}
	}
	return net, etag, nil
}

// NeedsColdCopy says a copy of a running container failed only because it
// ran: this host cannot freeze it, or (to another member) migrate it live.
func NeedsColdCopy(err error) bool {
	return strings.Contains(err.Error(), "freezing") || strings.Contains(err.Error(), "live container migration")
}

// WithoutFixedAddress drops the fixed address of a copy's own NIC on the
// bridge: it is its source's.
func WithoutFixedAddress(devices map[string]map[string]string) {
	for _, d := range devices {
		if model.IsNIC(d) && model.OnBridge(model.Current.Network, d) {
			delete(d, "ipv4.address")
		}
	}
}

// ForgetMACs drops the MACs Incus gave a copy's NICs (volatile.<nic>.hwaddr),
// so it draws new ones at its first start.
func ForgetMACs(cfg map[string]string) {
	for k := range cfg {
		if strings.HasPrefix(k, "volatile.") && strings.HasSuffix(k, ".hwaddr") {
			delete(cfg, k)
		}
	}
}

// MemberOf is the cluster member an instance is on; "" off a cluster.
func (addrs *Addresses) MemberOf(ctx context.Context, inst *incus.Instance) (string, error) {
	host := addrs.host
	ci, err := host.Cluster(ctx)
	if err != nil || !ci.Clustered() {
		return "", err
	}
	return inst.Location, nil
}

func RemoveInstance(ctx context.Context, c *incus.Client, name string) error {
	inst, _, err := c.Instances().Get(ctx, name)
	if err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	// The status from the instance, not its state: incusd answers 500
	// "invalid PID" for the state of a box whose start just failed.
	if inst.Status != "Stopped" {
		if err := c.Instances().SetState(ctx, name, "stop", 0, true); err != nil {
			return fmt.Errorf("stopping %s to remove it: %w", name, err)
		}
	}
	if err := c.Instances().Delete(ctx, name); err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	return nil
}

// Wait waits until a box has its fixed IPv4 address (or, for a box
// without one, an address on the stack's subnet), read from Incus's view
// of its interfaces (whatever they are named). A box that holds another
// address of the subnet instead is never reported as up: the error says
// which, and what repairs it.
func (addrs *Addresses) Wait(ctx context.Context, name string, limit time.Duration) (netip.Addr, error) {
	start := time.Now()
	host := addrs.host
	p, ok := addrs.kernelGateway()
	if !ok {
		net, _, err := host.Incus.Networks().Get(ctx, model.Current.Network)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("reading network %s: %w", model.Current.Network, err)
		}
		p, err = netip.ParsePrefix(net.Config["ipv4.address"])
		if err != nil && host.Tier.Granted {
			// A granted user sees no network's config, only its state.
			p, err = bridgeSubnetFromState(ctx, host.Incus)
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("network %s has no usable ipv4.address", model.Current.Network)
		}
	}
	ip, err := host.Incus.Instances().WaitAddress(ctx, name, p.Masked(), limit)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: is dnsmasq serving %s? (box doctor)", err, model.Current.Network)
	}
	// Its fixed address, read now: a granted user's box has it from the
	// port watcher once its port came up.
	inst, _, err := host.Incus.Instances().Get(ctx, name)
	if err == nil {
		if fixed := model.FixedAddressOf(inst); fixed.IsValid() && ip != fixed {
			if _, err := host.Incus.Instances().WaitAddress(ctx, name, netip.PrefixFrom(fixed, 32), max(limit-time.Since(start), time.Second)); err != nil {
				return netip.Addr{}, fmt.Errorf("%s has %s from the bridge's DHCP, not its fixed address %s, so its pins drop what it sends: box doctor names why (a dnsmasq whose lease file was replaced, a lease astray) and box doctor --fix repairs it", name, ip, fixed)
			}
			ip = fixed
		}
		if addrs.pinnedAsItIs(inst) {
			return ip, nil
		}
	}
	// The box holds its address now: a refresh pins a granted user's box
	// (the watcher gave it its address) and fills its egress sets.
	_, err = host.RefreshPorts(ctx)
	return ip, err
}

// pinnedAsItIs reports whether the kernel pins inst's ports as its NICs
// are now (each to its MAC and fixed address): the refresh that pinned
// them filled its egress sets from the same reading of the fleet, so
// another would change nothing for it (beside a full bridge, it reads
// every instance). Never where box does not read the kernel (ownNS) nor
// for a box without a fixed address.
func (addrs *Addresses) pinnedAsItIs(inst *incus.Instance) bool {
	var pins []nft.Pin
	for _, n := range model.BridgeNICs(model.Current.Network, inst) {
		mac, err := net.ParseMAC(n.Mac)
		a, aerr := netip.ParseAddr(inst.ExpandedDevices[n.Dev]["ipv4.address"])
		if err != nil || aerr != nil || n.Port == "" {
			return false
		}
		pins = append(pins, nft.Pin{Port: n.Port, MAC: mac, Addrs: []netip.Addr{a}})
	}
	g := addrs.ownNS()
	if len(pins) == 0 || g == nil {
		return false
	}
	defer g.Close()
	held, err := nft.PinsHeld(g.NFTConfig(model.Current), pins)
	return err == nil && held
}

// names lists boxes' names, for messages.
func names(bs []Box) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Name
	}
	return out
}

// bridgeSubnetFromState reads the bridge's IPv4 subnet from its state.
func bridgeSubnetFromState(ctx context.Context, c *incus.Client) (netip.Prefix, error) {
	st, err := c.Networks().State(ctx, model.Current.Network)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, a := range st.Addresses {
		if a.Family == "inet" && a.Scope == "global" {
			return netip.ParsePrefix(a.Address + "/" + a.Netmask)
		}
	}
	return netip.Prefix{}, fmt.Errorf("%s has no IPv4 address", model.Current.Network)
}
