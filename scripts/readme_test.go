package scripts_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeListsEveryPackage holds the README's layout table to the tree:
// every package `go list ./...` names is in it, and it names none that is
// not there.
func TestReadmeListsEveryPackage(t *testing.T) {
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	require.NoError(t, err)
	const mod = "github.com/box-isolation/box/"
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		pkgs = append(pkgs, strings.TrimPrefix(p, mod))
	}
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(b), "## Layout")
	require.True(t, ok, "the README has a Layout section")
	table, _, _ = strings.Cut(table, "\n## ")
	var listed []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.Split(line, "|")[1]
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cell, -1) {
			listed = append(listed, m[1])
		}
	}
	slices.Sort(pkgs)
	slices.Sort(listed)
	assert.Equal(t, pkgs, listed, "README.md's layout table lists every package of the tree, and nothing else")
}
