package drill

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/stack"
	"github.com/box-isolation/box/stack/incus"
	"github.com/box-isolation/box/stack/incus/incustest"
	"github.com/box-isolation/box/stack/model"
	"github.com/box-isolation/box/templates"
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

// sideBySide is a run whose claims have the setup and mint hooks given,
// with an empty report and maps, as mintBoxes leaves them.
func sideBySide(template bool, claims ...Claim) *run {
	r := &run{cfg: Config{Claims: claims}, rep: &Report{}, names: map[Place]string{}, ends: map[Place]*BoxEnd{},
		skipped: map[ClaimID]string{}, state: claimStates{}, projects: map[Place]string{}}
	if template {
		r.cfg.Template = &templates.Template{Name: "t"}
	}
	return r
}

// TestMintSideBySide: the claims' setups run first, one after the other;
// then the common boxes and every claim's box are minted at once (each
// mint here waits for the others to have started, which one after the
// other never happens); in a template run the common boxes come first;
// the first error cancels the rest and is the one returned.
func TestMintSideBySide(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var events []string
	event := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	// meet has n mints wait for each other.
	meet := func(n int) func(context.Context, string) error {
		var wg sync.WaitGroup
		wg.Add(n)
		return func(ctx context.Context, who string) error {
			event("start " + who)
			wg.Done()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
				return nil
			case <-time.After(5 * time.Second):
				return fmt.Errorf("%s waited alone: the mints ran one after the other", who)
			}
		}
	}
	at := meet(3)
	mintAs := func(who string, p Place) func(context.Context, *run) error {
		return func(ctx context.Context, r *run) error {
			if err := at(ctx, who); err != nil {
				return err
			}
			r.addBox(&BoxEnd{Place: p, Instance: r.name(p, "drill-x-"+who)})
			return nil
		}
	}
	setup := func(who string) func(context.Context, *run) error {
		return func(context.Context, *run) error { event("setup " + who); return nil }
	}
	r := sideBySide(false, Claim{ID: "C-ONE", setup: setup("one"), mint: mintAs("w", PlaceW)}, Claim{ID: "C-TWO", setup: setup("two"), mint: mintAs("t", PlaceT)})
	err := r.mintSideBySide(ctx, func(ctx context.Context) error {
		if err := at(ctx, "common"); err != nil {
			return err
		}
		for _, p := range []Place{PlaceC, PlaceA, PlaceB} {
			r.addBox(&BoxEnd{Place: p})
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"setup one", "setup two"}, events[:2], "the setups first, in the claims' order")
	assert.Len(t, events, 5)
	assert.Equal(t, "drill-x-w", r.names[PlaceW])
	assert.Len(t, r.ends, 5)
	sortBoxes(r.rep.Boxes)
	var order []Place
	for _, b := range r.rep.Boxes {
		order = append(order, b.Place)
	}
	assert.Equal(t, []Place{PlaceA, PlaceB, PlaceC, PlaceT, PlaceW}, order, "the report's boxes in a stable order")

	t.Run("template", func(t *testing.T) {
		common := false
		r := sideBySide(true, Claim{ID: "C-ONE", mint: func(context.Context, *run) error {
			if !common {
				return errors.New("a claim's box minted before box-a")
			}
			return nil
		}})
		require.NoError(t, r.mintSideBySide(ctx, func(context.Context) error { common = true; return nil }))
	})
	t.Run("first error", func(t *testing.T) {
		boom := errors.New("boom")
		r := sideBySide(false, Claim{ID: "C-ONE", mint: func(context.Context, *run) error { return boom }},
			Claim{ID: "C-TWO", mint: func(ctx context.Context, _ *run) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(5 * time.Second):
					return errors.New("not cancelled")
				}
			}})
		err := r.mintSideBySide(ctx, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
		assert.Equal(t, boom, err)
	})
	t.Run("setup error", func(t *testing.T) {
		boom := errors.New("boom")
		minted := false
		r := sideBySide(false, Claim{ID: "C-ONE", setup: func(context.Context, *run) error { return boom }})
		err := r.mintSideBySide(ctx, func(context.Context) error { minted = true; return nil })
		assert.Equal(t, boom, err)
		assert.False(t, minted, "nothing minted after a setup failed")
	})
}
