package drill_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/internal/syncbuf"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/templates"
)

// TestSystemDrillOnTemplateBoxes: the drill on the boxes people use. Its
// probe boxes are minted as box new mints the claude template's: copies
// of the template's image (built from images:debian/12/cloud through the
// world's image server and stand-ins when the world has none current),
// each reporting ready (cloud-init ran the copy's user-data) before the
// agent is pushed; every claim holds there, the discovery multicast
// Debian would send among the probes.
func TestSystemDrillOnTemplateBoxes(t *testing.T) {
	cfg := config(t)
	st := testenv.World(t)
	if st.DebianImage == "" {
		testenv.Unavailable(t, "needs the world's Debian image: run `bin/drill world image --debian` (minutes, once per machine)")
	}
	tpl, err := templates.Get("claude")
	require.NoError(t, err)
	cfg.Template, cfg.Image = tpl, tpl.Image
	cfg.Host.IncusConfigDir = st.IncusConf
	var log syncbuf.Buffer
	cfg.Log = io.MultiWriter(cfg.Log, &log)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := drill.Run(ctx, cfg)
	require.NoError(t, err)
	t.Logf("a run on the claude template's boxes took %s (probe phase %d ms, %d probes)", time.Since(start).Round(time.Second), rep.Summary.ProbePhaseMS, rep.Summary.Probes)
	for _, cr := range rep.Claims {
		assert.Equal(t, drill.Pass, cr.Verdict, "%s on Debian boxes", cr.ID)
	}
	assert.Equal(t, drill.ExitOK, rep.ExitCode)
	assert.Equal(t, "claude", rep.Environment.Template)
	assert.Equal(t, "images:debian/12/cloud", rep.Environment.Image)
	multicast := 0
	for _, r := range claim(t, rep, "C-SIBLING").Results {
		if r.Channel == drill.ChannelMDNS || r.Channel == drill.ChannelLLMNR || r.Channel == drill.ChannelSSDP {
			multicast++
			assert.Equal(t, drill.Pass, r.Verdict, "%s %s", r.Channel, r.Target)
		}
	}
	assert.Equal(t, 6, multicast, "mDNS, LLMNR and SSDP at each of the two peers")

	rec, err := boxes.ReadTemplateImages(boxes.TemplateImagesFile(st.Names.HostNS))
	require.NoError(t, err)
	ti, ok := rec["claude"]
	require.True(t, ok, "the run built or found claude's image")
	assert.Contains(t, log.String(), "boxes: template claude's image "+ti.Fingerprint[:12]+" (current; ready in ", "the probe boxes are copies of it")
	assert.Regexp(t, `boxes: drill-\S+-a provisioned from template claude in `, log.String(), "box-a reported ready")
}
