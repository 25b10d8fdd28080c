package hostscan

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DHCPLease is a lease a DHCP client of the host recorded, reduced to
// what the drill aims at: the server that granted it.
type DHCPLease struct {
	Server netip.Addr // the DHCP server identifier (option 54)
	// Address is the leased address, when the file has it.
	Address netip.Addr
	// Interface names the host's interface the lease is for, "" when the
	// file does not say; IfIndex is set instead for systemd-networkd,
	// whose lease files are named by link index.
	Interface string
	IfIndex   int
	Client    string // "dhclient", "systemd-networkd" or "NetworkManager"
	File      string // the lease file, as a path inside the root
}

// Lease file clients.
const (
	ClientDhclient       = "dhclient"
	ClientNetworkd       = "systemd-networkd"
	ClientNetworkManager = "NetworkManager"
)

// leaseDirs are where DHCPServers looks, inside the root.
var leaseDirs = []struct {
	dir, pattern, client string
}{
	{"/var/lib/dhcp", "*.leases", ClientDhclient},                         // Debian, Ubuntu
	{"/var/lib/dhclient", "*", ClientDhclient},                            // Fedora, RHEL
	{"/run/systemd/netif/leases", "*", ClientNetworkd},                    // named by ifindex
	{"/var/lib/NetworkManager", "internal-*.lease", ClientNetworkManager}, // NM's own client
	{"/var/lib/NetworkManager", "dhclient-*.lease", ClientNetworkManager}, // NM running dhclient
}

// DHCPServers returns the DHCP servers the host under root ("" or "/" for
// this machine) got its IPv4 leases from, read from dhclient lease files
// (/var/lib/dhcp/*.leases, /var/lib/dhclient/*), systemd-networkd's
// (/run/systemd/netif/leases/*) and NetworkManager's
// (/var/lib/NetworkManager/{internal,dhclient}-*.lease). One entry per
// server, client and interface: the latest lease in file order. It is best
// effort: missing files and directories are no error, and files it cannot
// read or parse are reported in the error while the others' leases are
// still returned. dhcpcd's binary leases and DHCPv6 (whose server id is a
// DUID, not an address) are not read.
func DHCPServers(root string) ([]DHCPLease, error) {
	var out []DHCPLease
	var errs []error
	for _, d := range leaseDirs {
		files, err := listUnder(root, d.dir, d.pattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s: %w", d.dir, err))
			continue
		}
		for _, f := range files {
			b, err := readUnder(root, f)
			if err != nil {
				if !errorsIsNotExist(err) {
					errs = append(errs, fmt.Errorf("reading lease file: %w", err))
				}
				continue
			}
			ls, err := parseLeaseFile(b, f, d.client)
			if err != nil {
				errs = append(errs, fmt.Errorf("parsing %s: %w", f, err))
				continue
			}
			out = append(out, ls...)
		}
	}
	return dedupLeases(out), errors.Join(errs...)
}

// dhclientSyntax tells a dhclient lease file from a key=value one.
var dhclientSyntax = regexp.MustCompile(`(?m)^\s*lease6?\s*\{`)

// nmLeaseName is NetworkManager's lease file name:
// <client>-<connection uuid>-<interface>.lease.
var nmLeaseName = regexp.MustCompile(`^(?:internal|dhclient)6?-[0-9a-fA-F-]{36}-(.+)\.lease$`)

func parseLeaseFile(b []byte, file, client string) ([]DHCPLease, error) {
	var ls []DHCPLease
	if dhclientSyntax.Match(b) {
		var err error
		if ls, err = ParseDhclientLeases(bytes.NewReader(b)); err != nil {
			return nil, err
		}
	} else {
		l, err := ParseNetworkdLease(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		if l.Server.IsValid() {
			ls = []DHCPLease{l}
		}
	}
	base := path.Base(file)
	for i := range ls {
		ls[i].Client, ls[i].File = client, file
		switch client {
		case ClientNetworkd:
			if n, err := strconv.Atoi(base); err == nil {
				ls[i].IfIndex = n
			}
		case ClientNetworkManager:
			if m := nmLeaseName.FindStringSubmatch(base); m != nil && ls[i].Interface == "" {
				ls[i].Interface = m[1]
			}
		}
	}
	return ls, nil
}

// dedupLeases keeps, per server, client and interface, the last lease.
func dedupLeases(ls []DHCPLease) []DHCPLease {
	type key struct {
		server  netip.Addr
		client  string
		iface   string
		ifindex int
	}
	var out []DHCPLease
	at := map[key]int{}
	for _, l := range ls {
		k := key{l.Server, l.Client, l.Interface, l.IfIndex}
		if i, ok := at[k]; ok {
			out[i] = l
			continue
		}
		at[k] = len(out)
		out = append(out, l)
	}
	return slices.Clip(out)
}

// ParseDhclientLeases parses an ISC dhclient lease file and returns its
// IPv4 leases that name a server ("option dhcp-server-identifier"), in
// file order, with the interface and fixed-address when given. lease6
// blocks are skipped.
func ParseDhclientLeases(r io.Reader) ([]DHCPLease, error) {
	var out []DHCPLease
	var cur *DHCPLease // inside a "lease {" block
	depth := 0
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		bare := stripQuoted(line)
		if depth == 0 && strings.HasPrefix(bare, "lease") && strings.HasSuffix(bare, "{") &&
			strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(bare, "lease"), "{")) == "" {
			cur = &DHCPLease{}
		} else if depth == 1 && cur != nil {
			parseDhclientStatement(cur, line)
		}
		depth += strings.Count(bare, "{") - strings.Count(bare, "}")
		if depth < 0 {
			return nil, fmt.Errorf("line %d: unbalanced }", n)
		}
		if depth == 0 && cur != nil {
			if cur.Server.IsValid() {
				out = append(out, *cur)
			}
			cur = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if depth != 0 {
		return nil, fmt.Errorf("unterminated block at end of file")
	}
	return out, nil
}

// parseDhclientStatement reads one statement of a lease block.
func parseDhclientStatement(l *DHCPLease, line string) {
	line = strings.TrimSpace(strings.TrimSuffix(line, ";"))
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "interface":
		l.Interface = strings.Trim(f[1], `"`)
	case len(f) == 2 && f[0] == "fixed-address":
		if a, err := netip.ParseAddr(f[1]); err == nil {
			l.Address = a
		}
	case len(f) == 3 && f[0] == "option" && f[1] == "dhcp-server-identifier":
		if a, err := netip.ParseAddr(f[2]); err == nil {
			l.Server = a
		}
	}
}

// stripQuoted drops the contents of double-quoted strings, so braces in
// them are not counted.
func stripQuoted(s string) string {
	var b strings.Builder
	in, esc := false, false
	for _, r := range s {
		switch {
		case esc:
			esc = false
		case in && r == '\\':
			esc = true
		case r == '"':
			in = !in
		case !in:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ParseNetworkdLease parses a systemd-networkd lease file (also the format
// of NetworkManager's internal client): KEY=VALUE lines, of which
// SERVER_ADDRESS and ADDRESS are read. Server is the zero Addr when the
// file names none.
func ParseNetworkdLease(r io.Reader) (DHCPLease, error) {
	var l DHCPLease
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		a, err := netip.ParseAddr(strings.Trim(strings.TrimSpace(v), `"`))
		if err != nil {
			continue
		}
		switch strings.TrimSpace(k) {
		case "SERVER_ADDRESS":
			l.Server = a
		case "ADDRESS":
			l.Address = a
		}
	}
	if err := sc.Err(); err != nil {
		return DHCPLease{}, err
	}
	return l, nil
}
