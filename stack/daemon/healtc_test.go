package daemon

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// linkMsg is an RTM_NEWLINK message for a link of this name, as the
// kernel sends it.
func linkMsg(name string) syscall.NetlinkMessage {
	data := nl.NewIfInfomsg(unix.AF_UNSPEC).Serialize()
	data = append(data, nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)).Serialize()...)
	return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWLINK}, Data: data}
}

// The guard's check hears tc's changes and the bridge's own link, not
// every port's.
func TestTCEventsTheGuardHears(t *testing.T) {
	msg := func(typ uint16) syscall.NetlinkMessage {
		return syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: typ}}
	}
	for typ, want := range map[uint16]string{
		unix.RTM_DELQDISC: "a tc qdisc or filter deleted", unix.RTM_DELTFILTER: "a tc qdisc or filter deleted",
		unix.RTM_NEWQDISC: "a tc qdisc or filter added", unix.RTM_NEWTFILTER: "a tc qdisc or filter added",
	} {
		what, ok := tcEvent(msg(typ), "boxnet")
		assert.True(t, ok, typ)
		assert.Equal(t, want, what)
	}
	what, ok := tcEvent(linkMsg("boxnet"), "boxnet")
	assert.True(t, ok)
	assert.Equal(t, "link boxnet changed", what)
	_, ok = tcEvent(linkMsg("vethb0c5"), "boxnet")
	assert.False(t, ok, "a box's port is the port watcher's")
	_, ok = tcEvent(linkMsg("boxnet2"), "boxnet")
	assert.False(t, ok)
	_, ok = tcEvent(msg(unix.RTM_NEWLINK), "boxnet")
	assert.False(t, ok, "a message cut short")
	_, ok = tcEvent(msg(unix.RTM_NEWROUTE), "boxnet")
	assert.False(t, ok)
}
