// Package stack is the single source of truth for box's isolated network
// and for how boxes live on it. It converges a host to it (Ensure), compares a live host with it
// from ground truth (Verify), removes it (Teardown), moves boxes off the
// legacy generation (Migrate), and runs the box lifecycle behind the
// ownership boundary (Boxes). It knows nothing about probes: proving the
// isolation holds is the drill's job.
//
// The layers, their IDs and the desired state as data are the leaf
// package stack/model's; this package makes a host match them.
//
// Everything acts on a Host: an Incus client and the network namespace
// incusd lives in (the machine's own on a real host, the hermetic world's
// host namespace in tests).
package stack
