package model

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/box-isolation/box/stack/incus"
)

// A box's policy: what the operator set for the box on the host's behalf,
// as opposed to what the box holds on its disk. Its egress allowlist, its
// limits (config keys and the root disk's size), nesting, and its doors.
// Incus keeps all of it in the instance's config and devices, which it
// snapshots, restores, copies and exports with everything else; box reads
// it from there (PolicyOf), keeps its own copy on the bridge (the policy
// store, stack.Policies), and puts the current one back where an Incus
// operation would roll it back (docs/design.md, "A box's policy is the
// operator's").

// PolicyConfigKeys are the config keys of a box's policy besides its
// egress: its limits and the keys nesting sets.
func PolicyConfigKeys() []string {
	keys := []string{"limits.cpu", "limits.memory", "limits.processes", "limits.cpu.allowance"}
	for _, k := range nestingKeys {
		keys = append(keys, k.key)
	}
	return keys
}

// Policy is a box's policy as box keeps it.
type Policy struct {
	// Egress is the allowlist; empty is open.
	Egress []string `json:"egress,omitempty"`
	// Config holds the policy's config keys that are set (PolicyConfigKeys).
	Config map[string]string `json:"config,omitempty"`
	// Disk is the root disk's size ("" for none of the box's own).
	Disk string `json:"disk,omitempty"`
	// Doors are the box's door devices, by device name.
	Doors map[string]map[string]string `json:"doors,omitempty"`
}

// PolicyOf reads a box's policy from an instance's (or a snapshot's) own
// config and devices.
func PolicyOf(cfg map[string]string, devices map[string]map[string]string) Policy {
	var p Policy
	if cfg[KeyEgress] != "" {
		p.Egress = strings.Split(cfg[KeyEgressNames], ",")
	}
	for _, k := range PolicyConfigKeys() {
		if v, ok := cfg[k]; ok {
			if p.Config == nil {
				p.Config = map[string]string{}
			}
			p.Config[k] = v
		}
	}
	if root, ok := devices["root"]; ok {
		p.Disk = root["size"]
	}
	for name, d := range devices {
		if d["type"] == "proxy" && d[DoorTag] == "1" {
			if p.Doors == nil {
				p.Doors = map[string]map[string]string{}
			}
			p.Doors[name] = maps.Clone(d)
		}
	}
	return p
}

// WithoutDoors is the policy with no doors (a clone's: doors stay behind).
func (p Policy) WithoutDoors() Policy {
	p.Doors = nil
	return p
}

// ApplyTo makes an instance's own config and devices carry the policy,
// in place: the policy's keys set, the policy keys it does not set
// removed, its doors the only doors, the root disk's size its own.
func (p Policy) ApplyTo(cfg map[string]string, devices map[string]map[string]string) {
	delete(cfg, KeyEgress)
	delete(cfg, KeyEgressNames)
	if len(p.Egress) > 0 {
		cfg[KeyEgress] = PolicyID(p.Egress)
		cfg[KeyEgressNames] = strings.Join(p.Egress, ",")
	}
	for _, k := range PolicyConfigKeys() {
		delete(cfg, k)
	}
	maps.Copy(cfg, p.Config)
	if root, ok := devices["root"]; ok {
		delete(root, "size")
		if p.Disk != "" {
			root["size"] = p.Disk
		}
	}
	for name, d := range devices {
		if d["type"] == "proxy" && d[DoorTag] == "1" {
			delete(devices, name)
		}
	}
	for name, d := range p.Doors {
		devices[name] = maps.Clone(d)
	}
}

// Equal says whether two policies are the same.
func (p Policy) Equal(q Policy) bool { return len(p.Diff(q)) == 0 }

// Diff lists, one item each, how q differs from p ("egress: open ->
// allow a.example", "limits.cpu: 2 -> 1", "door box-door-8080: removed").
func (p Policy) Diff(q Policy) []string {
	var out []string
	if a, b := p.EgressString(), q.EgressString(); a != b {
		out = append(out, "egress: "+a+" -> "+b)
	}
	for _, k := range unionKeys(p.Config, q.Config) {
		if a, b := p.Config[k], q.Config[k]; a != b {
			out = append(out, fmt.Sprintf("%s: %s -> %s", k, orUnset(a), orUnset(b)))
		}
	}
	if p.Disk != q.Disk {
		out = append(out, fmt.Sprintf("root disk size: %s -> %s", orUnset(p.Disk), orUnset(q.Disk)))
	}
	for _, d := range unionKeys(p.Doors, q.Doors) {
		a, inP := p.Doors[d]
		b, inQ := q.Doors[d]
		switch {
		case !inP:
			out = append(out, "door "+d+": added")
		case !inQ:
			out = append(out, "door "+d+": removed")
		case !maps.Equal(a, b):
			out = append(out, "door "+d+": changed")
		}
	}
	return out
}

