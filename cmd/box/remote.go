package main

import (
	"flag"
	"fmt"
	"maps"
	"slices"

	"github.com/box-isolation/box/stack/incus"
)

// Remotes: another Incus over HTTPS, added with the trust token its admin
// issued and kept where the incus CLI keeps its remotes (docs/box.md,
// "Remotes"), so that `incus` and `box` reach the same servers.

func setupRemote(fs *flag.FlagSet) action {
	addr := fs.String("addr", "", "the server's https://HOST:PORT (default: the first of the token's addresses that answers)")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(c *call) error {
		switch c.args[0] {
		case "add":
			if len(c.args) != 3 {
				return usagef("remote add NAME TOKEN (on the server: incus config trust add NAME prints the token)")
			}
			return c.remoteAdd(c.args[1], c.args[2], *addr, *asJSON)
		case "list":
			if len(c.args) != 1 {
				return usagef("remote list takes nothing more")
			}
			return c.remoteList(*asJSON)
		}
		return usagef("remote %s: add or list", c.args[0])
	}
}

// remoteJSON is one remote as box remote prints it.
type remoteJSON struct {
	Name        string `json:"name"`
	Addr        string `json:"addr"`
	Protocol    string `json:"protocol"`
	Project     string `json:"project,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

func toRemoteJSON(r incus.Remote) remoteJSON {
	j := remoteJSON{Name: r.Name, Addr: r.Addr, Protocol: r.Protocol, Project: r.Project}
	if cert, err := incus.ParseCertificatePEM([]byte(r.Certificate)); err == nil {
		j.Fingerprint = incus.Fingerprint(cert)
	}
	return j
}

func (c *call) remoteAdd(name, tokenText, addr string, asJSON bool) error {
	tok, err := incus.ParseTrustToken(tokenText)
	if err != nil {
		return usagef("remote add %s: %v", name, err)
	}
	dir := incus.ConfigDir(c.getenv)
	addrs := []string{addr}
	if addr == "" {
		addrs = nil
		for _, a := range tok.Addresses {
			addrs = append(addrs, "https://"+a)
		}
		if len(addrs) == 0 {
			return usagef("remote add %s: the token names no address: pass --addr https://HOST:PORT", name)
		}
	}
	var rem incus.Remote
	for i, a := range addrs {
		rem, err = incus.AddRemote(c.ctx, dir, name, a, tok, c.dial)
		if err == nil || !incus.IsUnreachable(err) || i == len(addrs)-1 {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("adding remote %s: %w", name, err)
	}
	j := toRemoteJSON(rem)
	if asJSON {
		return c.printJSON(j)
	}
	fmt.Fprintf(c.out, "remote %s: %s, trusted; its certificate %s pinned in %s/servercerts/%s.crt, the client key in %s/%s (0600)\n",
		name, rem.Addr, j.Fingerprint, dir, name, dir, incus.ClientKeyFile)
	fmt.Fprintf(c.out, "box --remote %s list (or BOX_REMOTE=%s) drives it; host verbs run on its host\n", name, name)
	return nil
}

func (c *call) remoteList(asJSON bool) error {
	rs, err := incus.LoadRemotes(incus.ConfigDir(c.getenv))
	if err != nil {
		return err
	}
	out := []remoteJSON{}
	for _, n := range slices.Sorted(maps.Keys(rs)) {
		out = append(out, toRemoteJSON(rs[n]))
	}
	if asJSON {
		return c.printJSON(out)
	}
	for _, r := range out {
		fmt.Fprintf(c.out, "%-12s %-40s %s\n", r.Name, r.Addr, r.Protocol)
	}
	return nil
}

// incusTarget is how the incus CLI names the box a handover acts on:
// REMOTE:NAME, the remote always explicit, so a CLI whose default remote
// is another server never lands on that server's instance of the name.
func (c *call) incusTarget() string {
	r := c.remote
	if r == "" {
		r = incus.LocalRemote
	}
	return r + ":" + c.name()
}
