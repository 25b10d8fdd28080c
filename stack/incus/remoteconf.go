package incus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The incus CLI's own files in its config directory (ConfigDir): box
// reads and writes them as the CLI does, so a remote added by either works
// for both, and a handover to the CLI reaches the same server.
const (
	ClientCertFile = "client.crt"
	ClientKeyFile  = "client.key" // mode 0600, always
)

// ClientIdentity loads the client certificate and key from dir; with
// create, it makes them when neither exists (as the CLI does on its first
// remote add).
func ClientIdentity(dir string, create bool) (tls.Certificate, error) {
	if dir == "" {
		return tls.Certificate{}, errors.New("no config directory for the incus CLI: set HOME or INCUS_CONF")
	}
	crt, key := filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile)
	_, cerr := os.Stat(crt)
	_, kerr := os.Stat(key)
	if errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist) && create {
		host, _ := os.Hostname()
		certPEM, keyPEM, err := NewClientCertificate("box@" + host)
		if err != nil {
			return tls.Certificate{}, err
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return tls.Certificate{}, fmt.Errorf("making %s: %w", dir, err)
		}
		if err := writeFileExcl(key, keyPEM, keyFileMode); err != nil {
			return tls.Certificate{}, err
		}
		if err := writeFileExcl(crt, certPEM, 0o644); err != nil {
			return tls.Certificate{}, err
		}
	}
	if err := checkKeyMode(key); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return tls.Certificate{}, fmt.Errorf("no client key at %s: add the remote first (box remote add NAME TOKEN)", key)
		}
		return tls.Certificate{}, err
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("reading the client certificate in %s: %w", dir, err)
	}
	return pair, nil
}

func writeFileExcl(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// Client returns a client for r, an Incus server over HTTPS, presenting
// the client certificate in dir, in r's project.
func (r Remote) Client(dir string, dial DialFunc) (*Client, error) {
	if r.Protocol != "incus" || !strings.HasPrefix(r.Addr, "https://") {
		return nil, fmt.Errorf("remote %s (%s, %s) is not an Incus server over HTTPS: box drives only those", r.Name, r.Addr, r.Protocol)
	}
	id, err := ClientIdentity(dir, false)
	if err != nil {
		return nil, fmt.Errorf("remote %s: %w", r.Name, err)
	}
	t := RemoteTLS{Client: id, Dial: dial}
	if r.Certificate != "" {
		if t.Server, err = ParseCertificatePEM([]byte(r.Certificate)); err != nil {
			return nil, fmt.Errorf("remote %s: its pinned certificate: %w", r.Name, err)
		}
	}
	c, err := NewRemote(r.Addr, t)
	if err != nil {
		return nil, fmt.Errorf("remote %s: %w", r.Name, err)
	}
	return c.Project(r.Project), nil
}

// AddRemote joins the Incus at addr with token (JoinRemote, with the
// client certificate in dir, made if there is none) and records it in
// dir as the incus CLI does: config.yml's remotes (the other entries kept)
// and the server's certificate pinned in servercerts/NAME.crt.
func AddRemote(ctx context.Context, dir, name, addr string, token TrustToken, dial DialFunc) (Remote, error) {
	if name == "" || name == LocalRemote || strings.ContainsAny(name, ":/ ") {
		return Remote{}, fmt.Errorf("remote name %q: pick another (not local, no ':', '/' or space)", name)
	}
	rs, err := LoadRemotes(dir)
	if err != nil {
		return Remote{}, err
	}
	if _, ok := rs[name]; ok {
		return Remote{}, fmt.Errorf("there is a remote named %s already (incus remote remove %s first, or pick another name)", name, name)
	}
	id, err := ClientIdentity(dir, true)
	if err != nil {
		return Remote{}, err
	}
	srv, err := JoinRemote(ctx, addr, token, id, dial)
	if err != nil {
		return Remote{}, err
	}
	certPEM := pemEncode(srv.Raw)
	if err := os.MkdirAll(filepath.Join(dir, "servercerts"), 0o750); err != nil {
		return Remote{}, fmt.Errorf("pinning %s's certificate: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "servercerts", name+".crt"), certPEM, 0o644); err != nil {
		return Remote{}, fmt.Errorf("pinning %s's certificate: %w", name, err)
	}
	if err := writeRemoteEntry(dir, name, addr); err != nil {
		return Remote{}, err
	}
	return Remote{Name: name, Addr: addr, Protocol: "incus", Certificate: string(certPEM)}, nil
}

// writeRemoteEntry adds name to config.yml's remotes, keeping the rest of
// the file; a new file also gets the CLI's built-in remotes, which a
// config.yml otherwise hides.
func writeRemoteEntry(dir, name, addr string) error {
	path := filepath.Join(dir, "config.yml")
	var doc yaml.Node
	raw, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		raw = []byte("default-remote: local\nremotes:\n  images:\n    addr: " + ImagesServer + "\n    protocol: simplestreams\n    public: true\n  local:\n    addr: unix://\n    public: false\naliases: {}\n")
	case err != nil:
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("%s is not the incus CLI's config (a mapping): fix or move it, then add the remote again", path)
	}
	top := doc.Content[0]
	var remotes *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "remotes" {
			remotes = top.Content[i+1]
		}
	}
	if remotes == nil {
		remotes = &yaml.Node{Kind: yaml.MappingNode}
		top.Content = append(top.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "remotes"}, remotes)
	}
	if remotes.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: remotes is not a mapping: fix it, then add the remote again", path)
	}
	var entry yaml.Node
	if err := entry.Encode(map[string]any{"addr": addr, "auth_type": "tls", "project": "default", "protocol": "incus", "public": false}); err != nil {
		return err
	}
	remotes.Content = append(remotes.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, &entry)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	tmp := path + ".box-tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
