package incus_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

func TestConfigDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"INCUS_CONF": "/etc/box-incus", "HOME": "/home/a"}, "/etc/box-incus"},
		{map[string]string{"HOME": "/home/a"}, "/home/a/.config/incus"},
		{map[string]string{}, ""},
	} {
		assert.Equal(t, tc.want, incus.ConfigDir(func(k string) string { return tc.env[k] }), "%v", tc.env)
	}
}

// writeConfig writes an incus CLI config directory: config.yml and the
// named pinned certificates.
func writeConfig(t *testing.T, yml string, certs map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte(yml), 0o644))
	if len(certs) > 0 {
		require.NoError(t, os.Mkdir(filepath.Join(dir, "servercerts"), 0o755))
	}
	for name, pem := range certs {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "servercerts", name+".crt"), []byte(pem), 0o644))
	}
	return dir
}

const pemCert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUYm94LWltYWdlLWNsaWVudC10ZXN0MAoGCCqGSM49BAMC\n-----END CERTIFICATE-----\n"

func TestLoadRemotes(t *testing.T) {
	defaults := incus.Remotes{
		"local":  {Name: "local", Addr: "unix://", Protocol: "incus"},
		"images": {Name: "images", Addr: incus.ImagesServer, Protocol: "simplestreams", Public: true},
	}
	t.Run("no config directory", func(t *testing.T) {
		rs, err := incus.LoadRemotes("")
		require.NoError(t, err)
		assert.Equal(t, defaults, rs)
	})
	t.Run("no config.yml in it", func(t *testing.T) {
		rs, err := incus.LoadRemotes(t.TempDir())
		require.NoError(t, err)
		assert.Equal(t, defaults, rs)
	})
	t.Run("the file's remotes, certificates pinned", func(t *testing.T) {
		dir := writeConfig(t, `default-remote: local
remotes:
  images:
    addr: https://203.0.113.30:8443
    protocol: simplestreams
    public: true
  mirror:
    addr: https://mirror.example.test
    protocol: simplestreams
    public: true
  other:
    addr: https://incus.example.test:8443
    auth_type: tls
    public: false
  local:
    addr: unix://
    public: false
aliases: {}
`, map[string]string{"images": pemCert})
		rs, err := incus.LoadRemotes(dir)
		require.NoError(t, err)
		assert.Equal(t, incus.Remotes{
			"local":  defaults["local"],
			"images": {Name: "images", Addr: "https://203.0.113.30:8443", Protocol: "simplestreams", Public: true, Certificate: pemCert},
			"mirror": {Name: "mirror", Addr: "https://mirror.example.test", Protocol: "simplestreams", Public: true},
			"other":  {Name: "other", Addr: "https://incus.example.test:8443", Protocol: "incus"},
		}, rs)
	})
	t.Run("a file without images has none", func(t *testing.T) {
		rs, err := incus.LoadRemotes(writeConfig(t, "remotes:\n  local:\n    addr: unix://\n", nil))
		require.NoError(t, err)
		assert.Equal(t, incus.Remotes{"local": defaults["local"]}, rs)
		_, _, err = rs.Lookup("images:debian/12/cloud")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no remote named images (the incus CLI's remotes here: local; incus remote add adds one)")
	})
	t.Run("a broken file", func(t *testing.T) {
		dir := writeConfig(t, "remotes: [\n", nil)
		_, err := incus.LoadRemotes(dir)
		require.Error(t, err)
		assert.Contains(t, err.Error(), filepath.Join(dir, "config.yml"))
	})
	t.Run("a certificate that is none", func(t *testing.T) {
		dir := writeConfig(t, "remotes:\n  images:\n    addr: https://x.test\n    protocol: simplestreams\n", map[string]string{"images": "not pem"})
		_, err := incus.LoadRemotes(dir)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "remote images: "+filepath.Join(dir, "servercerts", "images.crt")+" is not a PEM certificate")
	})
}

func TestLookupAndPullSource(t *testing.T) {
	rs := incus.DefaultRemotes()
	rs["pinned"] = incus.Remote{Name: "pinned", Addr: "https://203.0.113.30:8443", Protocol: "simplestreams", Certificate: pemCert}
	rs["other"] = incus.Remote{Name: "other", Addr: "https://incus.example.test:8443", Protocol: "incus"}
	rs["oci"] = incus.Remote{Name: "oci", Addr: "https://registry.example.test", Protocol: "oci"}
	rs["odd"] = incus.Remote{Name: "odd", Addr: "ftp://x.test", Protocol: "simplestreams"}
	for _, tc := range []struct {
		image  string
		remote string // "" for this server
		name   string
		src    incus.InstanceSource
		err    string
	}{
		{image: "debian/12", name: "debian/12"},
		{image: "local:debian/12", name: "debian/12"},
		{image: "7c7c879035dc", name: "7c7c879035dc"},
		{image: "images:debian/12/cloud", remote: "images", name: "debian/12/cloud",
			src: incus.InstanceSource{Type: "image", Mode: "pull", Server: incus.ImagesServer, Protocol: "simplestreams", Alias: "debian/12/cloud"}},
		{image: "pinned:debian/12/cloud", remote: "pinned", name: "debian/12/cloud",
			src: incus.InstanceSource{Type: "image", Mode: "pull", Server: "https://203.0.113.30:8443", Protocol: "simplestreams", Alias: "debian/12/cloud", Certificate: pemCert}},
		{image: "other:debian/12", remote: "other", name: "debian/12", err: "remote other (https://incus.example.test:8443) is an Incus server: box pulls images only from simplestreams image servers for now; copy the image here first (incus image copy other:debian/12 local: --alias NAME) and pass --image NAME"},
		{image: "oci:alpine", remote: "oci", name: "alpine", err: `remote oci (https://registry.example.test) speaks "oci": box pulls images only from simplestreams image servers`},
		{image: "odd:x", remote: "odd", name: "x", err: `remote odd has the address "ftp://x.test": an image server's is an https:// URL`},
	} {
		r, name, err := rs.Lookup(tc.image)
		require.NoError(t, err, tc.image)
		assert.Equal(t, tc.name, name, tc.image)
		if tc.remote == "" {
			assert.Nil(t, r, tc.image)
			continue
		}
		require.NotNil(t, r, tc.image)
		assert.Equal(t, tc.remote, r.Name)
		src, err := r.PullSource(name)
		if tc.err != "" {
			require.Error(t, err, tc.image)
			assert.Contains(t, err.Error(), tc.err)
			continue
		}
		require.NoError(t, err, tc.image)
		assert.Equal(t, tc.src, src, tc.image)
	}
	for image, want := range map[string]string{
		"nowhere:x": "image nowhere:x: no remote named nowhere (the incus CLI's remotes here: images, local, oci, odd, other, pinned;",
		"images:":   `image "images:" names no image after the remote`,
	} {
		_, _, err := rs.Lookup(image)
		require.Error(t, err, image)
		assert.Contains(t, err.Error(), want)
	}
}
