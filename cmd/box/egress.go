package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/egress"
	"github.com/box-isolation/box/stack/model"
)

// egressFlag reads box new's --egress: "" or open leaves the box open,
// allow:FILE reads an allowlist.
func egressFlag(v string) ([]string, error) {
	switch {
	case v == "" || v == model.EgressOpen:
		return nil, nil
	case strings.HasPrefix(v, "allow:"):
		path := strings.TrimPrefix(v, "allow:")
		f, err := os.Open(path)
		if err != nil {
			return nil, usagef("new: --egress %s: %v", v, err)
		}
		defer f.Close()
		names, err := model.ParseAllowlist(f)
		if err != nil {
			return nil, usagef("new: --egress %s: %v", v, err)
		}
		return names, nil
	}
	return nil, usagef("new: --egress %q: want open or allow:FILE", v)
}

// egressResult is `box egress N show --json`.
type egressResult struct {
	Box    string   `json:"box"`
	Policy string   `json:"policy"`
	Names  []string `json:"names,omitempty"`
	// Allowed are the addresses the resolver answered for the names and
	// that are still allowed (an hour after the answer, by default).
	Allowed []string `json:"allowed,omitempty"`
}

func setupEgress(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print the result as JSON")
	since := fs.Duration("since", 0, "log: only refusals this recent (e.g. 10m); all that are kept when 0")
	return func(c *call) error {
		h, err := c.host()
		if err != nil {
			return err
		}
		verb := "show"
		if len(c.args) > 1 {
			verb = c.args[1]
		}
		switch verb {
		case "show":
			if len(c.args) > 2 {
				return usagef("egress: show takes no names")
			}
			st, err := boxes.NewManager(h).Egress(c.ctx, c.name())
			if err != nil {
				return err
			}
			r := egressResult{Box: st.Box, Policy: st.Policy, Names: st.Names}
			for _, a := range st.Allowed {
				r.Allowed = append(r.Allowed, a.String())
			}
			if *asJSON {
				return c.printJSON(r)
			}
			if r.Policy == model.EgressOpen {
				fmt.Fprintf(c.out, "%s: open (the internet; nothing private)\n", r.Box)
				return nil
			}
			fmt.Fprintf(c.out, "%s: allowlist %s: %s\n", r.Box, r.Policy, strings.Join(r.Names, " "))
			if len(r.Allowed) > 0 {
				fmt.Fprintf(c.out, "allowed now: %s\n", strings.Join(r.Allowed, " "))
			} else {
				fmt.Fprintln(c.out, "allowed now: nothing yet (an address is allowed once the box's resolver answers for an allowed name)")
			}
			return nil
		case model.EgressOpen, "allow":
			var names []string
			if verb == "allow" {
				if len(c.args) < 3 {
					return usagef("egress: allow needs at least one name (box egress %s allow api.example.com)", c.name())
				}
				names = c.args[2:]
			} else if len(c.args) > 2 {
				return usagef("egress: open takes no names")
			}
			t0 := time.Now()
			ch, err := boxes.NewManager(h).SetEgress(c.ctx, c.name(), names)
			if err != nil {
				return err
			}
			if *asJSON {
				return c.printJSON(ch)
			}
			if ch.Policy == model.EgressOpen {
				fmt.Fprintf(c.out, "%s: open (%.2fs)\n", ch.Box, time.Since(t0).Seconds())
			} else {
				fmt.Fprintf(c.out, "%s: allowlist %s: %s (%.2fs)\n", ch.Box, ch.Policy, strings.Join(ch.Names, " "), time.Since(t0).Seconds())
			}
			return nil
		case "log":
			if len(c.args) > 2 {
				return usagef("egress: log takes no names")
			}
			var from time.Time
			if *since > 0 {
				from = time.Now().Add(-*since)
			}
			rs, err := boxes.NewManager(h).EgressRefusals(c.ctx, c.name(), from)
			if err != nil {
				return err
			}
			if *asJSON {
				if rs == nil {
					rs = []egress.Refusal{}
				}
				return c.printJSON(rs)
			}
			if len(rs) == 0 {
				fmt.Fprintf(c.err, "%s: nothing refused (that the log still holds)\n", c.name())
			}
			for _, r := range rs {
				fmt.Fprintln(c.out, r)
			}
			return nil
		}
		return usagef("egress: %q: want open, allow NAME..., show or log", verb)
	}
}
