package boxes_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest/worldtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/fixtures/world"
	"github.com/box-isolation/box/internal/nsrun"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/stack/nft"
	"github.com/box-isolation/box/stack/stacktest"
)

// The system tier runs against the hermetic world's incusd and host
// namespace. Each test starts from a bare stack and leaves one.

// pullServer is a tiny simplestreams image server in the world's internet
// namespace, on the canary's address, serving one probe image under one
// alias over HTTPS with a certificate of its own (to be pinned). It is
// this test's stand-in for an image server, not the world's.
type pullServer struct {
	url, alias, fp string
	cert           []byte // PEM
	srv            *http.Server
	mu             sync.Mutex
	gets           map[string]int // by path
}

func startPullServer(t *testing.T, st *world.State) *pullServer {
	t.Helper()
	built, err := image.Build(image.Options{})
	require.NoError(t, err)
	// A metadata tarball of its own (the gzip header names this run): an
	// image incusd does not have yet, so the pull downloads.
	nonce := make([]byte, 4)
	_, err = rand.Read(nonce)
	require.NoError(t, err)
	run := hex.EncodeToString(nonce)
	zr, err := gzip.NewReader(bytes.NewReader(built.Metadata))
	require.NoError(t, err)
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	var meta bytes.Buffer
	zw := gzip.NewWriter(&meta)
	zw.Name = "pull-test-" + run
	_, err = zw.Write(raw)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	combined := sha256.New()
	combined.Write(meta.Bytes())
	combined.Write(built.Rootfs)
	p := &pullServer{alias: "box-pull/" + run, fp: hex.EncodeToString(combined.Sum(nil)), gets: map[string]int{}}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "box pull test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{world.Canary.AsSlice()}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	p.cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	files := map[string][]byte{"/images/" + run + "/incus.tar.xz": meta.Bytes(), "/images/" + run + "/root.tar.xz": built.Rootfs}
	index, _ := json.Marshal(map[string]any{"format": "index:1.0", "index": map[string]any{"images": map[string]any{
		"datatype": "image-downloads", "path": "streams/v1/images.json", "format": "products:1.0", "products": []string{"box:pull:amd64"}}}})
	products, _ := json.Marshal(map[string]any{"content_id": "images", "datatype": "image-downloads", "format": "products:1.0",
		"products": map[string]any{"box:pull:amd64": map[string]any{
			"aliases": p.alias, "arch": "amd64", "os": "busybox", "release": "pull", "release_title": "pull",
			"versions": map[string]any{"20260101_0000": map[string]any{"items": map[string]any{
				"incus.tar.xz": map[string]any{"ftype": "incus.tar.xz", "path": "images/" + run + "/incus.tar.xz",
					"sha256": sum(meta.Bytes()), "size": meta.Len(), "combined_sha256": p.fp, "combined_rootxz_sha256": p.fp},
				"root.tar.xz": map[string]any{"ftype": "root.tar.xz", "path": "images/" + run + "/root.tar.xz",
					"sha256": sum(built.Rootfs), "size": len(built.Rootfs)},
			}}}}}})
	files["/streams/v1/index.json"], files["/streams/v1/images.json"] = index, products

	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.gets[r.URL.Path]++
		p.mu.Unlock()
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if !strings.HasSuffix(r.URL.Path, "root.tar.xz") {
			_, _ = w.Write(body)
			return
		}
		// The rootfs comes slowly, so incusd reports its progress while
		// box watches.
		for chunk := len(body)/8 + 1; len(body) > 0; {
			n := min(chunk, len(body))
			if _, err := w.Write(body[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			body = body[n:]
			time.Sleep(400 * time.Millisecond)
		}
	})
	var ln net.Listener
	require.NoError(t, nsrun.Do(st.Names.InetNS, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(world.Canary.String(), "0"))
		return err
	}))
	p.url = "https://" + ln.Addr().String()
	pair := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	// incusd first tries each file over plain HTTP on this port, and
	// probes: the handshake errors are expected, and not worth a log.
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}},
		ErrorLog: log.New(io.Discard, "", 0)}
	go p.srv.ServeTLS(ln, "", "") //nolint:errcheck
	t.Cleanup(p.stop)
	return p
}

