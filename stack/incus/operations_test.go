package incus_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/box-isolation/box/stack/incus"
)

func TestProgressText(t *testing.T) {
	for _, tc := range []struct {
		meta map[string]any
		want string
	}{
		{nil, ""},
		{map[string]any{"progress": map[string]any{"stage": "x"}}, ""},
		{map[string]any{"download_progress": "rootfs: 45% (12.34MB/s)"}, "rootfs: 45% (12.34MB/s)"},
		// The download's line stays once it is done: the later stage wins.
		{map[string]any{"download_progress": "rootfs: 100% (12.34MB/s)", "create_instance_from_image_unpack_progress": "Unpacking image: 50%"}, "Unpacking image: 50%"},
	} {
		assert.Equal(t, tc.want, incus.ProgressText(tc.meta), "%v", tc.meta)
	}
}
