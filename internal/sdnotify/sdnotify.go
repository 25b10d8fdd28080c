// Package sdnotify tells systemd a service's state over $NOTIFY_SOCKET
// (sd_notify(3)'s protocol: one datagram of NAME=VALUE lines), with no
// library: a unit of Type=notify is started once the service says READY=1.
// Outside such a unit ($NOTIFY_SOCKET unset) every call does nothing.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Ready says READY=1. It reports whether a notify socket was there.
func Ready() (bool, error) { return send(os.Getenv("NOTIFY_SOCKET"), "READY=1") }

// send writes state to the socket at path ("@name" is in the abstract
// namespace, as systemd may pass it).
func send(path, state string) (bool, error) {
	if path == "" {
		return false, nil
	}
	addr := &net.UnixAddr{Name: path, Net: "unixgram"}
	if path[0] == '@' {
		addr.Name = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return true, fmt.Errorf("telling systemd %s: %w", state, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return true, fmt.Errorf("telling systemd %s: %w", state, err)
	}
	return true, nil
}
