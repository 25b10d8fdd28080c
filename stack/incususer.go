package stack

import (
	"os"
	"path/filepath"
	"strconv"
)

// incus-user keeps, per uid, a directory under INCUS_DIR/users holding
// the client certificate it presents to incusd for that user. On each
// connection it runs its stock setup (a project with a private NAT bridge,
// IPv6 on and the user's home directory attachable) unless that directory
// exists and the project was in incusd's project list when incus-user
// started (or was set up by it since). Its setup starts with MkdirAll of
// that directory: a regular file in its place makes the setup fail before
// it touches incusd, which is how a purged uid stays purged.

// ServerDir is INCUS_DIR of the host's incusd: where its socket is.
func (host *Host) ServerDir() string { return filepath.Dir(host.Incus.Socket()) }

// UserSocket is incus-user's socket: IncusUserSocket, else
// unix.socket.user beside incusd's.
func (host *Host) UserSocket() string {
	if host.Tier.UserSocket != "" {
		return host.Tier.UserSocket
	}
	return filepath.Join(host.ServerDir(), "unix.socket.user")
}

// UserState is incus-user's directory (or, once purged, tombstone) for uid.
func (host *Host) UserState(uid uint32) string {
	return filepath.Join(host.ServerDir(), "users", strconv.FormatUint(uint64(uid), 10))
}

// UserStatePath is incus-user's state (or box's purge tombstone) for uid.
func (host *Host) UserStatePath(uid uint32) string { return host.UserState(uid) }

// Tombstoned reports whether uid's state is box's purge tombstone.
func (host *Host) Tombstoned(uid uint32) bool {
	fi, err := os.Lstat(host.UserState(uid))
	return err == nil && fi.Mode().IsRegular()
}
