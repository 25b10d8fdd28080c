package incus_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack/incus"
)

// fakeRemote is an Incus over HTTPS that trusts a client once it presented
// the token's secret with its certificate, and answers /1.0 and
// /1.0/instances to trusted clients only.
type fakeRemote struct {
	srv     *httptest.Server
	secret  string
	mu      sync.Mutex
	trusted map[string]bool
	posted  []string // bodies of POST /1.0/certificates
}

func newFakeRemote(t *testing.T, certs ...tls.Certificate) *fakeRemote {
	t.Helper()
	f := &fakeRemote{secret: "s3cret", trusted: map[string]bool{}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert, Certificates: certs}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRemote) serve(w http.ResponseWriter, r *http.Request) {
	fp := ""
	if len(r.TLS.PeerCertificates) > 0 {
		sum := sha256.Sum256(r.TLS.PeerCertificates[0].Raw)
		fp = hex.EncodeToString(sum[:])
	}
	f.mu.Lock()
	trusted := f.trusted[fp]
	f.mu.Unlock()
	reply := func(meta any) {
		json.NewEncoder(w).Encode(map[string]any{"type": "sync", "status": "Success", "status_code": 200, "metadata": meta}) //nolint:errcheck
	}
	deny := func() {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": "not authorized", "error_code": 403}) //nolint:errcheck
	}
	switch {
	case r.URL.Path == "/1.0":
		auth := "untrusted"
		if trusted {
			auth = "trusted"
		}
		reply(map[string]any{"auth": auth})
	case r.URL.Path == "/1.0/certificates" && r.Method == http.MethodPost:
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.posted = append(f.posted, string(body))
		f.mu.Unlock()
		var req struct {
			TrustToken string `json:"trust_token"`
		}
		json.Unmarshal(body, &req) //nolint:errcheck
		tok, err := incus.ParseTrustToken(req.TrustToken)
		if fp == "" || err != nil || tok.Secret != f.secret {
			deny()
			return
		}
		f.mu.Lock()
		f.trusted[fp] = true
		f.mu.Unlock()
		reply(map[string]any{})
	case !trusted:
		deny()
	case r.URL.Path == "/1.0/instances":
		reply([]map[string]any{{"name": "work", "project": r.URL.Query().Get("project")}})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (f *fakeRemote) token(t *testing.T, fingerprint string) incus.TrustToken {
	t.Helper()
	return f.tokenWith(t, fingerprint, f.secret)
}

func (f *fakeRemote) tokenWith(t *testing.T, fingerprint, secret string) incus.TrustToken {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"client_name": "laptop", "fingerprint": fingerprint, "addresses": []string{strings.TrimPrefix(f.srv.URL, "https://")}, "secret": secret, "expires_at": "0001-01-01T00:00:00Z"})
	require.NoError(t, err)
	tok, err := incus.ParseTrustToken(base64.StdEncoding.EncodeToString(raw))
	require.NoError(t, err)
	return tok
}

func (f *fakeRemote) fingerprint() string {
	return incus.Fingerprint(f.srv.Certificate())
}

