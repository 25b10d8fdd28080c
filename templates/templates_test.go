package templates

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuiltinNames(t *testing.T) {
	all, err := Builtin()
	require.NoError(t, err)
	var names []string
	for _, tp := range all {
		names = append(names, tp.Name)
	}
	require.Equal(t, []string{"blank", "claude", "codex", "grok"}, names)

	listed, err := Names()
	require.NoError(t, err)
	require.Equal(t, names, listed)
}

func TestDefaultIsBlank(t *testing.T) {
	require.Equal(t, "blank", Default)
	tp, err := Get(Default)
	require.NoError(t, err)
	require.Nil(t, tp.Agent, "the default template installs no agent")
	require.Equal(t, "dev", tp.User)
}

func TestBuiltinAgents(t *testing.T) {
	for _, tc := range []struct {
		name, pkg, command, contextFile string
	}{
		{"claude", "@anthropic-ai/claude-code", "claude", "~/.claude/CLAUDE.md"},
		{"codex", "@openai/codex", "codex", "~/.codex/AGENTS.md"},
		{"grok", "@vibe-kit/grok-cli", "grok", "~/.grok/AGENTS.md"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := Get(tc.name)
			require.NoError(t, err)
			require.NotNil(t, tp.Agent)
			require.NotEmpty(t, tp.Agent.Name)
			require.Equal(t, tc.pkg, tp.Agent.Package)
			require.Equal(t, tc.command, tp.Agent.Command)
			require.Equal(t, tc.contextFile, tp.Agent.ContextFile)
			require.Equal(t, "/home/dev/"+strings.TrimPrefix(tc.contextFile, "~/"), tp.ContextPath())
			require.NotEmpty(t, tp.Image)
			require.NoError(t, tp.Resources.Validate())
		})
	}
}

// nesting is a typed choice (the stack turns it into the instance keys it
// stands for); no built-in template asks for it.
func TestNesting(t *testing.T) {
	tp, err := Parse("t", []byte(validYAML+"nesting: true\n"))
	require.NoError(t, err)
	require.True(t, tp.Nesting)
	tp, err = Parse("t", []byte(validYAML))
	require.NoError(t, err)
	require.False(t, tp.Nesting, "off unless asked for")
	for _, bad := range []string{"nesting: \"true\"\n", "nesting: [docker]\n", "nesting:\n  security.nesting: true\n"} {
		_, err := Parse("t", []byte(validYAML+bad))
		require.ErrorContains(t, err, `template "t"`, bad)
	}
	all, err := Builtin()
	require.NoError(t, err)
	for _, b := range all {
		require.False(t, b.Nesting, "%s: nesting costs something (docs/box.md): the operator asks for it", b.Name)
	}
}

func TestGetUnknownListsAvailable(t *testing.T) {
	_, err := Get("claud")
	require.ErrorContains(t, err, `unknown template "claud"`)
	require.ErrorContains(t, err, "available: blank, claude, codex, grok")
}

// validYAML is a complete agent template; the tests below change one thing.
const validYAML = `description: A test template.
image: images:debian/12/cloud
user: dev
resources:
  cpu: "2"
  memory: 4GiB
  disk: 20GiB
agent:
  name: Test Agent
  package: "@example/agent"
  command: agent
  context_file: ~/.agent/AGENTS.md
`

func TestParseValid(t *testing.T) {
	tp, err := Parse("t", []byte(validYAML))
	require.NoError(t, err)
	require.Equal(t, "t", tp.Name)
	require.Equal(t, Resources{CPU: "2", Memory: "4GiB", Disk: "20GiB"}, tp.Resources)
	require.Equal(t, &Agent{Name: "Test Agent", Package: "@example/agent", Command: "agent", ContextFile: "~/.agent/AGENTS.md"}, tp.Agent)

	// An unquoted number is still the string Incus takes.
	tp, err = Parse("t", []byte(strings.Replace(validYAML, `cpu: "2"`, "cpu: 4", 1)))
	require.NoError(t, err)
	require.Equal(t, "4", tp.Resources.CPU)
}

// The type has no field for anything that could move a box off the
// isolation stack, so naming one is an unknown key, not a silent no-op.
func TestUnknownKeyRefused(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, key string
	}{
		{"network", validYAML + "network: lxdbr0\n", "network"},
		{"profiles", validYAML + "profiles: [default]\n", "profiles"},
		{"devices", validYAML + "devices:\n  eth0:\n    type: nic\n    nictype: bridged\n", "devices"},
		{"security.privileged", validYAML + "security.privileged: \"true\"\n", "security.privileged"},
		{"security mapping", validYAML + "security:\n  privileged: true\n", "security"},
		{"config", validYAML + "config:\n  security.nesting: \"true\"\n", "config"},
		{"raw.lxc", validYAML + "raw.lxc: lxc.apparmor.profile=unconfined\n", "raw.lxc"},
		{"name", validYAML + "name: claude\n", "name"},
		{"nested in resources", strings.Replace(validYAML, "  disk: 20GiB\n", "  disk: 20GiB\n  gpu: \"1\"\n", 1), "resources.gpu"},
		{"nested in agent", validYAML + "  token: sk-123\n", "agent.token"},
		{"typo", strings.Replace(validYAML, "description:", "descripton:", 1), "descripton"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t", []byte(tc.yaml))
			require.Error(t, err)
			require.ErrorContains(t, err, `template "t"`)
			require.ErrorContains(t, err, `unknown key "`+tc.key+`"`)
		})
	}
}

