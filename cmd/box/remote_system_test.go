package main

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemRemote drives the world's incusd from outside, as an operator
// on the LAN would: incusd listens on the host's LAN address, box on the
// LAN namespace joins it with a token the incus CLI issued, then lists,
// mints, execs and hands a shell over through it; the boundary holds
// there as here, and a host verb is refused.
func TestSystemRemote(t *testing.T) {
	r, c := worldBox(t)
	st := testenv.World(t)
	ctx := context.Background()
	listen := netip.AddrPortFrom(world.LANHostSide.Addr(), 8443).String()
	require.NoError(t, c.UpdateServerConfig(ctx, map[string]string{"core.https_address": listen}))
	t.Cleanup(func() {
		if err := c.UpdateServerConfig(context.Background(), map[string]string{"core.https_address": ""}); err != nil {
			t.Errorf("closing incusd's HTTPS listener: %v", err)
		}
	})

	// The admin's side: incus config trust add, with the real CLI.
	certName := "box-remote-" + strings.TrimPrefix(uniq(t), "t-cli-")
	incusCLI := testenv.Tool(t, "incus", "incus-client")
	ipCmd := testenv.Tool(t, "ip", "iproute2") // the handed-over CLI runs on the LAN (ip netns exec)
	cli := exec.Command(incusCLI, "config", "trust", "add", certName)
	cli.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "INCUS_SOCKET=" + st.IncusSocket}
	out, err := cli.CombinedOutput()
	require.NoError(t, err, "incus config trust add: %s", out)
	lines := strings.Fields(strings.TrimSpace(string(out)))
	token := lines[len(lines)-1]
	t.Cleanup(func() {
		certs, err := c.Certificates(context.Background())
		require.NoError(t, err)
		for _, ct := range certs {
			if ct.Name == certName {
				assert.NoError(t, c.DeleteCertificate(context.Background(), ct.Fingerprint))
			}
		}
	})

	// The operator's side, on the LAN: dials from the LAN namespace.
	lanDial := func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
		nerr := nsrun.Do(st.Names.LANNS, func() error {
			var d net.Dialer
			conn, err = d.DialContext(ctx, network, addr)
			return nil
		})
		if nerr != nil {
			return nil, nerr
		}
		return conn, err
	}
	conf := t.TempDir()
	far := runner{env: map[string]string{"INCUS_CONF": conf, "BOX_IMAGE": image.DefaultAlias}, dial: lanDial}
	if m := r.env["BOX_MEMORY"]; m != "" {
		far = far.with("BOX_MEMORY", m)
	}

	start := time.Now()
	res := far.run(t, "remote", "add", "far", token, "--addr", "https://"+listen, "--json")
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box remote add (a new client key, TLS, the token): %s", time.Since(start).Round(time.Millisecond))
	var added remoteJSON
	require.NoError(t, json.Unmarshal([]byte(res.out), &added))
	srv, err := c.Server(ctx)
	require.NoError(t, err)
	srvCert, err := incus.ParseCertificatePEM([]byte(srv.Environment.Certificate))
	require.NoError(t, err)
	assert.Equal(t, incus.Fingerprint(srvCert), added.Fingerprint, "the world's incusd's certificate is pinned")
	key, err := os.Stat(filepath.Join(conf, incus.ClientKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), key.Mode().Perm())
	// A token is good once: another client presenting it is refused.
	res = far.with("INCUS_CONF", t.TempDir()).run(t, "remote", "add", "again", token, "--addr", "https://"+listen)
	assert.Equal(t, exitFailed, res.code, "a token is good once")
	assert.Contains(t, res.err, "presenting the trust token")

	// The remote's host keeps a remote box's port in the drop set and
	// pins it, as it does a granted user's: its port watcher.
	portWatcher(t, st, c)

	remote := far.with("BOX_REMOTE", "far")
	name := uniq(t)
	cleanup(t, c, name)
	res = remote.run(t, "new", "--name", name)
	require.Equal(t, exitOK, res.code, res.err)
	inst, _, err := c.Instances().Get(ctx, name)
	require.NoError(t, err, "minted on the world's incusd")
	assert.Equal(t, "1", inst.Config[model.Current.Tag])
	assert.Equal(t, []string{model.Current.Profile}, inst.Profiles)
	// On the host, the box is on the stack once the watcher has seen it.
	var dr doctorResult
	for range 50 {
		doc := r.run(t, "doctor", "--json")
		require.NoError(t, json.Unmarshal([]byte(doc.out), &dr))
		if doc.code == exitOK && len(dr.Verification.Findings) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	assert.Empty(t, dr.Verification.Findings, "the host's doctor finds nothing off the stack after a remote mint")

	start = time.Now()
	res = far.run(t, "--remote", "far", "list", "--json")
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box --remote far list: %s", time.Since(start).Round(time.Millisecond))
	assert.Contains(t, res.out, `"`+name+`"`)

	res = remote.run(t, "info", name, "--json")
	require.Equal(t, exitOK, res.code, res.err)
	var info infoResult
	require.NoError(t, json.Unmarshal([]byte(res.out), &info))
	assert.Equal(t, "Running", info.Status)
	assert.NotEmpty(t, info.Addresses, "the box's address, read over HTTPS")
	for _, args := range [][]string{{"snapshot", name, "s1"}, {"down", name, "--force"}, {"start", name}} {
		res = remote.run(t, args...)
		require.Equal(t, exitOK, res.code, "%v: %s", args, res.err)
	}

	res = remote.run(t, "exec", name, "--", "id", "-un")
	require.Equal(t, exitOK, res.code, res.err)
	assert.Equal(t, "dev\n", res.out)

	res = remote.run(t, "shell", name)
	require.Equal(t, exitOK, res.code, res.err)
	argv := []string{"incus", "--project", "default", "exec", "far:" + name, "--", "su", "-l", "dev"}
	assert.Equal(t, argv, res.handedOver)
	for _, e := range res.env {
		assert.False(t, strings.HasPrefix(e, "INCUS_SOCKET="), "a remote's handover names no local socket: %s", e)
	}
	// The handed-over command, run for real on the LAN with the config
	// box wrote: the incus CLI reaches the box through the remote.
	sh := exec.Command(ipCmd, append([]string{"netns", "exec", st.Names.LANNS}, argv...)...)
	sh.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir(), "INCUS_CONF=" + conf}
	sh.Stdin = strings.NewReader("id -un; hostname\n")
	shOut, err := sh.CombinedOutput()
	require.NoError(t, err, "%s", shOut)
	assert.Equal(t, "dev\n"+name+"\n", string(shOut))

	// A CLI whose default remote is far: the local handover still lands
	// on this machine's incusd (local: is named), where the bare name
	// would go to far, which the world's internet side has no route to.
	cfg := filepath.Join(conf, "config.yml")
	raw, err := os.ReadFile(cfg)
	require.NoError(t, err)
	require.Contains(t, string(raw), "default-remote: local")
	require.NoError(t, os.WriteFile(cfg, []byte(strings.Replace(string(raw), "default-remote: local", "default-remote: far", 1)), 0o600))
	res = r.with("INCUS_CONF", conf).run(t, "shell", name)
	require.Equal(t, exitOK, res.code, res.err)
	require.Equal(t, []string{"incus", "--project", "default", "exec", "local:" + name, "--", "su", "-l", "dev"}, res.handedOver)
	onInet := func(argv []string) (string, error) {
		cmd := exec.Command(ipCmd, append([]string{"netns", "exec", st.Names.InetNS}, argv...)...)
		cmd.Env = append(append([]string{}, res.env...), "INCUS_CONF="+conf, "HOME="+t.TempDir())
		cmd.Stdin = strings.NewReader("id -un; hostname\n")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	got, err := onInet(res.handedOver)
	require.NoError(t, err, "%s", got)
	assert.Equal(t, "dev\n"+name+"\n", got, "local: reaches this machine's incusd whatever the default remote")
	bare := append([]string{}, res.handedOver...)
	bare[4] = name // main's handover: no remote
	got, err = onInet(bare)
	assert.Error(t, err, "the bare name goes to the default remote, far, unreachable here: %s", got)
	assert.Contains(t, got, listen, "it tried far")

	// The boundary: an instance without the tag is refused there too.
	other := uniq(t)
	require.NoError(t, c.Instances().Create(ctx, incus.InstancesPost{
		Name: other, Type: "container", Profiles: []string{model.Current.Profile},
		Source: incus.InstanceSource{Type: "image", Alias: image.DefaultAlias},
	}))
	cleanup(t, c, other)
	for _, args := range [][]string{{"info", other}, {"shell", other}, {"rm", other, "--force"}, {"exec", other, "--", "id"}} {
		res = remote.run(t, args...)
		assert.Equal(t, exitFailed, res.code, "%v", args)
		assert.Contains(t, res.err, other+" is not a box", "%v", args)
		assert.Nil(t, res.handedOver, "%v", args)
	}
	_, _, err = c.Instances().Get(ctx, other)
	assert.NoError(t, err, "still there")

	// The seed's reuse verbs through the remote: a running box's rename
	// refused with the fix (this host can snapshot a running box, so the
	// refusal is box's own, not Incus's), a restore that keeps the box's
	// policy, a clone of the box and of its snapshot, an export and an
	// import, a rename of the stopped box.
	res = remote.run(t, "rename", name, name+"-r")
	assert.Equal(t, exitFailed, res.code, "rename of a running box")
	assert.Contains(t, res.err, name+" is running: stop it first (box down "+name+"), then rename it")
	res = r.run(t, "rename", name, name+"-r")
	assert.Equal(t, exitFailed, res.code, "rename of a running box, here")
	assert.Contains(t, res.err, "stop it first")
	res = remote.run(t, "restore", name, "s1", "--force", "--json")
	require.Equal(t, exitOK, res.code, "restore through the remote: %s", res.err)
	assert.Contains(t, res.out, `"source": "current"`)
	fromBox, fromSnap, imported := uniq(t), uniq(t), uniq(t)
	cleanup(t, c, fromBox, fromSnap, imported, name+"-r")
	for _, args := range [][]string{{"new", "--name", fromBox, "--from", name}, {"new", "--name", fromSnap, "--from", name + "/s1"}} {
		res = remote.run(t, args...)
		require.Equal(t, exitOK, res.code, "%v through the remote: %s", args, res.err)
	}
	file := filepath.Join(t.TempDir(), "far.tar.gz")
	res = remote.run(t, "export", fromBox, file)
	require.Equal(t, exitOK, res.code, "export through the remote: %s", res.err)
	res = remote.run(t, "import", file, "--name", imported)
	require.Equal(t, exitOK, res.code, "import through the remote: %s", res.err)
	assert.Contains(t, res.out, imported+" took the file's policy")
	require.Equal(t, exitOK, remote.run(t, "down", fromSnap, "--force").code)
	res = remote.run(t, "rename", fromSnap, name+"-r")
	require.Equal(t, exitOK, res.code, "rename through the remote: %s", res.err)
	for _, n := range []string{fromBox, imported, name + "-r"} {
		_, _, err := c.Instances().Get(ctx, n)
		assert.NoError(t, err, "%s is on the world's incusd", n)
	}

	// Host verbs stay on the host.
	res = remote.run(t, "setup-host")
	assert.Equal(t, exitUsage, res.code)
	assert.Contains(t, res.err, "run box setup-host on that host, without --remote")

	start = time.Now()
	res = remote.run(t, "rm", name, "--force")
	require.Equal(t, exitOK, res.code, res.err)
	t.Logf("box --remote far rm: %s", time.Since(start).Round(time.Millisecond))
	_, _, err = c.Instances().Get(ctx, name)
	assert.True(t, incus.IsNotFound(err), "removed on the world's incusd")
}