// Summary is the policy in a few words: "egress allow a.example,
// limits.cpu=2, disk 10GiB, nesting, door box-door-8080".
func (p Policy) Summary() string {
	parts := []string{"egress " + p.EgressString()}
	nesting := len(p.Config) > 0 && Nesting(p.Config)
	for _, k := range slices.Sorted(maps.Keys(p.Config)) {
		if nesting && NestingReason(k, p.Config[k]) != "" {
			continue
		}
		parts = append(parts, k+"="+p.Config[k])
	}
	if p.Disk != "" {
		parts = append(parts, "disk "+p.Disk)
	}
	if nesting {
		parts = append(parts, "nesting")
	}
	for _, d := range slices.Sorted(maps.Keys(p.Doors)) {
		parts = append(parts, "door "+strings.TrimPrefix(d, DoorPrefix))
	}
	return strings.Join(parts, ", ")
}

// unionKeys are the keys of a and b, sorted, each once.
func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// EgressString is the allowlist as box shows it: "open" or "allow a, b".
func (p Policy) EgressString() string {
	if len(p.Egress) == 0 {
		return EgressOpen
	}
	return "allow " + strings.Join(p.Egress, ", ")
}

func orUnset(v string) string {
	if v == "" {
		return "unset"
	}
	return v
}

// KeyPolicy on the bridge, followed by "<project>.<box>": the policy box
// last recorded for that box, as JSON (instance names hold no dot, so the
// box is what follows the last one).
const KeyPolicy = "user.box.policy."

// PolicyKey is the bridge's key of a box's recorded policy.
func PolicyKey(project, box string) string {
	return KeyPolicy + ProjectOf(project) + "." + box
}

// MarshalPolicy is a policy as the store holds it.
func MarshalPolicy(p Policy) string {
	b, _ := json.Marshal(p)
	return string(b)
}

// PoliciesRecorded reads the recorded policies from the bridge's config,
// by "<project>.<box>".
func PoliciesRecorded(cfg map[string]string) map[string]Policy {
	out := map[string]Policy{}
	for k, v := range cfg {
		who, ok := strings.CutPrefix(k, KeyPolicy)
		if !ok || !strings.Contains(who, ".") {
			continue
		}
		var p Policy
		if json.Unmarshal([]byte(v), &p) == nil {
			out[who] = p
		}
	}
	return out
}

// Enforced is the allowlist box enforces for a box.
type Enforced struct {
	// ID is the policy's id ("" for open), Names its names.
	ID    string
	Names []string
	// Recorded: it is box's record's; Differs: the box's config names
	// another.
	Recorded, Differs bool
}

// EnforcedEgress is the allowlist box enforces for a box: box's record of
// the box's policy where it keeps one, else the box's own config. An
// Incus-only restore, copy or edit changes the box's config, never box's
// record, so it never changes what the box may reach (docs/design.md, "A
// box's policy is the operator's"). A granted user's boxes have no record
// that counts: box cannot record their own changes, so their config is
// their policy.
func EnforcedEgress(inst *incus.Instance, recorded map[string]Policy) Enforced {
	var e Enforced
	if e.ID = inst.Config[KeyEgress]; e.ID != "" {
		e.Names = strings.Split(inst.Config[KeyEgressNames], ",")
	}
	if TierProjectRE.MatchString(inst.Project) {
		return e
	}
	rec, ok := recorded[ProjectOf(inst.Project)+"."+inst.Name]
	if !ok {
		return e
	}
	want := Enforced{Recorded: true}
	if len(rec.Egress) > 0 {
		want.ID, want.Names = PolicyID(rec.Egress), rec.Egress
	}
	want.Differs = want.ID != e.ID
	return want
}

// EgressCommand is the box command that sets a box's allowlist to names.
func EgressCommand(box string, names []string) string {
	if len(names) == 0 {
		return "box egress " + box + " open"
	}
	return "box egress " + box + " allow " + strings.Join(names, " ")
}

// TierProjectRE matches the project incus-user gives a user: user-<uid>.
var TierProjectRE = regexp.MustCompile(`^user-([0-9]+)$`)
