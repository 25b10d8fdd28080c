package incus

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DialFunc opens a TCP connection, as net.Dialer.DialContext does; the
// hermetic world's tests dial inside a network namespace with one.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// RemoteTLS is what a client of another Incus over HTTPS presents and
// trusts.
type RemoteTLS struct {
	// Client is the client certificate and key the server trusts
	// (client.crt and client.key in the incus CLI's config directory).
	Client tls.Certificate
	// Server is the server's certificate pinned when the remote was added
	// (servercerts/NAME.crt); nil trusts the system's CAs instead.
	Server *x509.Certificate
	// Dial opens the TCP connection; nil is a plain net.Dialer.
	Dial DialFunc
}

// NewRemote returns a client for the Incus at addr (https://HOST:PORT),
// presenting t.Client and accepting only t.Server (when pinned). Like New
// it never dials here.
func NewRemote(addr string, t RemoteTLS) (*Client, error) {
	u, err := url.Parse(addr)
	if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("remote address %q: want https://HOST[:PORT]", addr)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "8443")
	}
	base := "https://" + host
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{t.Client}}
	if t.Server != nil {
		// The pin is the trust, as for the incus CLI: a self-signed
		// server certificate names no host we could check.
		pinned := t.Server.Raw
		cfg.InsecureSkipVerify = true
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || !bytes.Equal(raw[0], pinned) {
				return fmt.Errorf("the server at %s presented a certificate other than the one pinned for it (fingerprint %s): if it was reinstalled, remove the remote and add it again with a new token", base, Fingerprint(t.Server))
			}
			return nil
		}
	}
	dial := t.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			conn, err := dial(ctx, network, a)
			if err != nil && ctx.Err() == nil {
				return nil, &UnreachableError{Socket: base, Err: err}
			}
			return conn, err
		},
		TLSClientConfig:     cfg,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{socket: base, base: base, http: &http.Client{Transport: tr}}, nil
}

// Fingerprint is a certificate's fingerprint as Incus prints it: the
// SHA-256 of its DER form, in hex.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// TrustToken is what `incus config trust add NAME` prints, decoded: the
// server's certificate fingerprint and addresses, and the secret a client
// presents once to be trusted.
type TrustToken struct {
	ClientName  string    `json:"client_name"`
	Fingerprint string    `json:"fingerprint"`
	Addresses   []string  `json:"addresses"`
	Secret      string    `json:"secret"`
	ExpiresAt   time.Time `json:"expires_at"`
	// Raw is the token as issued: what the client presents (Incus finds
	// the secret in it).
	Raw string `json:"-"`
}

// ParseTrustToken decodes a trust token (base64 of JSON).
func ParseTrustToken(s string) (TrustToken, error) {
	s = strings.TrimSpace(s)
	var raw []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if raw, err = enc.DecodeString(s); err == nil {
			break
		}
	}
	bad := errors.New("not a trust token: on the server, incus config trust add NAME prints one")
	if err != nil {
		return TrustToken{}, bad
	}
	var t TrustToken
	if err := json.Unmarshal(raw, &t); err != nil || t.Secret == "" || t.Fingerprint == "" {
		return TrustToken{}, bad
	}
	t.Raw = s
	return t, nil
}

// ServerCertificate connects to addr and returns the certificate the
// server presents, unverified: the caller checks it against a
// fingerprint it got another way (a trust token's).
func ServerCertificate(ctx context.Context, addr string, dial DialFunc) (*x509.Certificate, error) {
	u, err := url.Parse(addr)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("remote address %q: want https://HOST[:PORT]", addr)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "8443")
	}
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	conn, err := dial(ctx, "tcp", host)
	if err != nil {
		return nil, &UnreachableError{Socket: "https://" + host, Err: err}
	}
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // checked against the token's fingerprint by the caller
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS with %s: %w", host, err)
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("TLS with %s: the server presented no certificate", host)
	}
	return certs[0], nil
}

// JoinRemote has the Incus at addr trust client, as `incus remote add`
// does with a token: the server's certificate must be the one the token
// names (so nobody in between can take the secret), then the client
// presents the token once with its own certificate. It returns
// the server's certificate, to pin.
func JoinRemote(ctx context.Context, addr string, token TrustToken, client tls.Certificate, dial DialFunc) (*x509.Certificate, error) {
	srv, err := ServerCertificate(ctx, addr, dial)
	if err != nil {
		return nil, err
	}
	if fp := Fingerprint(srv); !strings.EqualFold(fp, token.Fingerprint) {
		return nil, fmt.Errorf("the server at %s presents the certificate %s, not the %s the token was issued by: wrong address, or someone in between; nothing was sent", addr, fp, token.Fingerprint)
	}
	c, err := NewRemote(addr, RemoteTLS{Client: client, Server: srv, Dial: dial})
	if err != nil {
		return nil, err
	}
	req := map[string]any{"type": "client", "trust_token": token.Raw}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: apiPath("certificates"), json: req}); err != nil {
		return nil, fmt.Errorf("presenting the trust token to %s: %w (a token is good once and expires: ask for a new one, incus config trust add NAME on the server)", addr, err)
	}
	trusted, err := c.Trusted(ctx)
	if err != nil {
		return nil, err
	}
	if !trusted {
		return nil, fmt.Errorf("%s took the token but does not trust this client: ask its admin (incus config trust list)", addr)
	}
	return srv, nil
}

// Trusted says whether the server trusts this client (GET /1.0's auth).
func (c *Client) Trusted(ctx context.Context) (bool, error) {
	var srv struct {
		Auth string `json:"auth"`
	}
	if _, err := c.get(ctx, apiPath(), nil, &srv); err != nil {
		return false, fmt.Errorf("asking %s whether it trusts this client: %w", c.socket, err)
	}
	return srv.Auth == "trusted", nil
}

// NewClientCertificate makes a self-signed client certificate and key in
// PEM, as the incus CLI makes its client.crt and client.key (ECDSA P-384,
// ten years).
func NewClientCertificate(commonName string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("making a client key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, fmt.Errorf("making a client certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"box"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("making a client certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the client key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// ParseCertificatePEM reads one PEM certificate.
func ParseCertificatePEM(pemBytes []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(pemBytes)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// keyFileMode is the only mode a client key may have: it is the
// identity the remote trusts.
const keyFileMode = 0o600

// checkKeyMode refuses a client key others may read.
func checkKeyMode(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is mode %04o: a client key is for its owner only (chmod 600 %s)", path, st.Mode().Perm(), path)
	}
	return nil
}

func pemEncode(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
