package boxes

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// An Incus backup tarball (what `box export` writes, and `incus export`
// without --optimized-storage), as measured with Incus 6.0.4:
//
//	backup/index.yaml                  name, backend, pool, snapshots, type,
//	                                   optimized, and config: a copy of the
//	                                   instance's backup.yaml
//	backup/container/backup.yaml       the instance (config, devices,
//	                                   profiles, expanded), its snapshots'
//	                                   definitions, the pool, the profiles,
//	                                   the volume
//	backup/container/rootfs/...        its files
//	backup/snapshots/S/backup.yaml     the instance as it was when S was
//	backup/snapshots/S/rootfs/...      taken, and S's files
//
// (virtual-machine in place of container for a VM). Incus creates the
// instance from backup/container/backup.yaml: a NIC added to index.yaml
// alone did not appear on the imported instance, one added to backup.yaml
// did. The devices and config it gets are that file's own (not expanded)
// ones, with its profiles taken by name from the importing host (an
// absent profile fails the import). box judges every definition in every
// one of these files, so which one a version of Incus reads does not
// matter.

// maxBackupYAML bounds one YAML file of a backup (they are a few KiB).
const maxBackupYAML = 1 << 20

// BackupFile is what box reads of a backup tarball before importing it.
type BackupFile struct {
	// Name, Type, Pool, Snapshots and Optimized are index.yaml's.
	Name      string
	Type      string
	Pool      string
	Snapshots []string
	Optimized bool
	// Instance is the instance as its backup.yaml holds it: local config,
	// devices and profiles (what Incus makes it from).
	Instance *incus.Instance
	// Definitions are every definition of the instance or of one of its
	// snapshots the file holds, each saying where.
	Definitions []BackupDefinition
}

// BackupDefinition is one definition of the instance, or of one of its
// snapshots, in one of the file's YAML files.
type BackupDefinition struct {
	File     string // the tarball's path of the YAML file
	Snapshot string // "" for the instance itself
	Inst     incus.Instance
}

// Label names the definition for people: "the box (backup/index.yaml)",
// "snapshot s1 (backup/container/backup.yaml)".
func (d BackupDefinition) Label() string {
	if d.Snapshot == "" {
		return "the box"
	}
	return "snapshot " + d.Snapshot
}

// yamlInstance is an instance or snapshot as backup YAML holds it.
type yamlInstance struct {
	Name         string                       `yaml:"name"`
	Type         string                       `yaml:"type"`
	Architecture string                       `yaml:"architecture"`
	Config       map[string]string            `yaml:"config"`
	Devices      map[string]map[string]string `yaml:"devices"`
	Profiles     []string                     `yaml:"profiles"`
}

// yamlConfig is a backup.yaml, or index.yaml's config.
type yamlConfig struct {
	Container *yamlInstance  `yaml:"container"`
	Snapshots []yamlInstance `yaml:"snapshots"`
}

type yamlIndex struct {
	Name      string      `yaml:"name"`
	Backend   string      `yaml:"backend"`
	Pool      string      `yaml:"pool"`
	Snapshots []string    `yaml:"snapshots"`
	Optimized bool        `yaml:"optimized"`
	Type      string      `yaml:"type"`
	Config    *yamlConfig `yaml:"config"`
}

func (y *yamlInstance) instance() incus.Instance {
	return incus.Instance{Name: y.Name, Type: y.Type, Architecture: y.Architecture,
		Config: y.Config, Devices: y.Devices, Profiles: y.Profiles, Status: "Stopped"}
}

// ReadBackupFile reads a backup tarball (gzip-compressed or plain tar)
// through to its end and returns its index and every definition in it. A
// YAML file that appears twice is refused (tar keeps both, and the later
// one wins on unpacking), as is one that is not a regular file.
func ReadBackupFile(r io.Reader) (*BackupFile, error) {
	br := bufio.NewReader(r)
	head, _ := br.Peek(262)
	var tr *tar.Reader
	switch {
	case len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("reading the gzip stream: %w", err)
		}
		defer zr.Close()
		tr = tar.NewReader(zr)
	case len(head) >= 262 && bytes.HasPrefix(head[257:], []byte("ustar")):
		tr = tar.NewReader(br)
	default:
		return nil, errors.New("it is neither a gzip-compressed nor a plain tar file (box export writes gzip; incus export --compression=gzip or none is read too)")
	}
	yamls := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading the tarball: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name != "backup/index.yaml" && !(strings.HasPrefix(name, "backup/") && path.Base(name) == "backup.yaml") {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s in it is not a regular file", name)
		}
		if _, dup := yamls[name]; dup {
			return nil, fmt.Errorf("it holds %s twice (the later one would win on unpacking)", name)
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxBackupYAML+1))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if len(b) > maxBackupYAML {
			return nil, fmt.Errorf("%s is larger than %d bytes", name, maxBackupYAML)
		}
		yamls[name] = b
	}
	return parseBackupYAML(yamls)
}

