package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The binaries of a test process that ended are removed by the next
// build; a live process's (this one's) stay.
func TestSweepBinaries(t *testing.T) {
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	gone, err := os.MkdirTemp("", fmt.Sprintf("box-test-box-%d-", ended.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	mine, err := os.MkdirTemp("", fmt.Sprintf("box-test-box-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(gone); os.RemoveAll(mine) })
	if err := os.WriteFile(filepath.Join(gone, "box"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	sweepBinaries()
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("%s (of an ended process) is still there: %v", gone, err)
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("%s (this process's) was removed: %v", mine, err)
	}
}
