package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func runCLI(args ...string) (code int, out, errOut string) {
	var o, e bytes.Buffer
	code = run(args, strings.NewReader(""), &o, &e)
	return code, o.String(), e.String()
}

func TestHelpListsEveryCommand(t *testing.T) {
	code, out, _ := runCLI("help")
	assert.Equal(t, exitOK, code)
	for _, c := range commands() {
		assert.Contains(t, out, "  "+c.name+" ")
		hcode, hout, _ := runCLI("help", c.name)
		assert.Equal(t, exitOK, hcode)
		assert.Contains(t, hout, "usage: drill "+c.synopsis)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"wrold"}, exitUsage, `did you mean "world"`},
		{[]string{"help", "verison"}, exitUsage, `did you mean "version"`},
		{[]string{"world"}, exitUsage, "usage: drill world up"},
		{[]string{"world", "sideways"}, exitUsage, "unknown subcommand"},
		{[]string{"world", "up", "--bridge-netfiter"}, exitUsage, "flag provided but not defined"},
		{[]string{"world", "status", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"world", "serve"}, exitUsage, "--state is required"},
		{[]string{"run", "--canary", "1.1.1.1:443"}, exitUsage, "--canary goes with --host"},
		{[]string{"run", "--claim", "C-NOPE"}, exitUsage, `"C-NOPE" matches no claim`},
		{[]string{"run", "--mutate", "gravity"}, exitUsage, `no mutation "gravity"`},
	} {
		code, out, errOut := runCLI(tc.args...)
		assert.Equal(t, tc.code, code, "%v", tc.args)
		assert.Contains(t, out+errOut, tc.want, "%v", tc.args)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI("version")
	assert.Equal(t, exitOK, code)
	assert.Equal(t, "drill dev\n", out)
}