// parseBackupYAML turns the YAML files of a backup into a BackupFile.
func parseBackupYAML(yamls map[string][]byte) (*BackupFile, error) {
	raw, ok := yamls["backup/index.yaml"]
	if !ok {
		return nil, errors.New("it has no backup/index.yaml: not an Incus backup")
	}
	var idx yamlIndex
	if err := yaml.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("reading backup/index.yaml: %w", err)
	}
	bf := &BackupFile{Name: idx.Name, Type: idx.Type, Pool: idx.Pool, Snapshots: idx.Snapshots, Optimized: idx.Optimized}
	if bf.Name == "" {
		return nil, errors.New("backup/index.yaml names no instance: not an Incus backup")
	}
	if bf.Optimized {
		// The config is inside the storage driver's binary image.
		return bf, nil
	}
	add := func(file string, c *yamlConfig) {
		if c == nil {
			return
		}
		if c.Container != nil {
			bf.Definitions = append(bf.Definitions, BackupDefinition{File: file, Inst: c.Container.instance()})
		}
		for i := range c.Snapshots {
			s := c.Snapshots[i].instance()
			s.Name = strings.TrimPrefix(s.Name, idx.Name+"/")
			bf.Definitions = append(bf.Definitions, BackupDefinition{File: file, Snapshot: s.Name, Inst: s})
		}
	}
	add("backup/index.yaml", idx.Config)
	dir := "container"
	if idx.Type == model.TypeVM {
		dir = model.TypeVM
	}
	main := "backup/" + dir + "/backup.yaml"
	for _, name := range slices.Sorted(maps.Keys(yamls)) {
		if name == "backup/index.yaml" {
			continue
		}
		var c yamlConfig
		if err := yaml.Unmarshal(yamls[name], &c); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if name == main {
			add(name, &c)
			if c.Container == nil {
				return nil, fmt.Errorf("%s holds no instance", name)
			}
			inst := c.Container.instance()
			bf.Instance = &inst
			continue
		}
		// A snapshot's own backup.yaml is the instance as it was when the
		// snapshot was taken.
		snap := path.Base(path.Dir(name))
		if c.Container != nil {
			bf.Definitions = append(bf.Definitions, BackupDefinition{File: name, Snapshot: snap, Inst: c.Container.instance()})
		}
	}
	if bf.Instance == nil {
		return nil, fmt.Errorf("it has no %s: not an Incus backup of a %s", main, cmp.Or(idx.Type, model.TypeContainer))
	}
	return bf, nil
}

// ImportRefusedError is a backup box will not import, with every reason.
type ImportRefusedError struct {
	File    string
	Reasons []string
	// Undone: the file passed, but what Incus made of it did not, and was
	// removed before it ever started.
	Undone bool
}

func (e *ImportRefusedError) Error() string {
	what := "nothing was created"
	if e.Undone {
		what = "it was imported, found off the stack as Incus made it, and removed before it ever started"
	}
	return fmt.Sprintf("refusing to import %s (%s):\n  %s", e.File, what, strings.Join(e.Reasons, "\n  "))
}

// judgeBackup says why a backup must not be imported, if it must not: it
// is not a box, box cannot read it, or one of its definitions, made on
// this host with this host's profiles (by name, as Incus does), would be
// off the stack by the fleet census's rules. profiles are this host's.
func judgeBackup(bf *BackupFile, profiles map[string]incus.Profile) []string {
	if bf.Optimized {
		return []string{"it is in a storage driver's optimized format: the instance's config is inside the driver's image, where box cannot judge it (export it with box export, or incus export without --optimized-storage)"}
	}
	var reasons []string
	if bf.Instance.Config[model.Current.Tag] != "1" {
		why := fmt.Sprintf("it is not a box: its config has no %s=1 tag (box imports only what box exported)", model.Current.Tag)
		if bf.Instance.Config[model.Legacy.Tag] == "1" {
			why = fmt.Sprintf("it is a legacy box (%s=1): move it to this stack first (box migrate-host --box %s), then export it again", model.Legacy.Tag, bf.Name)
		}
		reasons = append(reasons, why)
	}
	// The same problem in several files is said once, naming them all.
	where := map[string][]string{}
	var order []string
	say := func(what, file string) {
		if _, ok := where[what]; !ok {
			order = append(order, what)
		}
		if !slices.Contains(where[what], file) {
			where[what] = append(where[what], file)
		}
	}
	for _, d := range bf.Definitions {
		inst, missing := model.ExpandWith(d.Inst, profiles)
		for _, p := range missing {
			say(fmt.Sprintf("%s: its profile %s does not exist on this host (Incus would refuse it too)", d.Label(), p), d.File)
		}
		for _, p := range model.JudgeDefinition(model.Current.Network, &inst).Problems {
			say(d.Label()+": "+p.What, d.File)
		}
	}
	for _, what := range order {
		sort.Strings(where[what])
		reasons = append(reasons, fmt.Sprintf("%s (in %s)", what, strings.Join(where[what], ", ")))
	}
	return reasons
}
