package incus

import "time"

// SetWaitChunk shortens the long poll for a test; the returned func puts
// it back.
func SetWaitChunk(d time.Duration) func() {
	old := waitChunk
	waitChunk = d
	return func() { waitChunk = old }
}
