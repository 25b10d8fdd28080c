package sdnotify

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReady(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	there, err := Ready()
	require.NoError(t, err)
	assert.False(t, there, "no socket: nothing sent")

	for _, abstract := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "notify")
		listen := path
		if abstract {
			path = "@box-sdnotify-test-" + filepath.Base(filepath.Dir(path))
			listen = "\x00" + path[1:]
		}
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: listen, Net: "unixgram"})
		require.NoError(t, err)
		t.Setenv("NOTIFY_SOCKET", path)
		there, err := Ready()
		require.NoError(t, err)
		assert.True(t, there)
		buf := make([]byte, 64)
		n, err := l.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "READY=1", string(buf[:n]), "abstract %v", abstract)
		l.Close()
	}

	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone"))
	there, err = Ready()
	assert.True(t, there)
	assert.ErrorContains(t, err, "telling systemd READY=1")
}
