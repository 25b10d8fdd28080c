package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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

// mdLink is an inline markdown link's target (`[text](target)`) or a
// reference definition's (`[label]: target`).
var mdLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)|(?m)^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)`)

// repoFiles lists the repository's files (tracked, and new ones not
// ignored) relative to its root, with the root's absolute path.
func repoFiles(t *testing.T) (string, []string) {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "git ls-files (the test needs git and the repository)")
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, f)); err == nil {
			files = append(files, f)
		}
	}
	require.NotEmpty(t, files)
	return root, files
}

// mdLinks is every link target of a markdown text, outside fenced and
// indented code blocks and inline code.
func mdLinks(text string) []string {
	var prose strings.Builder
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced || strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
			continue
		}
		prose.WriteString(regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "") + "\n")
	}
	var out []string
	for _, m := range mdLink.FindAllStringSubmatch(prose.String(), -1) {
		out = append(out, m[1]+m[2])
	}
	return out
}

// external reports whether a link target leaves the repository by design:
// a URL with a scheme (https, mailto, ...).
func external(target string) bool {
	return regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`).MatchString(target)
}

// headingAnchors is the anchors a renderer such as GitHub's gives a
// markdown file's headings: lower case, punctuation dropped, spaces to
// hyphens, a repeated one suffixed -1, -2, ...
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}_ -]`)
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		a := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		a = strings.ReplaceAll(drop.ReplaceAllString(a, ""), " ", "-")
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// goComments is the text of a Go file's line comments, one a line, with
// the comment marker and the space after it taken off: what godoc renders,
// links and doc link definitions (`[Name]: target`) included.
func goComments(src string) string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		if _, c, ok := strings.Cut(line, "//"); ok && strings.HasPrefix(strings.TrimSpace(line), "//") {
			b.WriteString(strings.TrimPrefix(c, " ") + "\n")
		}
	}
	return b.String()
}

// TestReadmeLinksEveryDoc: every page under docs/ is linked from the
// README, the front door.
func TestReadmeLinksEveryDoc(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	linked := map[string]bool{}
	for _, l := range mdLinks(string(b)) {
		path, _, _ := strings.Cut(l, "#")
		linked[filepath.Clean(path)] = true
	}
	docs, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	for _, d := range docs {
		rel := filepath.Join("docs", filepath.Base(d))
		assert.True(t, linked[rel], "README.md links %s", rel)
	}
}

// TestNoLinkLeavesTheRepository: a clone holds everything its docs and
// code point at. Every relative link of a markdown file resolves to a
// file or folder inside the repository (and a #fragment to a heading of a
// markdown target), and no markdown or Go file names a path beside the
// repository (the folder "shared" beside it) or links one. URLs
// (https:...) are fine.
func TestNoLinkLeavesTheRepository(t *testing.T) {
	beside := ".." + "/shared" // spelled in two so that this file does not name it
	root, files := repoFiles(t)
	checked := 0
	for _, f := range files {
		md, gofile := strings.HasSuffix(f, ".md"), strings.HasSuffix(f, ".go")
		if !md && !gofile {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		text := string(raw)
		if strings.Contains(text, beside) {
			t.Errorf("%s names %s, beside the repository: a clone does not have it; point at the repository's own docs", f, beside)
		}
		if gofile {
			text = goComments(text)
		}
		links := mdLinks(text)
		for _, l := range links {
			checked++
			if external(l) {
				continue
			}
			path, frag, _ := strings.Cut(l, "#")
			target := filepath.Join(root, f)
			switch {
			case path == "":
			case strings.HasPrefix(path, "/"):
				target = filepath.Join(root, path)
			default:
				target = filepath.Join(root, filepath.Dir(f), path)
			}
			if rel, err := filepath.Rel(root, target); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				t.Errorf("%s links %s, outside the repository", f, l)
				continue
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s links %s: no such file in the repository", f, l)
				continue
			}
			if frag != "" && strings.HasSuffix(target, ".md") {
				b, err := os.ReadFile(target)
				require.NoError(t, err)
				assert.True(t, headingAnchors(string(b))[frag], "%s links %s: %s has no heading with that anchor", f, l, filepath.Base(target))
			}
		}
	}
	assert.NotZero(t, checked, "the docs have links to check")
}
