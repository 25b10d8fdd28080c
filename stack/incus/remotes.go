package incus

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Remote is a server the incus CLI knows by name (`incus remote list`):
// an image server, or another Incus.
type Remote struct {
	Name string
	// Addr is the server's URL ("https://..."); "unix://" for local.
	Addr string
	// Protocol is "simplestreams" for an image server, "incus" for an
	// Incus server (the CLI's default when the file names none).
	Protocol string
	Public   bool
	// Project is the project the CLI works in on this remote ("" is the
	// server's default).
	Project string
	// Certificate is the server's certificate (PEM) the CLI pinned in
	// servercerts/NAME.crt; empty when the system's CAs vouch for it.
	Certificate string
}

// Remotes are the incus CLI's remotes by name.
type Remotes map[string]Remote

// The incus CLI's built-in remotes: LocalRemote is this server (over its
// socket), ImagesRemote the public image server its `images:` names.
const (
	LocalRemote  = "local"
	ImagesRemote = "images"
	// ImagesServer is the URL of the incus CLI's default images remote.
	ImagesServer = "https://images.linuxcontainers.org"
)

// DefaultRemotes are the remotes the incus CLI has without a config file:
// local, and images (the public simplestreams server, no pinned
// certificate).
func DefaultRemotes() Remotes {
	return Remotes{
		LocalRemote:  {Name: LocalRemote, Addr: "unix://", Protocol: "incus"},
		ImagesRemote: {Name: ImagesRemote, Addr: ImagesServer, Protocol: "simplestreams", Public: true},
	}
}

// ConfigDir is the incus CLI's config directory as its environment names
// it: $INCUS_CONF, else $HOME/.config/incus; "" when neither is set.
func ConfigDir(getenv func(string) string) string {
	if d := getenv("INCUS_CONF"); d != "" {
		return d
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "incus")
	}
	return ""
}

// cliConfig is the part of the incus CLI's config.yml read here.
type cliConfig struct {
	Remotes map[string]struct {
		Addr     string `yaml:"addr"`
		Protocol string `yaml:"protocol"`
		Public   bool   `yaml:"public"`
		Project  string `yaml:"project"`
	} `yaml:"remotes"`
}

// LoadRemotes reads the remotes the incus CLI uses from its config
// directory dir (ConfigDir): config.yml's remotes, each with the
// certificate pinned in servercerts/NAME.crt. Without a config.yml (or
// with dir "") they are DefaultRemotes, as for the CLI; with one, they are
// exactly its remotes, plus local, which is always there. (The CLI also
// adds the system-wide remotes of /etc/incus/config.yml; those are not
// read here.)
func LoadRemotes(dir string) (Remotes, error) {
	if dir == "" {
		return DefaultRemotes(), nil
	}
	path := filepath.Join(dir, "config.yml")
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return DefaultRemotes(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the incus CLI's remotes: %w", err)
	}
	var cfg cliConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("reading the incus CLI's remotes in %s: %w", path, err)
	}
	rs := Remotes{}
	for name, r := range cfg.Remotes {
		rem := Remote{Name: name, Addr: r.Addr, Protocol: r.Protocol, Public: r.Public, Project: r.Project}
		if rem.Protocol == "" {
			rem.Protocol = "incus"
		}
		cert := filepath.Join(dir, "servercerts", name+".crt")
		pemBytes, err := os.ReadFile(cert)
		switch {
		case err == nil:
			if b, _ := pem.Decode(pemBytes); b == nil || b.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("remote %s: %s is not a PEM certificate (incus remote remove %s, then add it again)", name, cert, name)
			}
			rem.Certificate = string(pemBytes)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("remote %s: reading its pinned certificate: %w", name, err)
		}
		rs[name] = rem
	}
	rs[LocalRemote] = DefaultRemotes()[LocalRemote]
	return rs, nil
}

// Lookup splits an image name REMOTE:NAME. An image on this server (no
// remote, or local:NAME) has a nil remote; a remote the incus CLI does not
// know is an error.
func (rs Remotes) Lookup(image string) (*Remote, string, error) {
	name, rest, ok := strings.Cut(image, ":")
	if !ok {
		return nil, image, nil
	}
	if rest == "" {
		return nil, "", fmt.Errorf("image %q names no image after the remote (want REMOTE:ALIAS, e.g. images:debian/12/cloud)", image)
	}
	if name == LocalRemote {
		return nil, rest, nil
	}
	r, ok := rs[name]
	if !ok {
		known := slices.Sorted(maps.Keys(rs))
		return nil, "", fmt.Errorf("image %s: no remote named %s (the incus CLI's remotes here: %s; incus remote add adds one)", image, name, strings.Join(known, ", "))
	}
	return &r, rest, nil
}

// PullSource is the instance source that has incusd pull the image name
// from r itself, and cache it, as the incus CLI asks for one: by alias
// (incusd also takes a fingerprint there), in "pull" mode, with r's pinned
// certificate. Only simplestreams image servers are supported: from an
// Incus remote the image has to be copied here first.
func (r Remote) PullSource(name string) (InstanceSource, error) {
	fix := fmt.Sprintf("copy the image here first (incus image copy %s:%s local: --alias NAME) and pass --image NAME", r.Name, name)
	switch r.Protocol {
	case "simplestreams":
	case "incus", "lxd":
		return InstanceSource{}, fmt.Errorf("remote %s (%s) is an Incus server: box pulls images only from simplestreams image servers for now; %s", r.Name, r.Addr, fix)
	default:
		return InstanceSource{}, fmt.Errorf("remote %s (%s) speaks %q: box pulls images only from simplestreams image servers; %s", r.Name, r.Addr, r.Protocol, fix)
	}
	if !strings.HasPrefix(r.Addr, "https://") && !strings.HasPrefix(r.Addr, "http://") {
		return InstanceSource{}, fmt.Errorf("remote %s has the address %q: an image server's is an https:// URL (incus remote list shows it)", r.Name, r.Addr)
	}
	return InstanceSource{
		Type: "image", Mode: "pull", Server: r.Addr, Protocol: r.Protocol,
		Alias: name, Certificate: r.Certificate,
	}, nil
}
