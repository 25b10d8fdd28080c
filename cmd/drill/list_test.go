package main

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/drill"
	"github.com/box-isolation/box/internal/jsonkeys"
)

// TestListKeysGolden holds drill list --json's key paths to the golden
// file: its JSON is a stable interface.
func TestListKeysGolden(t *testing.T) {
	want, err := jsonkeys.Golden("testdata/list-keys.golden")
	require.NoError(t, err)
	assert.Equal(t, want, jsonkeys.Paths(reflect.TypeFor[[]listedClaim]()))
}

// TestListSaysHostModes: drill list names the claims a host runs only on
// request or never, with why, as the gate and --record rely on.
func TestListSaysHostModes(t *testing.T) {
	code, out, errOut := runIn("list")
	require.Equal(t, exitOK, code, errOut)
	never := drill.NeverIn(drill.ModeHost)
	require.NotEmpty(t, never)
	for _, c := range drill.Catalogue {
		note := c.ModeNote(drill.ModeHost)
		if _, ok := never[c.ID]; ok {
			assert.Contains(t, note, "never in host mode")
		}
		if note != "" {
			assert.Contains(t, out, "           "+note+"\n", "%s", c.ID)
		}
	}
	assert.Contains(t, out, "or recorded (--record)", "an opt-in claim is named")
}
