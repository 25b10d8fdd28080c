package probes

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A devices probe lists the device nodes under the box's /dev, without
// opening one: each node is a door to a driver of the host's kernel, and
// a container gets a handful (null, zero, full, random, urandom, tty,
// console, ptmx and its own pseudo-terminals, fuse, net/tun). The drill
// judges the list against those.

// MaxDeviceNodes bounds what a devices probe lists.
const MaxDeviceNodes = 512

// devRoot is the /dev a devices probe walks (tests point it elsewhere).
var devRoot = "/dev"

// ownTrees are the folders under /dev whose nodes are the box's own (its
// pseudo-terminals) or no nodes at all.
var ownTrees = map[string]bool{"pts": true, "shm": true, "mqueue": true, "hugepages": true}

func probeDevices(obs Observation) Observation {
	nodes, err := listDevices(devRoot)
	if err != nil {
		return fail(obs, err.Error())
	}
	obs.Evidence.Devices = nodes
	return done(obs, Reached, fmt.Sprintf("%d device nodes under /dev", len(nodes)))
}

// listDevices walks root for device nodes; a folder it may not read is
// passed over (the box cannot open what is in it either).
func listDevices(root string) ([]DeviceNode, error) {
	nodes := []DeviceNode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		if err != nil {
			if p == root {
				return err
			}
			return fs.SkipDir
		}
		if d.IsDir() && p != root && ownTrees[strings.Split(rel, "/")[0]] {
			return fs.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		// Not the folder's idea of the entry's type: a node bound in over
		// a placeholder file is listed as the file.
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil
		}
		var t string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			t = "c"
		case unix.S_IFBLK:
			t = "b"
		default:
			return nil
		}
		nodes = append(nodes, DeviceNode{Path: filepath.Join("/dev", rel), Type: t, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)})
		if len(nodes) >= MaxDeviceNodes {
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", root, err)
	}
	return nodes, nil
}
