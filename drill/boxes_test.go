package drill

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
)

// probeHost is a fake incusd that reports driver and holds three running
// probe boxes of type instType on boxnet.
func probeHost(t *testing.T, driver, instType string) *stack.Host {
	t.Helper()
	srv := incustest.New(t)
	srv.Drivers(driver)
	srv.Handle("GET /1.0/networks/{name}", func(w http.ResponseWriter, r *http.Request) {
		incustest.Sync(w, map[string]any{"name": r.PathValue("name"), "config": map[string]string{"ipv4.address": "10.88.0.1/24"}})
	})
	last := map[string]int{"drill-0a1b2c-a": 11, "drill-0a1b2c-b": 12, "drill-0a1b2c-c": 13}
	srv.Handle("GET /1.0/instances/{name}", func(w http.ResponseWriter, r *http.Request) {
		n := last[r.PathValue("name")]
		incustest.Sync(w, map[string]any{"name": r.PathValue("name"), "status": "Running", "type": instType,
			"config": map[string]string{"volatile.eth0.hwaddr": fmt.Sprintf("00:16:3e:00:00:%02x", n)}})
	})
	srv.Handle("GET /1.0/instances/{name}/state", func(w http.ResponseWriter, r *http.Request) {
		n := last[r.PathValue("name")]
		incustest.Sync(w, map[string]any{"status": "Running", "network": map[string]any{
			"eth0": map[string]any{"addresses": []map[string]string{{"family": "inet", "address": fmt.Sprintf("10.88.0.%d", n), "netmask": "24", "scope": "global"}}}}})
	})
	return &stack.Host{Incus: incus.New(srv.Socket())}
}

// TestReportSaysWhichKindOfBoxItProved: the report's instance type is read
// from the minted boxes, and where box new (the same decision) makes
// another kind on the host, a note says the run did not drill it.
func TestReportSaysWhichKindOfBoxItProved(t *testing.T) {
	for _, tc := range []struct {
		name, driver, minted string
		boxNew               string
		note                 string // in the notes; empty: no note
	}{
		{name: "a host that can run VMs, container probes", driver: "lxc | qemu", minted: "container", boxNew: "virtual-machine",
			note: "instance type: the probe boxes are container, but box new makes virtual-machine on this host (this host can run VMs)"},
		{name: "a container-only host", driver: "lxc", minted: "container", boxNew: "container"},
		{name: "VM probes where box new makes VMs", driver: "lxc | qemu", minted: "virtual-machine", boxNew: "virtual-machine"},
		{name: "VM probes where box new makes containers", driver: "lxc", minted: "virtual-machine", boxNew: "container",
			note: "the probe boxes are virtual-machine, but box new makes container on this host (this host cannot run VMs (incus drivers: lxc))"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := probeHost(t, tc.driver, tc.minted)
			// What preflight and mintBoxes do, short of minting.
			srv, err := h.Incus.Server(ctx)
			require.NoError(t, err)
			boxNew, err := model.DecideType(srv, "")
			require.NoError(t, err)
			rep := &Report{Notes: []string{}}
			for _, p := range []Place{PlaceA, PlaceB, PlaceC} {
				e, err := boxEnd(ctx, h, p, map[Place]string{PlaceA: "drill-0a1b2c-a", PlaceB: "drill-0a1b2c-b", PlaceC: "drill-0a1b2c-c"}[p])
				require.NoError(t, err)
				rep.Boxes = append(rep.Boxes, *e)
			}
			noteInstanceType(rep, boxNew)

			assert.Equal(t, tc.minted, rep.Environment.InstanceType, "what was minted")
			assert.Equal(t, tc.boxNew, rep.Environment.BoxNewType, "what box new makes")
			if tc.note == "" {
				assert.Empty(t, rep.Notes)
				return
			}
			require.Len(t, rep.Notes, 1)
			assert.Contains(t, rep.Notes[0], tc.note)
		})
	}
}

func TestMixedProbeTypesAreAllNamed(t *testing.T) {
	rep := &Report{Boxes: []BoxEnd{{Type: "virtual-machine"}, {Type: "container"}, {Type: "container"}}}
	noteInstanceType(rep, model.TypeDecision{Type: model.TypeContainer, Reason: "this host cannot run VMs (incus drivers: lxc)"})
	assert.Equal(t, "container, virtual-machine", rep.Environment.InstanceType)
	require.Len(t, rep.Notes, 1, "mixed probe boxes are not the one kind box new makes")
}
