package stack

import (
	"os"
	"path/filepath"
	"strconv"

	"github.com/box-isolation/box/stack/incus"
)

// incus-user keeps, per uid, a directory under INCUS_DIR/users holding
// the client certificate it presents to incusd for that user. On each
// connection it runs its stock setup (a project with a private NAT bridge,
// IPv6 on and the user's home directory attachable) unless that directory
// exists and the project was in incusd's project list when incus-user
// started (or was set up by it since). Its setup starts with MkdirAll of
// that directory: a regular file in its place makes the setup fail before
// it touches incusd, which is how a purged uid stays purged.

// ServerDir is INCUS_DIR of the incusd c talks to: where its socket is.
func ServerDir(c *incus.Client) string { return filepath.Dir(c.Socket()) }

// Socket is incus-user's socket beside c's incusd: UserSocket, else
// unix.socket.user beside incusd's.
func (t TierConfig) Socket(c *incus.Client) string {
	if t.UserSocket != "" {
		return t.UserSocket
	}
	return filepath.Join(ServerDir(c), "unix.socket.user")
}

// UserStatePath is incus-user's state directory (or, once purged, box's
// tombstone) for uid, under INCUS_DIR dir.
func UserStatePath(dir string, uid uint32) string {
	return filepath.Join(dir, "users", strconv.FormatUint(uint64(uid), 10))
}

// Tombstoned reports whether uid's state under INCUS_DIR dir is box's
// purge tombstone.
func Tombstoned(dir string, uid uint32) bool {
	fi, err := os.Lstat(UserStatePath(dir, uid))
	return err == nil && fi.Mode().IsRegular()
}
