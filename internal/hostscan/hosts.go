package hostscan

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// HostsEntry is one line of a hosts(5) file.
type HostsEntry struct {
	Addr    netip.Addr // with its zone, if the line gave one
	Name    string     // the canonical name
	Aliases []string
}

// ParseHosts parses a hosts(5) file: an address, a canonical name and
// aliases per line, "#" starting a comment anywhere. Lines whose address
// does not parse or that name no host are skipped, as the C library skips
// them.
func ParseHosts(r io.Reader) ([]HostsEntry, error) {
	var out []HostsEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		a, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		e := HostsEntry{Addr: a, Name: f[1]}
		if len(f) > 2 {
			e.Aliases = f[2:]
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading hosts file: %w", err)
	}
	return out, nil
}

// ReadHosts reads and parses the hosts file at path ("/etc/hosts" for
// this machine's).
func ReadHosts(path string) ([]HostsEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading hosts file: %w", err)
	}
	defer f.Close()
	es, err := ParseHosts(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return es, nil
}

// Hostname returns the kernel's host name for the calling thread's UTS
// namespace.
func Hostname() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reading the host name: %w", err)
	}
	return h, nil
}

// FQDN returns the fully qualified name of hostname, the way the
// resolver would find it without asking DNS, or "" when nothing says:
//
//   - from hosts, in file order, the first entry naming hostname (as its
//     canonical name or an alias, ignoring case) whose canonical name is
//     dotted gives that name, or else one of whose aliases is
//     hostname.<domain> gives that alias;
//   - a dotted hostname is its own FQDN;
//   - otherwise hostname plus resolv.conf's domain, or the first search
//     domain when there is no domain line.
func FQDN(hostname string, hosts []HostsEntry, rc ResolvConf) string {
	hostname = strings.TrimSuffix(hostname, ".")
	if hostname == "" {
		return ""
	}
	for _, e := range hosts {
		if !e.names(hostname) {
			continue
		}
		if strings.Contains(strings.TrimSuffix(e.Name, "."), ".") {
			return strings.TrimSuffix(e.Name, ".")
		}
		for _, a := range e.Aliases {
			if len(a) > len(hostname)+1 && strings.EqualFold(a[:len(hostname)+1], hostname+".") {
				return strings.TrimSuffix(a, ".")
			}
		}
	}
	if strings.Contains(hostname, ".") {
		return hostname
	}
	if rc.Domain != "" {
		return hostname + "." + rc.Domain
	}
	if len(rc.Search) > 0 {
		return hostname + "." + rc.Search[0]
	}
	return ""
}

// names reports whether the entry names host, canonically or as an alias.
func (e HostsEntry) names(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(e.Name, "."), host) {
		return true
	}
	for _, a := range e.Aliases {
		if strings.EqualFold(strings.TrimSuffix(a, "."), host) {
			return true
		}
	}
	return false
}
