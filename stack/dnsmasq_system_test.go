package stack_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/box-isolation/box/stack/stacktest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/image"
	"github.com/box-isolation/box/stack/boxes"
	"github.com/box-isolation/box/stack/model"
)

// TestSystemHandEditedDnsmasq: an operator sets the bridge's dnsmasq
// settings by hand through a shell's command substitution, which strips
// the trailing newline Incus then stores none of. Box's next changes must
// not glue a line of theirs to the operator's last one (dnsmasq then
// refuses to start: "bad option"): a box's first allowlist leaves the
// settings alone (the allowlist is box's resolver's, not dnsmasq's), and a
// converge writes them whole, every line ended; dnsmasq serves the bridge
// throughout.
func TestSystemHandEditedDnsmasq(t *testing.T) {
	ctx, h, st := worldHost(t)
	_, err := h.Ensure(ctx)
	require.NoError(t, err)
	box := stacktest.Name(t, "t-raw-")
	t.Cleanup(func() { _ = boxes.NewManager(h).Remove(context.Background(), box) })
	_, err = boxes.NewManager(h).Mint(ctx, boxes.MintRequest{Name: box, Image: image.DefaultAlias})
	require.NoError(t, err)

	n, _, err := h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(n.Config["raw.dnsmasq"], "\n"), "\n")
	lines = append(lines, "log-async")
	// As an operator types it: printf's last newline is stripped by $(...).
	cmd := exec.CommandContext(ctx, "sh", "-c", `incus network set `+model.Current.Network+` raw.dnsmasq="$(printf '%s\n' "$@")"`, "sh")
	cmd.Args = append(cmd.Args, lines...)
	cmd.Env = append(os.Environ(), "INCUS_DIR="+st.IncusDir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	edited := n.Config["raw.dnsmasq"]
	require.True(t, strings.HasSuffix(edited, "log-async"), "Incus stored it with no newline at the end: %q", edited)

	t0 := time.Now()
	ch, err := boxes.NewManager(h).SetEgress(ctx, box, []string{"canary.example.net"})
	require.NoError(t, err, "the change after the hand edit")
	t.Logf("new policy %v in %s", ch.NewPolicy, time.Since(t0).Round(time.Millisecond))
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	assert.Equal(t, edited, n.Config["raw.dnsmasq"], "an allowlist writes nothing into dnsmasq's settings")
	v, err := h.Verify(ctx)
	require.NoError(t, err)
	assert.NotZero(t, v.DnsmasqPID, "dnsmasq serves the bridge")

	_, err = h.Ensure(ctx)
	require.NoError(t, err, "a converge after the hand edit")
	n, _, err = h.Incus.Networks().Get(ctx, model.Current.Network)
	require.NoError(t, err)
	raw := n.Config["raw.dnsmasq"]
	assert.True(t, strings.HasSuffix(raw, "\n"), "box ends its lines: %q", raw)
	assert.NotContains(t, raw, "log-async", "a converge puts the drift right")
	v, err = h.Verify(ctx)
	require.NoError(t, err)
	assert.NotZero(t, v.DnsmasqPID, "dnsmasq serves the bridge")
}
