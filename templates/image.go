package templates

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// A template is built once per host into an image (box templates build,
// or the first box new of it): a builder box provisioned by the template's
// user-data rendered for the image (RenderOptions.Image), checked
// (CheckScript), made anonymous (AnonymizeScript), stopped and published.
// Every box of the template is then a copy of that image, whose user-data
// (CopyUserData) only makes sure the user is there and reports ready:
// nothing is installed at mint.

// Hash names what a template's image is built from: the template's
// definition and the user-data it renders for its image. An image built
// from another hash is stale. The box version is left out (it only shows
// in comments), so an upgrade of box that leaves a template as it was
// rebuilds nothing.
func (t *Template) Hash() (string, error) {
	def, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hashing template %s: %w", t.Name, err)
	}
	ud, err := t.UserData(RenderOptions{Image: true})
	if err != nil {
		return "", fmt.Errorf("hashing template %s: %w", t.Name, err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "box template image 1\n%s\n%s", def, ud)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CopyUserData is the user-data of the box name minted from its
// template's image: the template's user and checks, which write the box's
// own ReadyMarker or FailedMarker, and nothing else.
func (t *Template) CopyUserData(name, version string) (string, error) {
	ud, err := t.UserData(RenderOptions{BoxName: name, BoxVersion: version, Image: true})
	if err != nil {
		return "", err
	}
	out, ok := forCopy(ud, fmt.Sprintf("for the box %q, a copy of template %q's image: its user and checks; nothing is installed (the image has it all).", name, t.Name))
	if !ok {
		return "", fmt.Errorf("template %s: its user-data has no checks to keep", t.Name)
	}
	return out, nil
}

// CheckScript is what a built image must pass before it is published: the
// ready marker is there, the agent answers --version (with a throwaway
// HOME, so nothing of its state lands in the image) and its context file
// is there. It prints what failed and exits non-zero.
func (t *Template) CheckScript() string {
	var b strings.Builder
	b.WriteString("set -u; fail=''\n")
	fmt.Fprintf(&b, "test -s %s || fail=\"$fail; no ready marker %s\"\n", ReadyMarker, ReadyMarker)
	if a := t.Agent; a != nil {
		bin := path.Join(BinDir, a.Command)
		fmt.Fprintf(&b, "home=$(mktemp -d) && chown %s \"$home\" && out=$(su -s /bin/sh %s -c \"HOME=$home %s --version\" 2>&1) || fail=\"$fail; %s --version failed: $out\"; rm -rf \"$home\"\n",
			t.User, t.User, bin, a.Command)
		fmt.Fprintf(&b, "test -s %s || fail=\"$fail; no context file %s\"\n", t.ContextPath(), t.ContextPath())
	}
	b.WriteString("if [ -n \"$fail\" ]; then echo \"${fail#; }\"; exit 1; fi\n")
	return b.String()
}

// AnonymizeScript strips a built image of what belongs to the builder box
// and not to every box of the template: cloud-init's instance state and
// logs (a copy is a new cloud-init instance anyway), the markers, the
// machine-id's content (emptied: systemd gives a copy its own at its first
// boot, and box pushes one), SSH host keys, package caches and lists, npm's
// cache, logs, shell histories and DHCP leases. journald is first made to
// write to /run (journalctl --relinquish-var): seen in a clean-clone run
// under load, the builder's journald wrote its system.journal into
// /var/log/journal again after the rm, and the image held it.
const AnonymizeScript = `set -u
rm -rf /var/lib/cloud/instances/* /var/lib/cloud/instance /var/lib/cloud/data/* /var/lib/cloud/sem/*
rm -f ` + ReadyMarker + ` ` + FailedMarker + `
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
rm -f /etc/ssh/ssh_host_*
rm -rf /root/.npm /root/.cache /home/*/.npm /home/*/.cache /tmp/* /var/tmp/*
apt-get clean >/dev/null 2>&1 || true
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
journalctl --relinquish-var >/dev/null 2>&1 || true
rm -rf /var/log/journal/*
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete
find /var/log -type f -exec truncate -s 0 {} +
rm -f /root/.bash_history /home/*/.bash_history /root/.lesshst /home/*/.lesshst
rm -rf /var/lib/dhcp/* /var/lib/dhclient/* /run/systemd/netif/leases/* /var/lib/systemd/random-seed
sync
`
