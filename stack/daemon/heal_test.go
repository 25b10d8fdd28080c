package daemon

import (
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

func TestClassifyNft(t *testing.T) {
	watched := func(f nftables.TableFamily, name string) bool {
		return (f == nftables.TableFamilyINet && (name == "box" || name == "incus")) || (f == nftables.TableFamilyBridge && name == "box")
	}
	inetBox := &nftables.Table{Family: nftables.TableFamilyINet, Name: "box"}
	other := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"}
	flush := func(pid uint32) *nftables.MonitorEvents {
		return &nftables.MonitorEvents{
			GeneratedBy: &nftables.MonitorEvent{Type: nftables.MonitorEventType(0x10), Data: &nftables.GenMsg{ProcPID: pid, ProcComm: "nft"}},
			Changes: []*nftables.MonitorEvent{
				{Type: nftables.MonitorEventTypeDelRule, Data: &nftables.Rule{Table: inetBox, Chain: &nftables.Chain{Name: "input"}}},
				{Type: nftables.MonitorEventTypeDelChain, Data: &nftables.Chain{Name: "input", Table: inetBox}},
				{Type: nftables.MonitorEventTypeDelTable, Data: inetBox},
				{Type: nftables.MonitorEventTypeDelTable, Data: other},
				{Type: nftables.MonitorEventTypeDelChain, Data: &nftables.Chain{Name: "acl.boxnet", Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "incus"}}},
			},
		}
	}
	notMine := func(uint32) bool { return false }
	what, ok := classifyNft(flush(42), notMine, watched)
	assert.True(t, ok)
	assert.Equal(t, "inet box: rules of chain input changed, inet box: chain input deleted, table inet box deleted, inet incus: chain acl.boxnet deleted by nft (pid 42)", what)

	_, ok = classifyNft(flush(42), func(pid uint32) bool { return pid == 42 }, watched)
	assert.False(t, ok, "the healer's own transaction")

	onlyOther := &nftables.MonitorEvents{Changes: []*nftables.MonitorEvent{{Type: nftables.MonitorEventTypeDelTable, Data: other}}}
	_, ok = classifyNft(onlyOther, notMine, watched)
	assert.False(t, ok, "a table box does not keep")

	elems := &nftables.MonitorEvents{Changes: []*nftables.MonitorEvent{{Type: nftables.MonitorEventTypeNewSetElem, Data: []nftables.SetElement{{}}}}}
	_, ok = classifyNft(elems, notMine, watched)
	assert.False(t, ok, "set elements are the port watcher's")
}

func TestOwnThread(t *testing.T) {
	assert.True(t, ownThread(uint32(unix.Gettid())), "this thread")
	assert.True(t, ownThread(uint32(os.Getpid())), "the main thread")
	assert.False(t, ownThread(0))
	assert.False(t, ownThread(1<<31))
}
