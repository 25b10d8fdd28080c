package clidoc

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/testenv/tier"
)

// tool is a program with every kind of argument the renderers know.
func tool() Program {
	fs := flag.NewFlagSet("new", flag.ContinueOnError)
	fs.String("name", "", "the new thing's name")
	fs.String("from", "", "copy this thing")
	fs.String("color", "red", "its colour [red or blue]")
	fs.Bool("json", false, "print JSON")
	up := flag.NewFlagSet("up", flag.ContinueOnError)
	up.Bool("fast", false, "don't wait")
	up.String("alias", "x", "alias it")
	return Program{
		Name: "my-tool", Summary: "does things", Version: "1.2",
		Description: []string{"It does things.", ".dot at the start, and a back\\slash"},
		Names:       `printf '%s\n' alpha beta`,
		Commands: []Command{
			{Name: "new", Synopsis: "new --name N [--from T]", Help: "make a thing", Flags: FlagsOf(fs, []string{"from"}, map[string][]string{"color": {"red", "blue"}})},
			{Name: "rm", Synopsis: "rm N", Help: "remove a thing", Arg: ArgName, Flags: FlagsOf(flag.NewFlagSet("rm", 0), nil, nil)},
			{Name: "world", Synopsis: "world up|down", Help: "the world", Sub: []Command{
				{Name: "up", Synopsis: "world up [--fast]", Help: "bring it up", Flags: FlagsOf(up, nil, nil)},
				{Name: "down", Synopsis: "world down", Help: "take it down"},
			}},
			{Name: "completion", Synopsis: "completion SHELL", Help: "print a completion script", Arg: ArgValues, Values: Shells},
			{Name: "help", Synopsis: "help [COMMAND]", Help: "show help", Arg: ArgCommand},
		},
		Sections: []Section{{Title: "exit status", Paragraphs: []string{"0 ok."}}},
	}
}

func TestFlagsOf(t *testing.T) {
	got := tool().Commands[0].Flags
	assert.Equal(t, []Flag{
		{Name: "color", Usage: "its colour [red or blue]", Default: "red", Value: "COLOR", Arg: ArgValues, Values: []string{"red", "blue"}},
		{Name: "from", Usage: "copy this thing", Value: "FROM", Arg: ArgName},
		{Name: "json", Usage: "print JSON"},
		{Name: "name", Usage: "the new thing's name", Value: "NAME"},
		{Name: "help", Usage: "show the command's usage and options"},
	}, got)
}

func TestUnknownShell(t *testing.T) {
	err := Completion(&bytes.Buffer{}, tool(), "tcsh")
	require.Error(t, err)
	assert.Equal(t, `no completion for shell "tcsh": one of bash, zsh, fish`, err.Error())
}

// complete sources script in bash, sets COMP_WORDS to words (the last is
// the word being completed) and calls fn; it returns COMPREPLY.
func complete(t *testing.T, script []byte, fn string, words ...string) []string {
	t.Helper()
	bash := tier.Tool(t, "bash", "bash")
	file := filepath.Join(t.TempDir(), "completion.bash")
	require.NoError(t, os.WriteFile(file, script, 0o644))
	var quoted []string
	for _, w := range words {
		quoted = append(quoted, shq(w))
	}
	src := `source "$1" || exit 9
COMP_WORDS=(` + strings.Join(quoted, " ") + `)
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
` + fn + `
printf '%s\n' "${COMPREPLY[@]}"`
	out, err := exec.Command(bash, "--norc", "--noprofile", "-c", src, "bash", file).CombinedOutput()
	require.NoError(t, err, "%s", out)
	if got := strings.Fields(string(out)); len(got) > 0 {
		return got
	}
	return nil
}