func (p *pullServer) stop() { _ = p.srv.Close() }

func (p *pullServer) got(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gets[path]
}

// deadPort is a port on the canary's address where nothing listens.
func deadPort(t *testing.T, st *world.State) string {
	t.Helper()
	var port string
	require.NoError(t, nsrun.Do(st.Names.InetNS, func() error {
		ln, err := net.Listen("tcp", net.JoinHostPort(world.Canary.String(), "0"))
		if err != nil {
			return err
		}
		_, port, _ = net.SplitHostPort(ln.Addr().String())
		return ln.Close()
	}))
	return port
}

// TestSystemMintPullsFromAnImageServer: a box minted from images:ALIAS is
// pulled by incusd from the server the incus CLI's remotes name, with its
// certificate pinned, its download shown; the second mint downloads
// nothing; with the server down a cached image still mints, and one
// incusd never fetched fails naming the server, leaving nothing.
func TestSystemMintPullsFromAnImageServer(t *testing.T) {
	ctx, h, st := worldtest.Host(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	p := startPullServer(t, st)
	dead := "https://" + net.JoinHostPort(world.Canary.String(), deadPort(t, st))
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte(fmt.Sprintf(`remotes:
  images:
    addr: %s
    protocol: simplestreams
    public: true
  gone:
    addr: %s
    protocol: simplestreams
    public: true
`, p.url, dead)), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "servercerts"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "servercerts", "images.crt"), p.cert, 0o644))
	h.IncusConfigDir = dir
	var mu sync.Mutex
	var progress []string
	h.Progress = func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		progress = append(progress, fmt.Sprintf(format, args...))
	}
	t.Cleanup(func() { _ = h.Incus.Images().Delete(context.Background(), p.fp) })
	names := []string{stacktest.Name(t, "t-pull-"), stacktest.Name(t, "t-pull-"), stacktest.Name(t, "t-pull-"), stacktest.Name(t, "t-pull-")}
	t.Cleanup(func() {
		for _, n := range names {
			_ = boxes.NewManager(h).Remove(context.Background(), n)
		}
	})
	img := "images:" + p.alias
	rootfs := "/images/" + strings.TrimPrefix(p.alias, "box-pull/") + "/root.tar.xz"

	start := time.Now()
	b, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[0], Image: img})
	require.NoError(t, err)
	t.Logf("first mint (download) %s; progress: %q", time.Since(start).Round(time.Millisecond), progress)
	assert.Equal(t, p.fp, b.Stamps[model.StampFingerprint], "the fingerprint incusd resolved the alias to")
	assert.Equal(t, p.url, b.Stamps[model.StampImageServer])
	assert.Equal(t, img, b.Stamps[model.StampImage])
	assert.Positive(t, p.got(rootfs), "incusd downloaded the rootfs")
	mu.Lock()
	assert.Condition(t, func() bool {
		for _, l := range progress {
			if strings.HasPrefix(l, "minting "+names[0]+" from "+img+": rootfs: ") {
				return true
			}
		}
		return false
	}, "the download's progress was shown: %q", progress)
	mu.Unlock()
	cached, err := h.Incus.Images().Get(ctx, p.fp)
	require.NoError(t, err, "incusd keeps the image")
	assert.Equal(t, p.fp, cached.Fingerprint)

	downloads := p.got(rootfs)
	start = time.Now()
	b, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[1], Image: img})
	require.NoError(t, err)
	t.Logf("second mint (cached) %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, downloads, p.got(rootfs), "the second mint downloads nothing")
	assert.Equal(t, p.fp, b.Stamps[model.StampFingerprint])

	// The server down, the image cached: Incus mints from its cache.
	p.stop()
	b, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[2], Image: img})
	require.NoError(t, err, "a server down does not stop a mint of a cached image")
	assert.Equal(t, p.fp, b.Stamps[model.StampFingerprint])

	// A server never reached, the image never fetched: a clear error,
	// nothing made.
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[3], Image: "gone:" + p.alias})
	require.Error(t, err)
	t.Logf("server unreachable: %v", err)
	var pe *boxes.ImagePullError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, dead, pe.Server)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), "--image NAME")
	_, _, err = h.Incus.Instances().Get(ctx, names[3])
	assert.True(t, incus.IsNotFound(err), "no instance left: %v", err)
}