func TestAddRemoteWithAToken(t *testing.T) {
	ctx := context.Background()
	f := newFakeRemote(t)
	dir := t.TempDir()
	// The operator's config already has a remote of their own: it stays.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte("default-remote: local\nremotes:\n  mine:\n    addr: https://incus.example.test:8443\n    protocol: incus\n  local:\n    addr: unix://\naliases:\n  ll: list\n"), 0o644))

	rem, err := incus.AddRemote(ctx, dir, "far", f.srv.URL, f.token(t, f.fingerprint()), nil)
	require.NoError(t, err)
	assert.Len(t, f.posted, 1, "the token is presented once")
	assert.Contains(t, f.posted[0], `"trust_token":"ey`, "the token as issued")

	st, err := os.Stat(filepath.Join(dir, incus.ClientKeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the client key is its owner's only")

	rs, err := incus.LoadRemotes(dir)
	require.NoError(t, err)
	assert.Contains(t, rs, "mine", "the operator's remote is kept")
	got := rs["far"]
	assert.Equal(t, f.srv.URL, got.Addr)
	assert.Equal(t, "incus", got.Protocol)
	assert.Equal(t, "default", got.Project)
	assert.Equal(t, rem.Certificate, got.Certificate, "the server's certificate is pinned")
	raw, _ := os.ReadFile(filepath.Join(dir, "config.yml"))
	assert.Contains(t, string(raw), "ll: list", "the rest of the file is kept")

	c, err := got.Client(dir, nil)
	require.NoError(t, err)
	trusted, err := c.Trusted(ctx)
	require.NoError(t, err)
	assert.True(t, trusted)
	insts, err := c.Instances().List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, insts, 1)
	assert.Equal(t, "default", c.ProjectName())

	_, err = incus.AddRemote(ctx, dir, "far", f.srv.URL, f.token(t, f.fingerprint()), nil)
	require.ErrorContains(t, err, "there is a remote named far already")
}

func TestAddRemoteRefusesAnotherServer(t *testing.T) {
	f := newFakeRemote(t)
	dir := t.TempDir()
	_, err := incus.AddRemote(context.Background(), dir, "far", f.srv.URL, f.token(t, strings.Repeat("ab", 32)), nil)
	require.ErrorContains(t, err, "not the "+strings.Repeat("ab", 32)+" the token was issued by")
	assert.Empty(t, f.posted, "the secret is never sent to a server the token does not name")
	_, err = os.Stat(filepath.Join(dir, "config.yml"))
	assert.True(t, os.IsNotExist(err), "no remote recorded")
}

func TestAddRemoteWrongSecret(t *testing.T) {
	f := newFakeRemote(t)
	tok := f.tokenWith(t, f.fingerprint(), "guess")
	_, err := incus.AddRemote(context.Background(), t.TempDir(), "far", f.srv.URL, tok, nil)
	require.ErrorContains(t, err, "presenting the trust token")
	assert.Contains(t, err.Error(), "ask for a new one")
}

func TestRemotePinRefusesAnotherCertificate(t *testing.T) {
	ctx := context.Background()
	f := newFakeRemote(t)
	dir := t.TempDir()
	_, err := incus.AddRemote(ctx, dir, "far", f.srv.URL, f.token(t, f.fingerprint()), nil)
	require.NoError(t, err)
	// Another server at the same address: its certificate is not the pin.
	certPEM, keyPEM, err := incus.NewClientCertificate("impostor")
	require.NoError(t, err)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	other := newFakeRemote(t, pair)
	rs, err := incus.LoadRemotes(dir)
	require.NoError(t, err)
	r := rs["far"]
	r.Addr = other.srv.URL
	c, err := r.Client(dir, nil)
	require.NoError(t, err)
	_, err = c.Instances().List(ctx, nil)
	require.ErrorContains(t, err, "other than the one pinned for it")
}

func TestClientKeyModeIsChecked(t *testing.T) {
	f := newFakeRemote(t)
	dir := t.TempDir()
	_, err := incus.AddRemote(context.Background(), dir, "far", f.srv.URL, f.token(t, f.fingerprint()), nil)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(filepath.Join(dir, incus.ClientKeyFile), 0o644))
	rs, err := incus.LoadRemotes(dir)
	require.NoError(t, err)
	_, err = rs["far"].Client(dir, nil)
	require.ErrorContains(t, err, "chmod 600")
}

func TestParseTrustToken(t *testing.T) {
	_, err := incus.ParseTrustToken("not a token")
	require.ErrorContains(t, err, "incus config trust add NAME prints one")
	_, err = incus.ParseTrustToken(base64.StdEncoding.EncodeToString([]byte(`{"client_name":"x"}`)))
	require.Error(t, err, "a token without a secret and fingerprint")
}
