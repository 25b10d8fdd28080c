package access

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/box-isolation/box/stack"
)

// userCert is a client certificate in incus-user's layout.
type userCert struct {
	DER         []byte
	Fingerprint string
}

func certOf(der []byte) userCert {
	sum := sha256.Sum256(der)
	return userCert{DER: der, Fingerprint: hex.EncodeToString(sum[:])}
}

// IncusUserProc is a running incus-user serving this host's incusd.
type IncusUserProc struct {
	PID int `json:"pid"`
	// Activated: started by socket activation (systemd's incus-user.socket
	// or the world's stand-in), so ending it is a restart: the next
	// connection starts a fresh one that reads incusd's projects again.
	Activated bool `json:"activated"`
}

// waitExit waits until pid is gone (or a zombie) or limit passes.
func waitExit(ctx context.Context, pid int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeTombstone replaces uid's incus-user state with a file, so incus-user
// can never set the uid up again until a grant removes it.
func (m *Manager) writeTombstone(uid uint32) error {
	host := m.host
	p := stack.UserStatePath(stack.ServerDir(host.Incus), uid)
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("removing incus-user's state for uid %d: %w", uid, err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	msg := fmt.Sprintf("uid %d was purged by box revoke --purge at %s.\nThis file stops incus-user from setting the uid up again (its stock project is unhardened); box grant removes it.\n",
		uid, time.Now().UTC().Format(time.RFC3339))
	if err := os.WriteFile(p, []byte(msg), 0o600); err != nil {
		return fmt.Errorf("writing the purge tombstone %s: %w", p, err)
	}
	return nil
}

// readUserCert reads uid's client certificate; ok is false when there is
// none (or only half of it).
func (m *Manager) readUserCert(uid uint32) (userCert, bool, error) {
	host := m.host
	dir := stack.UserStatePath(stack.ServerDir(host.Incus), uid)
	crt, err := os.ReadFile(filepath.Join(dir, "client.crt"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return userCert{}, false, nil
	}
	if err != nil {
		return userCert{}, false, fmt.Errorf("reading %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "client.key")); err != nil {
		return userCert{}, false, nil
	}
	blk, _ := pem.Decode(crt)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return userCert{}, false, fmt.Errorf("%s/client.crt is not a PEM certificate", dir)
	}
	return certOf(blk.Bytes), true, nil
}

// writeUserCert makes a client certificate for uid as incus-user would
// (ECDSA P-384, self-signed, for client authentication).
func (m *Manager) writeUserCert(uid uint32, name string) (userCert, error) {
	host := m.host
	dir := stack.UserStatePath(stack.ServerDir(host.Incus), uid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return userCert{}, fmt.Errorf("creating %s: %w", dir, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		return userCert{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return userCert{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"Linux Containers"}, CommonName: name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return userCert{}, fmt.Errorf("making a client certificate: %w", err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return userCert{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "client.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return userCert{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "client.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return userCert{}, err
	}
	return certOf(der), nil
}

// IncusUsers lists the incus-user processes serving this host's incusd.
func (m *Manager) IncusUsers() []IncusUserProc {
	host := m.host
	dir := stack.ServerDir(host.Incus)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []IncusUserProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Base(strings.TrimSuffix(exe, " (deleted)")) != "incus-user" {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		env := "\x00" + string(b)
		envDir := "/var/lib/incus"
		if i := strings.Index(env, "\x00INCUS_DIR="); i >= 0 {
			envDir, _, _ = strings.Cut(env[i+len("\x00INCUS_DIR="):], "\x00")
		}
		if filepath.Clean(envDir) != filepath.Clean(dir) {
			continue
		}
		out = append(out, IncusUserProc{PID: pid, Activated: strings.Contains(env, "\x00LISTEN_FDS=")})
	}
	return out
}

// restartIncusUser ends every socket-activated incus-user of this incusd
// (the next connection starts a fresh one) and refuses one started by hand,
// which nothing would start again. It returns the PIDs it ended.
func (m *Manager) restartIncusUser(ctx context.Context) ([]int, error) {
	procs := m.IncusUsers()
	for _, p := range procs {
		if !p.Activated {
			return nil, fmt.Errorf("incus-user (pid %d) was started by hand, not socket-activated: box cannot restart it, and until it restarts it would re-run its stock setup for this user; run it from incus-user.socket (systemctl enable --now incus-user.socket) and try again", p.PID)
		}
	}
	var ended []int
	for _, p := range procs {
		if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			return ended, fmt.Errorf("restarting incus-user (pid %d): %w", p.PID, err)
		}
		if !waitExit(ctx, p.PID, 10*time.Second) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
			if !waitExit(ctx, p.PID, 5*time.Second) {
				return ended, fmt.Errorf("incus-user (pid %d) did not exit", p.PID)
			}
		}
		ended = append(ended, p.PID)
	}
	return ended, nil
}
