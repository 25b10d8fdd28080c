package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/box-isolation/box/stack/boxes"
)

// exportResult is what `box export --json` prints.
type exportResult struct {
	*boxes.ExportResult
	File    string  `json:"file"`
	Seconds float64 `json:"seconds"`
}

func setupExport(fs *flag.FlagSet) action {
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	return func(c *call) error { return c.export(*force, *asJSON) }
}

// export writes the box to a temporary file beside FILE and gives it
// FILE's name only once it is whole: an export that fails or is
// interrupted leaves nothing half-written.
func (c *call) export(force, asJSON bool) error {
	name := c.name()
	file := name + ".tar.gz"
	if len(c.args) > 1 {
		file = c.args[1]
	}
	if st, err := os.Stat(file); err == nil && (!force || st.IsDir()) {
		if st.IsDir() {
			return fmt.Errorf("%s is a directory: name the file (box export %s %s)", file, name, filepath.Join(file, name+".tar.gz"))
		}
		return fmt.Errorf("%s exists: pass --force to overwrite it, or name another FILE", file)
	}
	// The file holds the box's whole disk, credentials included: it is
	// the owner's only (CreateTemp makes it 0600).
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".part-*")
	if err != nil {
		return fmt.Errorf("exporting %s: %w", name, err)
	}
	placed := false
	defer func() {
		if !placed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h, err := c.host()
	if err != nil {
		return err
	}
	start := time.Now()
	c.progressf("exporting %s...", name)
	res, err := boxes.NewManager(h).Export(c.ctx, name, tmp)
	c.progressDone()
	if res != nil && res.SourceStopped {
		fmt.Fprintf(c.err, "box: %s was running: it was stopped for the export and started again (Incus copies a running box's files while they change, and this host cannot freeze it: only a stopped box makes a consistent file)\n", name)
	}
	if res != nil {
		for _, n := range res.Notes {
			fmt.Fprintf(c.err, "box: %s\n", n)
		}
	}
	if err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("exporting %s: writing %s: %w", name, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("exporting %s: writing %s: %w", name, tmp.Name(), err)
	}
	if err := place(tmp.Name(), file, force); err != nil {
		return fmt.Errorf("exporting %s: %w", name, err)
	}
	placed = true
	took := time.Since(start)
	if asJSON {
		return c.printJSON(exportResult{ExportResult: res, File: file, Seconds: took.Seconds()})
	}
	snaps := "no snapshots"
	if len(res.Snapshots) > 0 {
		snaps = fmt.Sprintf("%d snapshots (%s)", len(res.Snapshots), strings.Join(res.Snapshots, ", "))
	}
	fmt.Fprintf(c.out, "%s exported to %s: %s, %s, in %s (box import %s makes a box of it)\n", name, file, byteSize(res.Bytes), snaps, took.Round(10*time.Millisecond), file)
	return nil
}

// place gives the finished export its name: without force, never over a
// file that appeared meanwhile (a hard link fails on an existing name).
func place(tmp, file string, force bool) error {
	if force {
		return os.Rename(tmp, file)
	}
	err := os.Link(tmp, file)
	switch {
	case err == nil:
		return os.Remove(tmp)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s appeared while exporting: pass --force to overwrite it", file)
	}
	// A file system without hard links.
	if _, serr := os.Lstat(file); serr == nil {
		return fmt.Errorf("%s appeared while exporting: pass --force to overwrite it", file)
	}
	return os.Rename(tmp, file)
}

// byteSize renders a size for people.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// importResult is what `box import --json` prints.
type importResult struct {
	*boxes.ImportResult
	Address string  `json:"address"`
	Seconds float64 `json:"seconds"`
}

func setupImport(fs *flag.FlagSet) action {
	name := fs.String("name", "", "the new box's name (default: the name in the file)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	return func(c *call) error { return c.importBox(c.args[0], *name, *asJSON) }
}

func (c *call) importBox(file, name string, asJSON bool) error {
	h, err := c.host()
	if err != nil {
		return err
	}
	start := time.Now()
	c.progressf("importing %s...", file)
	res, err := boxes.NewManager(h).Import(c.ctx, file, name)
	c.progressDone()
	if err != nil {
		return err
	}
	for _, n := range res.Notes {
		fmt.Fprintf(c.err, "box: %s: %s\n", res.Box.Name, n)
	}
	addr, err := h.Addresses().Wait(c.ctx, res.Box.Name, addressWait)
	if err != nil {
		return fmt.Errorf("imported %s, but: %w", res.Box.Name, err)
	}
	took := time.Since(start)
	if asJSON {
		return c.printJSON(importResult{ImportResult: res, Address: addr.String(), Seconds: took.Seconds()})
	}
	snaps := "no snapshots"
	if len(res.Snapshots) > 0 {
		snaps = fmt.Sprintf("%d snapshots (%s)", len(res.Snapshots), strings.Join(res.Snapshots, ", "))
	}
	fmt.Fprintf(c.out, "%s: %s %s at %s (import of %s from %s, %s, in %s; its stamps are the file's, its MAC, machine-id and instance UUID are new)\n",
		res.Box.Name, res.Box.Type, strings.ToLower(res.Box.Status), addr, res.From, file, snaps, took.Round(10*time.Millisecond))
	fmt.Fprintf(c.out, "%s took the file's policy: %s\n", res.Box.Name, res.Policy.Summary())
	return nil
}