// The cluster system tier runs against a cluster world (testenv.Cluster):
// BOX_CLUSTER_STATE=/run/box-world/NAME/state.json go test ./stack/boxes -run
// TestSystemCluster. Each test converges the stack on every member (the
// stack stays: it is the cluster world's, and Ensure is idempotent) and
// removes every box it made; their names start with ca-.

// clusterWorld is the cluster world's stack, converged on every member:
// the host as box sees it from the first member (reading the others'
// layers through their namespaces), and the world.
func clusterWorld(t *testing.T) (context.Context, *stack.Host, *world.State) {
	t.Helper()
	st := testenv.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	c := incus.New(st.IncusSocket)
	_, err := image.Ensure(ctx, c, image.DefaultAlias, image.Options{})
	require.NoError(t, err)
	opts := model.Options{DNS: []netip.Addr{world.Resolver}}
	h := &stack.Host{Incus: c, NetNS: st.Names.HostNS, Options: opts, Members: stack.Membership{NetNS: st.MemberNetNS()}}
	_, err = h.Ensure(ctx)
	require.NoError(t, err)
	for _, m := range st.Members[1:] {
		_, err := (&stack.Host{Incus: incus.New(m.IncusSocket), NetNS: m.Name, Options: opts, Members: stack.Membership{Only: true}}).Ensure(ctx)
		require.NoError(t, err, "member %s", m.Name)
	}
	return ctx, h, st
}

// removeAtEnd removes boxes when the test ends, through box (so their
// ports leave every member's sets), whatever state they are in.
func removeAtEnd(t *testing.T, h *stack.Host, names ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, n := range names {
			var nsb *stack.NoSuchBoxError
			if err := boxes.NewManager(h).Remove(ctx, n); err != nil && !errors.As(err, &nsb) {
				t.Errorf("removing %s: %v", n, err)
			}
		}
	})
}

// memberSlices reads the members' address slices from the bridge.
func memberSlices(t *testing.T, ctx context.Context, h *stack.Host) map[string]netip.Prefix {
	t.Helper()
	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	out := map[string]netip.Prefix{}
	for k, v := range n.Config {
		if m, ok := strings.CutPrefix(k, "user.box.slice."); ok {
			out[m] = netip.MustParsePrefix(v)
		}
	}
	return out
}

// fixedAddress is the fixed address of a box's NIC.
func fixedAddress(t *testing.T, ctx context.Context, h *stack.Host, name string) (netip.Addr, *incus.Instance) {
	t.Helper()
	inst, _, err := h.Incus.Instances().Get(ctx, name)
	require.NoError(t, err)
	a, err := netip.ParseAddr(inst.ExpandedDevices["eth0"]["ipv4.address"])
	require.NoError(t, err, "%s has a fixed address", name)
	return a, inst
}

// memberPorts lists a member's ports on boxnet and the bridge drop's port
// set there.
func memberPorts(t *testing.T, member string) (ports, set []string) {
	t.Helper()
	ns, err := netns.GetFromName(member)
	require.NoError(t, err)
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer nh.Close()
	br, err := nh.LinkByName(model.Current.Network)
	require.NoError(t, err)
	links, err := nh.LinkList()
	require.NoError(t, err)
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports = append(ports, l.Attrs().Name)
		}
	}
	set, _, err = nft.PortSetMembers(nft.Config{Table: model.Current.NFTTable, Bridge: model.Current.Network, NetNS: int(ns)})
	require.NoError(t, err)
	return ports, set
}

