package main

import (
	"errors"
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/hostns"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/templates"
)

// offline points box at a socket where nothing listens: a unit test that
// reached incusd would fail loudly instead of touching a real host.
var offline = runner{env: map[string]string{"INCUS_SOCKET": "/nonexistent/box-test.socket"}}

// The verbs (docs/box.md, "Commands").
var wantVerbs = []string{
	"new", "templates", "list", "status", "info", "shell", "exec", "tmux", "snapshot", "restore", "rename",
	"move", "down", "start", "rm", "egress", "expose", "export", "import", "incus", "doctor", "setup-host", "guard-and-serve", "watch-ports", "teardown-host", "grant", "revoke",
	"migrate-host", "remote", "completion", "man", "version", "help",
}

func TestTableIsTheTruth(t *testing.T) {
	var names, shown []string
	for _, c := range commands() {
		assert.NotContains(t, names, c.name, "listed twice")
		names = append(names, c.name)
		if !c.hidden {
			shown = append(shown, c.name)
		}
		assert.True(t, strings.HasPrefix(c.synopsis, c.name), "%s: synopsis starts with the name", c.name)
		assert.NotEmpty(t, c.help, c.name)
		require.NotNil(t, c.setup, c.name)
	}
	assert.ElementsMatch(t, wantVerbs, names, "the table lists exactly this issue's verbs")

	help := offline.run(t, "help")
	require.Equal(t, exitOK, help.code)
	var listed []string
	_, cmds, _ := strings.Cut(help.out, "Commands:\n")
	cmds, _, _ = strings.Cut(cmds, "\n\n")
	for line := range strings.SplitSeq(cmds, "\n") {
		listed = append(listed, strings.Fields(line)[0])
	}
	assert.Equal(t, shown, listed, "box help lists the table, in order, but for its hidden rows")
	for _, c := range commands() {
		// Listed: box help shows it (unless hidden), and help CMD and
		// CMD --help render its row.
		if c.hidden {
			assert.NotContains(t, help.out, "  "+c.name+" ", "box help hides %s", c.name)
		} else {
			assert.Contains(t, help.out, "  "+c.name+" ", "box help lists %s", c.name)
		}
		for _, args := range [][]string{{"help", c.name}, {c.name, "--help"}, {c.name, "-h"}} {
			r := offline.run(t, args...)
			assert.Equal(t, exitOK, r.code, "%v", args)
			assert.Contains(t, r.out, "usage: box "+c.synopsis, "%v", args)
			assert.Contains(t, r.out, c.help, "%v", args)
		}
		// Dispatched: the name reaches the command (no "unknown command").
		r := offline.run(t, c.name, "--no-such-option")
		assert.Equal(t, exitUsage, r.code, c.name)
		assert.NotContains(t, r.err, "unknown command", c.name)
		assert.Contains(t, r.err, "flag provided but not defined", c.name)
	}
	// And nothing dispatches that is not listed.
	for _, name := range []string{"ls", "remove", ""} {
		r := offline.run(t, name)
		assert.Equal(t, exitUsage, r.code, name)
		assert.Contains(t, r.err, "unknown command", name)
		assert.NotContains(t, listed, name, "help never lists %q", name)
	}
}

func TestHelpRendersPreconditionsAndOptions(t *testing.T) {
	r := offline.run(t, "help", "rm")
	assert.Contains(t, r.out, "destructive: asks on a terminal")
	assert.Contains(t, r.out, "--force")
	r = offline.run(t, "rename", "--help")
	assert.Contains(t, r.out, "and stopped (box down N)")
	r = offline.run(t, "help", "move")
	assert.Contains(t, r.out, "--target M")
	assert.Contains(t, r.out, "move a stopped box to another member")
	r = offline.run(t, "help", "new")
	for _, opt := range []string{"--name N", "--template T", "--from F", "--cpu C", "--memory M", "--disk D", "--vm", "--container", "--image I", "--json"} {
		assert.Contains(t, r.out, opt)
	}
	r = offline.run(t)
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.out, "Commands:")
}

func TestDidYouMean(t *testing.T) {
	for typo, want := range map[string]string{"lst": "list", "snapshto": "snapshot", "rnme": "rename", "setup": "setup-host", "doctr": "doctor"} {
		r := offline.run(t, typo)
		assert.Equal(t, exitUsage, r.code, typo)
		assert.Contains(t, r.err, `did you mean "`+want+`"`, typo)
	}
	r := offline.run(t, "help", "lsit")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.err, `did you mean "list"`)
}

