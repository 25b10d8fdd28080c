package sample

import (
	"os"
	"testing"
)

func TestPasses(t *testing.T) { t.Log("fine") }

func TestFails(t *testing.T) { t.Error("the failure's own words") }

func TestSkips(t *testing.T) {
	t.Log("said before")
	t.Skip("needs a thing: install it")
}

func TestSubtests(t *testing.T) {
	t.Run("runs", func(t *testing.T) {})
	t.Run("skips", func(t *testing.T) { t.Skipf("needs %s", "root") })
}

// TestDies ends the test binary when SAMPLE_DIE is set: no event ends it.
func TestDies(t *testing.T) {
	if os.Getenv("SAMPLE_DIE") == "1" {
		t.Log("last words")
		os.Exit(3)
	}
}
