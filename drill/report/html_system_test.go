package report_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill/report"
	"github.com/box-isolation/box/internal/testenv/tier"
)

// chromiumPath is Debian's chromium, or skips (fails under
// BOX_REQUIRE_TIERS=1) where it is not installed. The binary itself, not
// /usr/bin/chromium: that is a shell script that reads /etc/chromium.d and
// would stand between chromedp and the process it must stop.
func chromiumPath(t *testing.T) string {
	t.Helper()
	return tier.Tool(t, "/usr/lib/chromium/chromium", "chromium")
}

// The HTML report of a run as big as a real one, in a real browser at a
// laptop's size: no console error or exception (the report's hostile
// strings would log one if they ran), every claim visible, nothing wider
// than the screen.
func TestSystemHTMLReportInChromium(t *testing.T) {
	browser := chromiumPath(t)
	dir := t.TempDir()
	rep := fullReport(t)
	page := filepath.Join(dir, "report.html")
	var b bytes.Buffer
	require.NoError(t, report.HTML(&b, rep))
	require.NoError(t, os.WriteFile(page, b.Bytes(), 0o644))

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.UserDataDir(filepath.Join(dir, "profile")),
		chromedp.WindowSize(1366, 768),
		// Nothing leaves the machine: every name resolves to nothing and
		// every request goes to a proxy that is not there. The page needs
		// neither; chromium's own services would.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND"),
		chromedp.ProxyServer("http://127.0.0.1:9"),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-pings", true),
		chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if os.Geteuid() == 0 {
				// As root, also a network namespace of its own with no
				// interface up: nothing can leave it. The DevTools
				// protocol runs over a pipe, not a socket.
				cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
			}
		}),
	)
	if os.Geteuid() == 0 {
		// Chromium's sandbox refuses to start as root; the page is our own
		// file, rendered in a throwaway profile.
		opts = append(opts, chromedp.NoSandbox)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		// Stop the browser and wait for it, so no chromium outlives the test.
		cancelTab()
		cancelAlloc()
	})

	// The console, from before the page loads.
	var (
		mu       sync.Mutex
		messages []chromedp.ConsoleMessage
		done     = make(chan struct{})
	)
	consoleCtx, stopConsole := context.WithCancel(tabCtx)
	console := chromedp.Console(consoleCtx)
	go func() {
		defer close(done)
		for m, err := range console {
			if err != nil {
				return
			}
			mu.Lock()
			messages = append(messages, m)
			mu.Unlock()
		}
	}()

	require.NoError(t, chromedp.Do(tabCtx,
		chromedp.EmulateViewport(1366, 768),
		chromedp.Navigate("file://"+page),
		chromedp.WaitReady(chromedp.CSS("body")),
	))
	// The page's script runs at load; give late messages a moment.
	time.Sleep(300 * time.Millisecond)

	text, err := chromedp.Run(tabCtx, chromedp.Evaluate[string](`document.body.innerText`))
	require.NoError(t, err)
	for _, cr := range rep.Claims {
		assert.Contains(t, text, cr.ID, "claim %s is in the page's text", cr.ID)
	}
	assert.Contains(t, text, "FAIL")
	assert.Contains(t, text, hostile, "the hostile strings show as text")

	scrollWidth, err := chromedp.Run(tabCtx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	require.NoError(t, err)
	t.Logf("document.documentElement.scrollWidth = %d at a 1366x768 viewport", scrollWidth)
	assert.LessOrEqual(t, scrollWidth, 1366, "the page scrolls sideways")
	// The matrix has a scroller of its own for very wide runs: a normal one
	// needs none.
	grid, err := chromedp.Run(tabCtx, chromedp.Evaluate[[]int](`(() => {
		const w = document.querySelector(".gridwrap"), r = document.getElementById("grid").getBoundingClientRect();
		return [Math.ceil(r.width), Math.ceil(r.height), w.scrollWidth, w.clientWidth];
	})()`))
	require.NoError(t, err)
	t.Logf("matrix: %dx%d px, in a scroller %d px wide showing %d", grid[0], grid[1], grid[2], grid[3])
	assert.LessOrEqual(t, grid[2], grid[3], "the matrix scrolls sideways")
	assert.Less(t, grid[1], 768, "the matrix fits on one screen")

	// A click on the violated mark opens its probe.
	require.NoError(t, chromedp.Do(tabCtx, chromedp.Click(chromedp.CSS(`a.m.v-fail`), chromedp.NodeVisible)))
	// The page opens it on hashchange, which comes after the click.
	open := false
	for deadline := time.Now().Add(5 * time.Second); !open && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		open, err = chromedp.Run(tabCtx, chromedp.Evaluate[bool](`(() => { const d = document.getElementById(decodeURIComponent(location.hash.slice(1))); return !!d && d.open; })()`))
		require.NoError(t, err)
	}
	assert.True(t, open, "the mark's link opens its probe's details")

	shot, err := chromedp.Run(tabCtx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	img, err := png.DecodeConfig(bytes.NewReader(shot))
	require.NoError(t, err)
	shotPath := filepath.Join(dir, "report.png")
	require.NoError(t, os.WriteFile(shotPath, shot, 0o644))
	t.Logf("full-page screenshot %s: %dx%d px", shotPath, img.Width, img.Height)
	assert.Equal(t, 1366, img.Width)
	if out := os.Getenv("BOX_HTML_SCREENSHOT"); out != "" {
		// To look at it after the test's directory is gone.
		require.NoError(t, os.WriteFile(out, shot, 0o644))
	}

	// The SVG matrix (--matrix) of the same run, at the same size.
	svg := filepath.Join(dir, "matrix.svg")
	b.Reset()
	require.NoError(t, report.Matrix(&b, rep))
	require.NoError(t, os.WriteFile(svg, b.Bytes(), 0o644))
	require.NoError(t, chromedp.Do(tabCtx, chromedp.Navigate("file://"+svg)))
	size, err := chromedp.Run(tabCtx, chromedp.Evaluate[[]int](`(() => { const r = document.documentElement.getBoundingClientRect(); return [Math.ceil(r.width), Math.ceil(r.height)]; })()`))
	require.NoError(t, err)
	t.Logf("matrix.svg: %dx%d px", size[0], size[1])
	assert.LessOrEqual(t, size[0], 1366, "the SVG is wider than the screen")
	shot, err = chromedp.Run(tabCtx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "matrix.png"), shot, 0o644))
	if out := os.Getenv("BOX_SVG_SCREENSHOT"); out != "" {
		require.NoError(t, os.WriteFile(out, shot, 0o644))
	}

	stopConsole()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, m := range messages {
		if m.IsException() || m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning {
			t.Errorf("console %s: %s (%s:%d)", m.Type, m.Text, m.URL, m.Line+1)
		}
	}
	t.Logf("%d console message(s)", len(messages))
}