func TestUsageErrorsNeverReachIncus(t *testing.T) {
	for _, args := range [][]string{
		{"list", "--jsn"},                // a typo'd flag is rejected ...
		{"rm", "somebox", "--forse"},     // ... wherever it stands
		{"rm", "--forse", "somebox"},     //
		{"exec", "somebox", "ls", "-la"}, // a command's own flags need "--"
		{"--json", "list"},               // options come after the command
		{"info"},                         // a box is needed
		{"info", "a", "b"},               // one box
		{"list", "extra"},                //
		{"rename", "a"},                  //
		{"restore", "a"},                 //
		{"new"},                          // --name is required
		{"new", "--name", "x", "--from", "y", "--cpu", "2"},
		{"new", "--name", "x", "--from", "y", "--template", "claude"},
		{"new", "--name", "x", "--vm", "--container"},
		{"new", "--name", "x", "--template", "nope"},
		{"new", "--name", "x", "--memory", "4"},
		{"new", "--name", "x", "--cpu", "0"},
		{"migrate-host"},
		{"migrate-host", "--all-boxes", "--retire-legacy"},
		{"list", "--", "x"},
		{"watch-ports", "extra"},
	} {
		r := offline.run(t, args...)
		assert.Equal(t, exitUsage, r.code, "%v", args)
		assert.NotContains(t, r.err, "cannot reach", "%v: a usage error is found before incusd is asked", args)
	}
	r := offline.run(t, "new", "--name", "x", "--template", "nope")
	assert.Contains(t, r.err, "available: blank")
	r = offline.run(t, "new", "--name", "x", "--from", "y", "--memory", "1GiB")
	assert.Contains(t, r.err, "--memory cannot be used with --from")
	r = offline.with("BOX_CPU", "lots").run(t, "new", "--name", "x")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.err, "BOX_CPU")
}

func TestUnreachableIncusSaysWhatToCheck(t *testing.T) {
	r := offline.run(t, "list")
	assert.Equal(t, exitFailed, r.code)
	assert.Contains(t, r.err, "/nonexistent/box-test.socket")
	assert.Contains(t, r.err, "INCUS_SOCKET")
}

func TestOptionsAnywhereAfterTheCommand(t *testing.T) {
	for _, args := range [][]string{
		{"N", "--json", "label"},
		{"--json", "N", "label"},
		{"N", "label", "--json"},
		{"N", "label", "--json", "--", "x", "--json"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "")
		pos, rest, err := parseInterspersed(fs, args)
		require.NoError(t, err, "%v", args)
		assert.Equal(t, []string{"N", "label"}, pos, "%v", args)
		assert.True(t, *asJSON, "%v", args)
		if slices.Contains(args, "--") {
			assert.Equal(t, []string{"x", "--json"}, rest, "after -- nothing is an option")
		} else {
			assert.Nil(t, rest)
		}
	}
}

func TestConfirm(t *testing.T) {
	a := &app{stdinTTY: false}
	err := a.confirm("remove box x?", "--force")
	var ue usageError
	require.ErrorAs(t, err, &ue, "no terminal: a usage refusal (exit 2)")
	assert.Contains(t, err.Error(), "--force")
	for answer, ok := range map[string]bool{"y\n": true, "yes\n": true, "n\n": false, "\n": false, "": false} {
		var e strings.Builder
		a := &app{stdinTTY: true, in: strings.NewReader(answer), err: &e}
		err := a.confirm("remove box x?", "--force")
		assert.Equal(t, ok, err == nil, "%q", answer)
		assert.Contains(t, e.String(), "remove box x? [y/N]")
	}
}

func TestHatchArgs(t *testing.T) {
	assert.Equal(t, []string{"config", "show", "b1"}, hatchArgs([]string{"config", "show"}, "b1"), "appended")
	assert.Equal(t, []string{"config", "device", "add", "b1", "d", "disk"}, hatchArgs([]string{"config", "device", "add", "{}", "d", "disk"}, "b1"), "put where {} stands")
	assert.Equal(t, []string{"file", "pull", "b1/etc/hosts", "."}, hatchArgs([]string{"file", "pull", "{}/etc/hosts", "."}, "b1"))

	for args, want := range map[string]string{
		"config show":                             "",
		"exec {} -- ls":                           "",
		"config device add {} eth1 nic":           "a device",
		"profile add {} docker":                   "a profile",
		"network attach lxdbr0 {}":                "a network",
		"config set {} security.privileged=true":  "a security.* key",
		"config set {} raw.lxc=lxc.apparmor":      "a raw.* key",
		"launch x --profile default --network br": "a profile, a network",
	} {
		assert.Equal(t, want, touchesStack(strings.Fields(args)), args)
	}
	assert.Equal(t, `incus exec b1 -- sh -c 'echo $HOME' '{}'`, shellQuote([]string{"incus", "exec", "b1", "--", "sh", "-c", "echo $HOME", "{}"}))
}

