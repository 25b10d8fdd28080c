// Package rootonly says whether a file is one only root can change: the
// file and every directory on its way from / owned by root and writable
// by no one else (no group or other write bit), symbolic links followed
// and their own directories checked too. setup-host asks it of the box
// binary before it writes root's boot units to run it: a unit that runs a
// file a user can rewrite runs that user's code as root at every boot.
package rootonly

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Owner is what Check needs to know of one path: its owner and mode, as
// lstat gives them, and where it leads when it is a symbolic link.
type Owner struct {
	UID  uint32
	Mode fs.FileMode
	Link string
}

// Lstat reads a path's Owner from the file system.
func Lstat(path string) (Owner, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return Owner{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Owner{}, fmt.Errorf("%s: no owner to read", path)
	}
	o := Owner{UID: st.Uid, Mode: fi.Mode()}
	if o.Mode&fs.ModeSymlink != 0 {
		if o.Link, err = os.Readlink(path); err != nil {
			return Owner{}, err
		}
	}
	return o, nil
}

// Check returns nil when only root can change path: it, what its links
// lead to, and every directory on the way. Otherwise the error names the
// first path that another user owns or may write. stat is Lstat but in
// tests.
func Check(path string, stat func(string) (Owner, error)) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%s is not an absolute path", path)
	}
	return check(filepath.Clean(path), stat, 0)
}

// maxLinks bounds the links followed, as the kernel's ELOOP does.
const maxLinks = 40

func check(path string, stat func(string) (Owner, error), links int) error {
	// Every directory from / down, then the path itself.
	var chain []string
	for p := path; ; p = filepath.Dir(p) {
		chain = append([]string{p}, chain...)
		if p == "/" {
			break
		}
	}
	for _, p := range chain {
		o, err := stat(p)
		if err != nil {
			return err
		}
		if err := owned(p, o); err != nil {
			return err
		}
		if o.Mode&fs.ModeSymlink == 0 {
			continue
		}
		if links++; links > maxLinks {
			return fmt.Errorf("%s: too many symbolic links", path)
		}
		target := o.Link
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		rest, _ := filepath.Rel(p, path)
		return check(filepath.Clean(filepath.Join(target, rest)), stat, links)
	}
	return nil
}

// owned says why one path is not root's alone.
func owned(p string, o Owner) error {
	switch {
	case o.UID != 0:
		return &NotRootOnly{Path: p, Why: fmt.Sprintf("owned by uid %d, not root", o.UID)}
	case o.Mode&fs.ModeSymlink != 0:
		return nil // a link's own mode means nothing; its target is checked
	case o.Mode.Perm()&0o022 != 0:
		return &NotRootOnly{Path: p, Why: fmt.Sprintf("writable by others (mode %04o)", o.Mode.Perm()|stickyBits(o.Mode))}
	}
	return nil
}

func stickyBits(m fs.FileMode) fs.FileMode {
	if m&fs.ModeSticky != 0 {
		return 0o1000
	}
	return 0
}

// NotRootOnly is a path another user owns or may write.
type NotRootOnly struct {
	Path, Why string
}

func (e *NotRootOnly) Error() string { return e.Path + " is " + e.Why }

// IsNotRootOnly reports whether err says a path is not root's alone.
func IsNotRootOnly(err error) bool {
	var n *NotRootOnly
	return errors.As(err, &n)
}
