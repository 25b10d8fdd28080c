package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// The man page and the completions come from the table: every command
// shown, and its subcommands, have an entry; hidden ones have none.
func TestManAndCompletion(t *testing.T) {
	code, page, _ := runCLI("man")
	require.Equal(t, exitOK, code)
	assert.Contains(t, page, ".TH DRILL 1 ")
	roff := func(s string) string { return strings.ReplaceAll(s, "-", `\-`) }
	for _, c := range commands() {
		entry := "\n.B drill " + roff(c.synopsis) + "\n"
		if c.hidden {
			assert.NotContains(t, page, "\n.B drill "+c.name)
			continue
		}
		assert.Contains(t, page, entry)
		for _, sc := range c.sub {
			if !sc.hidden {
				assert.Contains(t, page, "\n.B drill "+roff(sc.synopsis)+"\n")
			}
		}
	}
	assert.NotContains(t, page, "world serve")
	assert.NotContains(t, page, "world incus-user")
	assert.Contains(t, page, ".BI \\-\\-canary \" CANARY\"\n")

	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, out, errOut := runCLI("completion", sh)
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, "completion for drill")
		assert.Contains(t, out, "C-SIBLING", "claim ids complete for --claim")
		assert.NotContains(t, out, "serve")
	}
}

// drill's bash completion, sourced in bash as on TAB: subcommands,
// their flags, and the values --mutate and --claim take.
func TestBashCompletion(t *testing.T) {
	bash := tier.Tool(t, "bash", "bash")
	code, script, _ := runCLI("completion", "bash")
	require.Equal(t, exitOK, code)
	file := filepath.Join(t.TempDir(), "drill.bash")
	require.NoError(t, os.WriteFile(file, []byte(script), 0o644))
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{"drill w", []string{"world"}},
		{"drill world ", []string{"up", "down", "status", "image", "check"}},
		{"drill world up --n", []string{"--name", "--no-incus"}},
		{"drill run --mutate p", []string{"pinning", "port-isolation", "privileged"}},
		{"drill run --claim C-SI", []string{"C-SIBLING"}},
		{"drill run --json --skip C-E", []string{"C-EGRESS", "C-EXPOSE"}},
		{"drill help wo", []string{"world"}},
		{"drill ma", nil},
	} {
		// The word being completed comes in as $2 (it may be empty).
		words := strings.Split(tc.words, " ")
		last := words[len(words)-1]
		src := `source "$1" || exit 9
COMP_WORDS=(` + strings.Join(words[:len(words)-1], " ") + ` "$2")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_drill
printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", src, "bash", file, last).CombinedOutput()
		require.NoError(t, err, "%s", out)
		got := strings.Fields(string(out))
		if len(got) == 0 {
			got = nil
		}
		assert.Equal(t, tc.want, got, tc.words)
	}
}
