// Package atomicfile replaces a file in one rename, so a reader sees the
// old content or the new, never a part: box's records and state files
// (the template images' record, the egress state, the daemon's status).
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to a temporary file beside path with mode perm, then
// renames it over path. The temporary file is removed whatever happens.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
