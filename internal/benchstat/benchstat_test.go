package benchstat

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMiddle(t *testing.T) {
	assert.Equal(t, int64(5), Middle([]int64{9, 5, 1}))
	assert.Equal(t, 7.0, Middle([]float64{3.5, 1, 7, 9}), "the upper middle of an even count")
	assert.Zero(t, Middle[int64](nil))
	v := []int64{3, 1, 2}
	Middle(v)
	assert.Equal(t, []int64{3, 1, 2}, v, "the sample is left as it was")
}

func TestLoadAvg(t *testing.T) {
	assert.Len(t, strings.Fields(LoadAvg()), 3, "three averages from /proc/loadavg")
}
