package model

import "maps"

// Nesting: containers inside a box (Docker). MintRequest.Nesting is the
// one way to ask for it; it sets these keys on the instance, never on the
// box-net profile (a key there would be drift, and every box would get
// it). The census accepts exactly these, each with its reason.
//
// Docker needs no security.syscalls.intercept.* key here: tried with
// Debian's docker.io in the world's Debian image (docker run, build with
// whiteouts, pause, stop), an unprivileged container creates overlayfs
// whiteouts and user xattrs itself (docs/box.md, Nesting).
var nestingKeys = []struct{ key, value, why string }{
	{"security.nesting", "true", "containers inside the box (box new --nesting): Incus gives it unobstructed proc and sysfs mounts under /dev/.lxc for a nested runtime to mount its own, and where AppArmor confines boxes a profile that allows nested containers; the user namespace and the seccomp filter stay, and it changes no device and no NIC"},
}

// NestingConfig is the instance config MintRequest.Nesting sets.
func NestingConfig() map[string]string {
	cfg := map[string]string{}
	for _, k := range nestingKeys {
		cfg[k.key] = k.value
	}
	return cfg
}

// NestingReason is why the census accepts key=value, or "" when nesting
// does not set it.
func NestingReason(key, value string) string {
	for _, k := range nestingKeys {
		if k.key == key && IncusTrue(value) == IncusTrue(k.value) {
			return k.why
		}
	}
	return ""
}

// WithNesting adds the nesting keys to an instance's config.
func WithNesting(cfg map[string]string) {
	maps.Copy(cfg, NestingConfig())
}

// Nesting reports whether an instance's (expanded) config has every key
// nesting sets.
func Nesting(cfg map[string]string) bool {
	for _, k := range nestingKeys {
		if IncusTrue(cfg[k.key]) != IncusTrue(k.value) {
			return false
		}
	}
	return true
}