func TestBadTemplateRefused(t *testing.T) {
	replace := func(old, new string) string {
		t.Helper()
		require.Contains(t, validYAML, old)
		return strings.Replace(validYAML, old, new, 1)
	}
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"empty", "", "empty"},
		{"not a mapping", "- a\n- b\n", "must be a mapping"},
		{"two documents", validYAML + "---\n" + validYAML, "more than one YAML document"},
		{"duplicate key", validYAML + "user: other\n", "already defined"},
		{"alias", strings.Replace(replace("resources:\n", "resources: &r\n"), "agent:\n  name: Test Agent\n  package: \"@example/agent\"\n  command: agent\n  context_file: ~/.agent/AGENTS.md\n", "agent: *r\n", 1), "aliases are not allowed"},
		{"no description", replace("description: A test template.\n", ""), "description is missing"},
		{"no image", replace("image: images:debian/12/cloud\n", ""), "image is missing"},
		{"image with space", replace("images:debian/12/cloud", `"images:debian 12"`), "image"},
		{"no user", replace("user: dev\n", ""), "user is missing"},
		{"user uppercase", replace("user: dev", "user: Dev"), "not a valid Unix user name"},
		{"user with space", replace("user: dev", `user: "dev user"`), "not a valid Unix user name"},
		{"user root", replace("user: dev", "user: root"), "system account"},
		{"no resources", replace("resources:\n  cpu: \"2\"\n  memory: 4GiB\n  disk: 20GiB\n", ""), "cpu is missing"},
		{"cpu zero", replace(`cpu: "2"`, `cpu: "0"`), `cpu "0"`},
		{"cpu negative", replace(`cpu: "2"`, `cpu: "-1"`), `cpu "-1"`},
		{"cpu word", replace(`cpu: "2"`, `cpu: two`), `cpu "two"`},
		{"cpu range", replace(`cpu: "2"`, `cpu: 0-3`), `cpu "0-3"`},
		{"memory no unit", replace("memory: 4GiB", `memory: "4"`), `size "4"`},
		{"memory G", replace("memory: 4GiB", "memory: 4G"), `size "4G"`},
		{"memory lowercase", replace("memory: 4GiB", "memory: 4gib"), `size "4gib"`},
		{"memory percent", replace("memory: 4GiB", "memory: 50%"), `size "50%"`},
		{"memory tiny", replace("memory: 4GiB", "memory: 1MiB"), "below the 128MiB"},
		{"disk missing", replace("  disk: 20GiB\n", ""), "disk is missing"},
		{"disk tiny", replace("disk: 20GiB", "disk: 100MB"), "below the 1GiB"},
		{"disk huge", replace("disk: 20GiB", "disk: 99999999999999999999TiB"), "too large"},
		{"agent without package", replace("  package: \"@example/agent\"\n", ""), "missing package"},
		{"agent empty", replace("agent:\n  name: Test Agent\n  package: \"@example/agent\"\n  command: agent\n  context_file: ~/.agent/AGENTS.md\n", "agent: {}\n"), "missing name, package, command, context_file"},
		{"package with shell", replace(`"@example/agent"`, `"@example/agent; rm -rf /"`), "not an npm package name"},
		{"command with path", replace("command: agent", "command: /usr/bin/agent"), "bare command name"},
		{"context absolute", replace("~/.agent/AGENTS.md", "/etc/AGENTS.md"), "must be under ~/"},
		{"context escapes home", replace("~/.agent/AGENTS.md", "~/../root/AGENTS.md"), `segment ".."`},
		{"context is home", replace("~/.agent/AGENTS.md", "~/"), "clean file path"},
		{"context with space", replace("~/.agent/AGENTS.md", `"~/my agent/AGENTS.md"`), "not allowed"},
		{"wrong type", replace("user: dev", "user: [dev]"), "decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t", []byte(tc.yaml))
			require.Error(t, err)
			require.ErrorContains(t, err, `template "t"`)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestParseBadName(t *testing.T) {
	for _, name := range []string{"", "Claude", "1x", "a/b", "a b", strings.Repeat("a", 33)} {
		_, err := Parse(name, []byte(validYAML))
		require.ErrorContains(t, err, "template name", "name %q", name)
	}
}
