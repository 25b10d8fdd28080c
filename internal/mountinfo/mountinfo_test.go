package mountinfo

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestUnescape(t *testing.T) {
	assert.Equal(t, "/a b/c", Unescape(`/a\040b/c`))
	assert.Equal(t, `/a\0`, Unescape(`/a\0`), "a short escape at the end stays")
	assert.Equal(t, "/plain", Unescape("/plain"))
	assert.Equal(t, `/a\999`, Unescape(`/a\999`), "not octal: stays")
}