func TestBashCompletion(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, Completion(&b, tool(), "bash"))
	script := b.Bytes()
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"my-tool", ""}, []string{"new", "rm", "world", "completion", "help", "--help"}},
		{[]string{"my-tool", "n"}, []string{"new"}},
		{[]string{"my-tool", "rm", ""}, []string{"alpha", "beta"}},
		{[]string{"my-tool", "rm", "b"}, []string{"beta"}},
		{[]string{"my-tool", "rm", "alpha", ""}, nil},
		{[]string{"my-tool", "rm", "--"}, []string{"--help"}},
		{[]string{"my-tool", "new", "--"}, []string{"--color", "--from", "--json", "--name", "--help"}},
		{[]string{"my-tool", "new", "--from", ""}, []string{"alpha", "beta"}},
		{[]string{"my-tool", "new", "--color", ""}, []string{"red", "blue"}},
		{[]string{"my-tool", "new", "--name", ""}, nil},
		{[]string{"my-tool", "new", "--name", "x", "--j"}, []string{"--json"}},
		{[]string{"my-tool", "world", ""}, []string{"up", "down"}},
		{[]string{"my-tool", "world", "up", "--"}, []string{"--alias", "--fast", "--help"}},
		{[]string{"my-tool", "world", "up", "--alias", "a", ""}, nil},
		{[]string{"my-tool", "completion", ""}, []string{"bash", "zsh", "fish"}},
		{[]string{"my-tool", "help", "w"}, []string{"world"}},
		{[]string{"my-tool", "rm", "alpha", "--", ""}, nil},
	} {
		assert.Equal(t, tc.want, complete(t, script, "_my_tool", tc.words...), "%q", tc.words)
	}
}

// zsh and fish are not installed here; their scripts are checked for the
// table's content, and with the shell where there is one.
func TestZshAndFishCompletion(t *testing.T) {
	for _, tc := range []struct {
		shell string
		want  []string
	}{
		{"zsh", []string{"#compdef my-tool\n", "_my_tool_names() {", `'new:make a thing'`,
			`'--color[its colour \[red or blue\]]:color:(red blue)'`, `'--from[copy this thing]:from:_my_tool_names'`,
			`'1:name:_my_tool_names'`, "world) _my_tool_world ;;", "_my_tool_world() {", `'up:bring it up'`,
			`'1:value:(bash zsh fish)'`, "compdef _my_tool my-tool"}},
		{"fish", []string{"function __my_tool_names", `complete -c my-tool -n '__my_tool_at ""' -f -a 'new' -d 'make a thing'`,
			`complete -c my-tool -n '__my_tool_at new' -l from -x -a '(__my_tool_names)' -d 'copy this thing'`,
			`complete -c my-tool -n '__my_tool_at new' -l name -r -d 'the new thing\'s name'`,
			`complete -c my-tool -n '__my_tool_at rm 0' -f -a '(__my_tool_names)'`,
			`complete -c my-tool -n '__my_tool_at world 0' -f -a 'up' -d 'bring it up'`,
			`complete -c my-tool -n '__my_tool_at world.up' -l fast -d`,
			"set -l parents world\n", "set -l valued new:color new:from new:name world.up:alias\n"}},
	} {
		var b bytes.Buffer
		require.NoError(t, Completion(&b, tool(), tc.shell))
		for _, w := range tc.want {
			assert.Contains(t, b.String(), w, tc.shell)
		}
		t.Run(tc.shell+" parses it", func(t *testing.T) {
			sh := tier.Tool(t, tc.shell, tc.shell) // Debian's packages are named after the shells
			flag := "-n"
			if tc.shell == "fish" {
				flag = "--no-execute"
			}
			out, err := exec.Command(sh, flag, "-c", b.String()).CombinedOutput()
			assert.NoError(t, err, "%s", out)
		})
	}
}

func TestMan(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, Man(&b, tool()))
	page := b.String()
	for _, w := range []string{
		`.TH MY-TOOL 1 "" "my\-tool 1.2" "User Commands"`,
		".SH NAME\nmy\\-tool \\- does things\n",
		"\\&.dot at the start, and a back\\eslash\n",
		".B my\\-tool new \\-\\-name N [\\-\\-from T]\nmake a thing\n",
		".BI \\-\\-color \" COLOR\"\nits colour [red or blue] (default red)\n",
		".B \\-\\-json\nprint JSON\n",
		".B my\\-tool world up [\\-\\-fast]\nbring it up\n",
		".B my\\-tool world down\ntake it down\n",
		".SH \"EXIT STATUS\"\n0 ok.\n",
	} {
		assert.Contains(t, page, w)
	}
	assert.NotContains(t, page, "\\-\\-help", "--help is on every command: not an option worth a line")

	t.Run("groff renders it without a warning", func(t *testing.T) {
		cmd := exec.Command(tier.Tool(t, "groff", "groff-base"), "-man", "-Tutf8", "-ww", "-rLL=80n")
		cmd.Stdin = strings.NewReader(page)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		require.NoError(t, cmd.Run(), errOut.String())
		assert.Empty(t, errOut.String(), "groff warns")
		assert.Contains(t, out.String(), "make a thing")
	})
}
