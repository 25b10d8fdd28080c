package hostscan

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnderRoot(t *testing.T) {
	root := t.TempDir()
	must := func(err error) { t.Helper(); require.NoError(t, err) }
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "run/x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "run/x/f"), []byte("inside"), 0o644))
	must(os.Symlink("/run/x/f", filepath.Join(root, "etc/abs")))           // absolute: re-rooted
	must(os.Symlink("../run/x/f", filepath.Join(root, "etc/rel")))         // relative
	must(os.Symlink("../../../../run/x/f", filepath.Join(root, "etc/up"))) // ".." stops at root
	must(os.Symlink("/run", filepath.Join(root, "etc/dir")))               // a directory on the way
	must(os.Symlink("loop", filepath.Join(root, "etc/loop")))

	for _, name := range []string{"/etc/abs", "/etc/rel", "/etc/up", "/etc/dir/x/f", "etc/../etc/abs"} {
		b, err := readUnder(root, name)
		require.NoError(t, err, name)
		assert.Equal(t, "inside", string(b), name)
	}
	_, err := readUnder(root, "/etc/loop")
	assert.ErrorContains(t, err, "too many levels")
	_, err = readUnder(root, "/etc/missing/file")
	assert.True(t, errorsIsNotExist(err), "%v", err)

	p, err := underRoot("", "/etc/hosts")
	require.NoError(t, err)
	assert.Equal(t, "/etc/hosts", p, "no root: the machine's own tree")

	got, err := listUnder(root, "/etc", "*")
	require.NoError(t, err)
	assert.Equal(t, []string{"/etc/abs", "/etc/dir", "/etc/loop", "/etc/rel", "/etc/up"}, got)
	got, err = listUnder(root, "/nothing", "*")
	assert.NoError(t, err)
	assert.Empty(t, got)
}
