package drill_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/internal/testenv"
	"github.com/box-isolation/box/templates"
)

// TestSystemDrillOnTemplateBoxes: the drill on the boxes people use. Its
// probe boxes are minted as box new mints the claude template's, from
// images:debian/12/cloud pulled through the world's image server, each
// provisioned (cloud-init ran the template's user-data, installed the
// agent from the stand-ins and wrote the ready marker) before the agent
// is pushed; every claim holds there, the discovery multicast Debian would
// send among the probes.
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
}
