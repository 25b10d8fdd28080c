package drill

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/box-isolation/box/internal/jsonkeys"
)

// TestReportKeysGolden holds the JSON report's key paths to those of
// schema_version 4 (docs/drill-report.md): a key added, renamed or removed
// must say what changed in the docs (bumping SchemaVersion where it is
// incompatible) and rewrite the golden file.
func TestReportKeysGolden(t *testing.T) {
	want, err := jsonkeys.Golden("testdata/report-keys.golden")
	require.NoError(t, err)
	assert.Equal(t, 4, SchemaVersion, "the golden file is schema 4's")
	assert.Equal(t, want, jsonkeys.Paths(reflect.TypeFor[Report]()))
}