func TestLookupPasswd(t *testing.T) {
	passwd := "root:x:0:0:root:/root:/bin/sh\nbox:x:1000:1000::/home/box:/bin/sh\ndev:x:1001:1002:box user:/home/dev:/bin/sh\n"
	u, ok := lookupPasswd(passwd, "dev")
	require.True(t, ok)
	assert.Equal(t, boxUser{name: "dev", uid: 1001, gid: 1002, home: "/home/dev"}, u)
	_, ok = lookupPasswd(passwd, "claude")
	assert.False(t, ok)
	_, ok = lookupPasswd("dev:x:notanumber:1::/:/bin/sh\n", "dev")
	assert.False(t, ok)
}

func TestVersion(t *testing.T) {
	r := offline.run(t, "version")
	assert.Equal(t, exitOK, r.code)
	assert.Equal(t, "box "+version+"\n", r.out)
	r = offline.run(t, "version", "--json")
	assert.JSONEq(t, `{"version":"`+version+`"}`, r.out)
}

func TestTemplatesList(t *testing.T) {
	r := offline.run(t, "templates")
	require.Equal(t, exitOK, r.code)
	names, err := templates.Names()
	require.NoError(t, err)
	for _, n := range names {
		assert.Contains(t, r.out, n)
	}
	assert.Contains(t, r.out, "blank (default)")
	r = offline.run(t, "templates", "--json")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.out, `"name": "claude"`)
}

func TestInfoRendersBoxesMintedBeforeTheStamps(t *testing.T) {
	var out strings.Builder
	printInfo(&out, infoResult{Box: &stack.Box{Name: "old", Status: "Stopped", Type: "container", Generation: "legacy", Stamps: map[string]string{}}})
	assert.Contains(t, out.String(), "template:")
	assert.Regexp(t, `(?m)^template: +-$`, out.String())
	assert.Regexp(t, `(?m)^origin: +-$`, out.String())
	assert.Contains(t, out.String(), "snapshots: none")
}

func TestStatusLine(t *testing.T) {
	sub := netip.MustParsePrefix("10.88.0.0/24")
	for _, tc := range []struct {
		name string
		v    *stack.Verification
		err  error
		ok   bool
		line string
	}{
		{"healthy", &stack.Verification{Subnet: sub, BridgeMode: nft.ModePortSet, Ports: []hostns.Port{{Name: "v1", Isolated: true}}, WatcherPID: 42}, nil, true, "stack: ok: subnet 10.88.0.0/24, bridge drop port-set, 1 port(s) isolated, port watcher pid 42"},
		{"advisory only", &stack.Verification{Subnet: sub, BridgeMode: nft.ModeBridgeMeta, Findings: []model.Finding{{Advisory: true}}}, nil, true, "no port watcher needed"},
		{"findings", &stack.Verification{Subnet: sub, Findings: []model.Finding{{Layer: "L-ACL"}, {Layer: model.LayerFleet}}}, nil, false, "stack: 2 finding(s): box doctor names them"},
		{"no stack", &stack.Verification{Findings: []model.Finding{{Layer: "L-NAT"}}}, nil, false, "stack: not set up: run box setup-host"},
		{"no daemon", nil, errors.New("cannot reach incusd"), false, "stack: unknown: cannot reach incusd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := statusOf(tc.v, tc.err)
			assert.Equal(t, tc.ok, st.OK)
			assert.Contains(t, st.Line, tc.line)
		})
	}
}

// On a cluster, list has a MEMBER column and info a member line; off a
// cluster neither.
func TestListAndInfoNameTheMember(t *testing.T) {
	yes := true
	boxes := []stack.Box{
		{Name: "a", Status: "Running", Type: "container", Member: "m1", OnStack: &yes, Stamps: map[string]string{}},
		{Name: "b", Status: "Stopped", Type: "container", Member: "m2", OnStack: &yes, Stamps: map[string]string{}},
	}
	var out, errw strings.Builder
	c := &call{app: &app{out: &out, err: &errw}}
	require.NoError(t, c.printBoxes(boxes, nil))
	assert.Regexp(t, `(?m)^NAME +STATUS +TYPE +MEMBER +STACK `, out.String())
	assert.Regexp(t, `(?m)^b +Stopped +container +m2 +on `, out.String())

	out.Reset()
	for i := range boxes {
		boxes[i].Member = ""
	}
	require.NoError(t, c.printBoxes(boxes, nil))
	assert.NotContains(t, out.String(), "MEMBER")
	assert.Regexp(t, `(?m)^a +Running +container +on `, out.String())

	out.Reset()
	printInfo(&out, infoResult{Box: &stack.Box{Name: "a", Member: "m2", Stamps: map[string]string{}}})
	assert.Regexp(t, `(?m)^member: +m2$`, out.String())
	out.Reset()
	printInfo(&out, infoResult{Box: &stack.Box{Name: "a", Stamps: map[string]string{}}})
	assert.NotContains(t, out.String(), "member:")
}
