package hostscan

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// maxSymlinks bounds symlink chains, as the kernel's own limit does.
const maxSymlinks = 40

// underRoot turns name, an absolute path as seen from inside root, into a
// path on this machine, following symlinks inside root: an absolute link
// target starts again at root, and ".." stops at it, so a file under a
// container's root filesystem (or a test fixture tree) never resolves to
// the machine's own. A root of "" or "/" is the machine's own tree.
func underRoot(root, name string) (string, error) {
	name = path.Clean("/" + name)
	if root == "" || root == "/" {
		return name, nil
	}
	hops := 0
restart:
	cur := "/"
	rest := strings.Split(strings.TrimPrefix(name, "/"), "/")
	for i, c := range rest {
		if c == "" {
			continue
		}
		next := path.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			// Let the caller's open report it, with the full path.
			return filepath.Join(root, path.Join(append([]string{next}, rest[i+1:]...)...)), nil
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links under %s", name, root)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		name = path.Join(append([]string{"/", target}, rest[i+1:]...)...)
		goto restart
	}
	return filepath.Join(root, cur), nil
}

// readUnder reads the file at name inside root (see underRoot).
func readUnder(root, name string) ([]byte, error) {
	p, err := underRoot(root, name)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// listUnder returns the paths (as seen inside root) of the entries other
// than directories (symlinks are not followed) directly in dir inside root
// whose names match pattern (path.Match), sorted. A missing dir gives none and no error.
func listUnder(root, dir, pattern string) ([]string, error) {
	p, err := underRoot(root, dir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		if errorsIsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if ok, _ := path.Match(pattern, e.Name()); !ok || e.IsDir() {
			continue
		}
		out = append(out, path.Join(dir, e.Name()))
	}
	slices.Sort(out)
	return out, nil
}

// errorsIsNotExist reports a missing file or a path through a non-directory.
func errorsIsNotExist(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}
