package main

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/jsonkeys"
)

// TestListKeysGolden holds drill list --json's key paths to the golden
// file: its JSON is a stable interface.
func TestListKeysGolden(t *testing.T) {
	want, err := jsonkeys.Golden("testdata/list-keys.golden")
	require.NoError(t, err)
	assert.Equal(t, want, jsonkeys.Paths(reflect.TypeFor[[]listedClaim]()))
}