// assertClean asserts Verify finds nothing, having read every member.
func assertClean(t *testing.T, ctx context.Context, h *stack.Host) {
	t.Helper()
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	for _, f := range v.Findings {
		// Advisory: a lease that outlived its instance, which goes at its
		// expiry (L-DHCP), is no layer gone.
		assert.True(t, f.Advisory, "%s", f)
	}
	for _, m := range v.Members {
		assert.Equal(t, stack.MemberClean, m.State, "member %s's layers were read and are clean", m.Member)
	}
}

// A box minted on each member gets a fixed address of that member's
// slice, no two alike; it is placed there, leases that address, runs
// commands and stops and starts from the member box runs on; removed, it
// leaves no port on its member.
func TestSystemClusterMintOnEveryMember(t *testing.T) {
	ctx, h, st := clusterWorld(t)
	sl := memberSlices(t, ctx, h)
	var names []string
	for range st.Members {
		names = append(names, stacktest.Name(t, "ca-mint-"))
	}
	removeAtEnd(t, h, names...)

	seen := map[netip.Addr]string{}
	for i, m := range st.Members {
		start := time.Now()
		b, err := boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: names[i], Image: image.DefaultAlias, Target: m.Name})
		require.NoError(t, err, "minting on %s", m.Name)
		t.Logf("minted %s on %s in %s", names[i], m.Name, time.Since(start).Round(time.Millisecond))
		assert.Equal(t, m.Name, b.Member)
		a, inst := fixedAddress(t, ctx, h, names[i])
		assert.Equal(t, m.Name, inst.Location)
		assert.True(t, sl[m.Name].Contains(a), "%s is in %s's slice %s", a, m.Name, sl[m.Name])
		assert.NotContains(t, seen, a, "no two boxes share an address")
		seen[a] = names[i]
		got, err := h.Addresses().Wait(ctx, names[i], 30*time.Second)
		require.NoError(t, err)
		assert.Equal(t, a, got, "it leases its fixed address")
	}
	assertClean(t, ctx, h)

	// A box on another member: exec, down and start from here.
	remote := names[2]
	res, err := h.Incus.Instances().Exec(ctx, remote, incus.ExecRequest{Command: []string{"hostname"}})
	require.NoError(t, err)
	assert.Equal(t, remote, strings.TrimSpace(string(res.Stdout)), "the command ran in the box on %s", st.Members[2].Name)
	a, inst := fixedAddress(t, ctx, h, remote)
	port := inst.Config["volatile.eth0.host_name"]
	require.NoError(t, boxes.NewManager(h).Stop(ctx, remote, false))
	_, set := memberPorts(t, st.Members[2].Name)
	assert.NotContains(t, set, port, "down takes its port out of %s's port set", st.Members[2].Name)
	require.NoError(t, boxes.NewManager(h).Start(ctx, remote))
	got, err := h.Addresses().Wait(ctx, remote, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, a, got, "the same address after a restart")
	assertClean(t, ctx, h)

	// rm of a box on another member takes its port out of that member's
	// bridge and port set.
	_, inst = fixedAddress(t, ctx, h, remote)
	port = inst.Config["volatile.eth0.host_name"]
	require.NotEmpty(t, port)
	ports, set := memberPorts(t, st.Members[2].Name)
	require.Contains(t, ports, port)
	require.Contains(t, set, port)
	require.NoError(t, boxes.NewManager(h).Remove(ctx, remote))
	ports, set = memberPorts(t, st.Members[2].Name)
	assert.NotContains(t, ports, port, "no port left on %s's bridge", st.Members[2].Name)
	assert.NotContains(t, set, port, "nor in its port set")
	assertClean(t, ctx, h)
}
