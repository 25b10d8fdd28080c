package main

import (
	"flag"

	"github.com/box-isolation/box/internal/clidoc"
	"github.com/box-isolation/box/stack/bootunits"
	"github.com/box-isolation/box/templates"
)

// boxNames prints the boxes' names, one a line, from `box list --json`
// (the stable interface), for the completions: quiet, and bounded in time,
// when incusd is not there.
const boxNames = `timeout 5 box list --json 2>/dev/null | grep -o '"name"[[:space:]]*:[[:space:]]*"[^"]*"' | cut -d'"' -f4`

// program is the command table as the man page and the completions see
// it: the commands that are shown, with their flags.
func program() clidoc.Program {
	var cmds []clidoc.Command
	for _, c := range commands() {
		if c.hidden {
			continue
		}
		values := map[string][]string{}
		for name, f := range c.flagValues {
			values[name] = f()
		}
		d := clidoc.Command{Name: c.name, Synopsis: c.synopsis, Help: c.help, Arg: c.arg, Values: c.values,
			Flags: clidoc.FlagsOf(c.flags(), c.boxFlags, values)}
		if c.box != noBox {
			d.Arg = clidoc.ArgName
		}
		cmds = append(cmds, d)
	}
	return clidoc.Program{
		Name:    "box",
		Summary: "trust-less, network-isolated Incus boxes for coding agents",
		Version: version,
		Description: []string{
			"box mints boxes: Incus instances with a coding agent's CLI installed but unauthenticated, from a template (blank, claude, codex, grok). " +
				"A box reaches the public internet and nothing else: not the host, not the LAN, not another box. " +
				"Authenticated state is reused through snapshots and clones, never through a secrets store.",
			"Every command that takes a box N resolves it through box's ownership tag (user.box=1) and refuses an instance box did not mint. " +
				"Options come after the command; every command takes --help. Output is plain text, with --json where offered as the stable interface.",
			"box setup-host (as root) builds the isolation stack once per host: the bridge boxnet, the profile box-net, the network ACL box-isolate, " +
				"the nft tables inet box and bridge box, and the boot units " + bootunits.BootUnitName + " and " + bootunits.DaemonUnitName + ". box doctor checks it; box teardown-host removes it.",
		},
		Commands: cmds,
		Names:    boxNames,
		Sections: []clidoc.Section{
			{Title: "Exit status", Paragraphs: []string{"0 ok; 1 it went wrong; 2 you asked wrong (usage). box exec exits with its command's code."}},
			{Title: "Environment", Paragraphs: []string{
				"BOX_REMOTE (or box --remote NAME COMMAND): the incus CLI's remote to drive over HTTPS, with the client certificate in INCUS_CONF (client.key mode 0600); local is this machine. Host verbs refuse a remote.",
				"INCUS_SOCKET, INCUS_DIR: where incusd's socket is (default /var/lib/incus/unix.socket).",
				"BOX_SUBNET, BOX_DNS, BOX_POOL: the isolation stack's subnet, upstream resolvers and storage pool.",
				"BOX_NETNS: the network namespace incusd's bridges live in (the hermetic world's).",
				"BOX_MEMBER_NETNS: on an Incus cluster, member=namespace pairs for the other members this machine can enter (the hermetic world's), whose host layers box then reads and refreshes too.",
				"BOX_IMAGE, BOX_CPU, BOX_MEMORY, BOX_DISK: defaults for box new, between the template's and the flags.",
				"INCUS_CONF (else $HOME/.config/incus): the incus CLI's config directory, whose remotes (config.yml, servercerts/NAME.crt) name the image server of an image REMOTE:ALIAS; without one, images is the public image server.",
			}},
			{Title: "Files", Paragraphs: []string{
				"/etc/systemd/system/" + bootunits.BootUnitName + ", /etc/systemd/system/" + bootunits.DaemonUnitName +
					": written and enabled by box setup-host on systemd hosts; they re-apply the firewall at boot and run box guard-and-serve.",
			}},
			{Title: "See also", Paragraphs: []string{"drill(1), incus(1)"}},
		},
	}
}

// templateNames are the built-in templates, for --template's completion.
func templateNames() []string {
	names, _ := templates.Names()
	return names
}

func setupCompletion(fs *flag.FlagSet) action {
	return func(c *call) error {
		if err := clidoc.Completion(c.out, program(), c.args[0]); err != nil {
			return usagef("%v", err)
		}
		return nil
	}
}

func setupMan(fs *flag.FlagSet) action {
	return func(c *call) error { return clidoc.Man(c.out, program()) }
}
