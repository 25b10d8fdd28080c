package model

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A policy read from a box, put on another's config and devices, reads
// back the same; the keys and doors it does not have are taken off, and
// what is not policy stays.
func TestPolicyApplyToRoundTrip(t *testing.T) {
	src := Policy{Egress: []string{"a.example", "b.example"}, Config: map[string]string{"limits.cpu": "2", "security.nesting": "true"}, Disk: "10GiB",
		Doors: map[string]map[string]string{"box-door-80": {"type": "proxy", DoorTag: "1", "listen": "tcp:127.0.0.1:8080"}}}
	cfg := map[string]string{"limits.cpu": "1", "limits.memory": "1GiB", KeyEgress: "pold", KeyEgressNames: "old.example", "user.box": "1"}
	devices := map[string]map[string]string{
		"root":        {"type": "disk", "path": "/", "size": "20GiB"},
		"box-door-22": {"type": "proxy", DoorTag: "1"},
		"eth0":        {"type": "nic"},
	}
	src.ApplyTo(cfg, devices)
	got := PolicyOf(cfg, devices)
	assert.True(t, got.Equal(src), "round trip: %v", got.Diff(src))
	assert.Equal(t, PolicyID(src.Egress), cfg[KeyEgress])
	assert.NotContains(t, cfg, "limits.memory", "a policy key it does not set is taken off")
	assert.Equal(t, "1", cfg["user.box"], "what is not policy stays")
	assert.NotContains(t, devices, "box-door-22")
	assert.Contains(t, devices, "eth0")

	Policy{}.ApplyTo(cfg, devices)
	assert.NotContains(t, cfg, KeyEgress, "open")
	assert.NotContains(t, devices["root"], "size")
	assert.True(t, PolicyOf(cfg, devices).Equal(Policy{}))
}

// Diff names each difference once, as "what: then -> now".
func TestPolicyDiff(t *testing.T) {
	then := Policy{Config: map[string]string{"limits.cpu": "1", "limits.processes": "100"}, Doors: map[string]map[string]string{"box-door-1": {"listen": "a"}, "box-door-2": {"listen": "b"}}}
	now := Policy{Egress: []string{"a.example"}, Config: map[string]string{"limits.cpu": "2", "limits.memory": "1GiB"}, Disk: "5GiB", Doors: map[string]map[string]string{"box-door-2": {"listen": "c"}, "box-door-3": {}}}
	assert.Equal(t, []string{
		"egress: open -> allow a.example",
		"limits.cpu: 1 -> 2",
		"limits.memory: unset -> 1GiB",
		"limits.processes: 100 -> unset",
		"root disk size: unset -> 5GiB",
		"door box-door-1: removed",
		"door box-door-2: changed",
		"door box-door-3: added",
	}, then.Diff(now))
	assert.Empty(t, now.Diff(now))
}
