package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/box-isolation/box/internal/accounts"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/access"
	"github.com/box-isolation/box/stack/model"
)

// The access tier verbs (admin only): grant and revoke a local user boxes
// of their own through incus-user.

func setupGrant(fs *flag.FlagSet) action {
	group := fs.String("group", "", "the group incus-user serves (default $BOX_TIER_GROUP, else incus)")
	asJSON := fs.Bool("json", false, "print what the grant did as JSON")
	return func(c *call) error {
		u, h, err := tierTarget(c, *group)
		if err != nil {
			return err
		}
		res, err := access.NewManager(h).Grant(c.ctx, access.GrantRequest{User: u, Group: *group})
		if err != nil {
			return err
		}
		if *asJSON {
			return c.printJSON(res)
		}
		printDid(c, res.Did)
		if len(res.RestartedIncusUser) > 0 {
			fmt.Fprintf(c.err, "box: restarted incus-user (ended pid %v; socket activation starts a fresh one)\n", res.RestartedIncusUser)
		}
		state := "granted"
		if len(res.Did) == 0 {
			state = "already granted; nothing changed"
		}
		fmt.Fprintf(c.out, "%s (uid %d): %s. Project %s, on %s only (incus-user's private bridge %s is not allowed); %s reaches it through %s as a member of group %s.\n",
			res.User, res.UID, state, res.Project, model.Current.Network, res.Bridge, res.User, h.Tier.Socket(h.Incus), res.Group)
		fmt.Fprintf(c.out, "Sessions %s opened before the grant lack the group: they log in again to use box.\n", res.User)
		return nil
	}
}

func setupRevoke(fs *flag.FlagSet) action {
	purge := fs.Bool("purge", false, "end the user's sessions, then delete their project, boxes, private bridge and trusted certificate")
	group := fs.String("group", "", "the group incus-user serves (default $BOX_TIER_GROUP, else incus)")
	asJSON := fs.Bool("json", false, "print what the revoke did as JSON")
	return func(c *call) error {
		u, h, err := tierTarget(c, *group)
		if err != nil {
			return err
		}
		res, err := access.NewManager(h).Revoke(c.ctx, u, *group, *purge)
		var left *access.SessionsLeftError
		if errors.As(err, &left) {
			if res != nil {
				printDid(c, res.Did) // the group membership went
			}
			return err
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return c.printJSON(res)
		}
		printDid(c, res.Did)
		if *purge {
			fmt.Fprintf(c.out, "%s (uid %d): purged. No project, box, private bridge or trusted certificate of theirs is left, and incus-user will not set uid %d up again until box grant.\n", res.User, res.UID, res.UID)
			return nil
		}
		fmt.Fprintf(c.out, "%s (uid %d): revoked. Project %s and its boxes are kept (box revoke --purge %s deletes them).\n", res.User, res.UID, res.Project, res.User)
		// Supplementary groups are read at login: what already runs keeps
		// the group, and so the socket.
		var pids []string
		for _, p := range res.Held {
			pids = append(pids, fmt.Sprintf("%d (%s)", p.PID, p.Command))
		}
		held := "none now"
		if len(pids) > 0 {
			held = strings.Join(pids, ", ")
		}
		fmt.Fprintf(c.err, "box: warning: sessions %s already holds keep the group, and so incus-user's socket, until they end (processes: %s). End them with: loginctl terminate-user %s (where logind runs), or box revoke --purge %s\n",
			res.User, held, res.User, res.User)
		return nil
	}
}

// tierTarget resolves the user a tier verb names and the host it acts on.
func tierTarget(c *call, group string) (accounts.User, *stack.Host, error) {
	u, err := accounts.Lookup(c.args[0])
	if err != nil {
		return accounts.User{}, nil, usagef("%v", err)
	}
	h, err := c.host()
	if err != nil {
		return accounts.User{}, nil, err
	}
	if group != "" {
		h.Tier.Group = group
	}
	return u, h, nil
}

// printDid says what a tier verb did, one step a line.
func printDid(c *call, did []string) {
	for _, d := range did {
		fmt.Fprintln(c.out, d)
	}
}
