package hostscan

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
)

// ResolvConf is what a resolv.conf(5) says about where queries go.
type ResolvConf struct {
	// Nameservers in file order (the C library uses the first three);
	// invalid addresses are skipped, as the C library skips them.
	Nameservers []netip.Addr
	// Search is the search list in effect: "search" and "domain" exclude
	// each other and the last of them wins, a "domain d" line giving [d].
	Search []string
	// Domain is the last "domain" line's value, "" without one.
	Domain string
}

// ParseResolvConf parses resolv.conf text: nameserver, search and domain
// lines; options, sortlist and unknown keywords are ignored, as are
// comments (lines starting with # or ;, and anything after a # or ; on a
// line).
func ParseResolvConf(r io.Reader) (ResolvConf, error) {
	var rc ResolvConf
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(f[1]); err == nil {
				rc.Nameservers = append(rc.Nameservers, a.Unmap())
			}
		case "domain":
			rc.Domain = strings.TrimSuffix(f[1], ".")
			rc.Search = []string{rc.Domain}
		case "search":
			var list []string
			for _, d := range f[1:] {
				if d = strings.TrimSuffix(d, "."); d != "" && !slices.Contains(list, d) {
					list = append(list, d)
				}
			}
			rc.Search = list
		}
	}
	if err := sc.Err(); err != nil {
		return ResolvConf{}, fmt.Errorf("reading resolv.conf: %w", err)
	}
	return rc, nil
}

// systemd-resolved's stub listeners: 127.0.0.53 answers with its search
// domains, 127.0.0.54 proxies queries as they are.
var resolvedStubs = []netip.Addr{netip.MustParseAddr("127.0.0.53"), netip.MustParseAddr("127.0.0.54")}

// IsResolvedStub reports whether a is a systemd-resolved stub listener.
func IsResolvedStub(a netip.Addr) bool { return slices.Contains(resolvedStubs, a) }

// ResolvedUpstreamFile is where systemd-resolved writes the upstream
// servers it forwards to, in resolv.conf format.
const ResolvedUpstreamFile = "/run/systemd/resolve/resolv.conf"

// DNS is a host's resolver configuration.
type DNS struct {
	Conf ResolvConf // from /etc/resolv.conf
	// Stub is set when a nameserver of Conf is a systemd-resolved stub;
	// Upstream is then ResolvedUpstreamFile's content, or nil when that
	// file is missing (resolved not running, or another root).
	Stub     bool
	Upstream *ResolvConf
}

// Servers returns the resolvers that queries reach: Conf's nameservers
// with the resolved stubs replaced by the upstream servers when they are
// known (a stub stays when they are not), without duplicates.
func (d DNS) Servers() []netip.Addr {
	var out []netip.Addr
	add := func(as []netip.Addr) {
		for _, a := range as {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	for _, a := range d.Conf.Nameservers {
		if IsResolvedStub(a) && d.Upstream != nil {
			add(d.Upstream.Nameservers)
			continue
		}
		add([]netip.Addr{a})
	}
	return out
}

// SearchDomains returns Conf's search list followed by the upstream
// file's, without duplicates.
func (d DNS) SearchDomains() []string {
	var out []string
	lists := [][]string{d.Conf.Search}
	if d.Upstream != nil {
		lists = append(lists, d.Upstream.Search)
	}
	for _, l := range lists {
		for _, s := range l {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// Resolvers reads root's /etc/resolv.conf (root "" or "/" is this
// machine's) and, when it points at the systemd-resolved stub, root's
// ResolvedUpstreamFile for the real upstream servers. A missing
// /etc/resolv.conf is an error (wrapping fs.ErrNotExist); a missing
// upstream file is not.
func Resolvers(root string) (DNS, error) {
	var d DNS
	b, err := readUnder(root, "/etc/resolv.conf")
	if err != nil {
		return DNS{}, fmt.Errorf("reading resolv.conf: %w", err)
	}
	if d.Conf, err = ParseResolvConf(bytes.NewReader(b)); err != nil {
		return DNS{}, err
	}
	d.Stub = slices.ContainsFunc(d.Conf.Nameservers, IsResolvedStub)
	if !d.Stub {
		return d, nil
	}
	b, err = readUnder(root, ResolvedUpstreamFile)
	if errorsIsNotExist(err) {
		return d, nil
	}
	if err != nil {
		return DNS{}, fmt.Errorf("reading systemd-resolved's upstream servers: %w", err)
	}
	up, err := ParseResolvConf(bytes.NewReader(b))
	if err != nil {
		return DNS{}, fmt.Errorf("%s: %w", ResolvedUpstreamFile, err)
	}
	d.Upstream = &up
	return d, nil
}
