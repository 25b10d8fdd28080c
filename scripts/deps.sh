#!/usr/bin/env bash
# deps.sh installs what box's tests and the hermetic world need on a Debian
# bookworm machine: Incus (containers only) from bookworm-backports, dnsmasq,
# nftables (the nft CLI too: tests cross-check with it), iproute2,
# busybox-static for the probe image (squashfs-tools-ng and xz-utils pack it
# for the world's image server), debootstrap for the world's Debian image,
# btrfs-progs for the world's storage pool (incusd formats its loop file),
# chromium (headless, for the HTML report's browser test), groff-base (the
# man pages are rendered), zsh and fish (the completion scripts are parsed),
# git and make (the release gate's tests), and the Go modules. A test that
# needs a program names its package (testenv.Tool); every package named
# there is in this list.
# It is idempotent: a second run installs nothing.
set -euo pipefail

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: installing packages needs root; run as root or with sudo" >&2
		exit 2
	fi
}

pkgs=(incus-base incus-client dnsmasq-base nftables iproute2 busybox-static squashfs-tools squashfs-tools-ng
	xz-utils debootstrap chromium groff-base zsh fish git make btrfs-progs util-linux coreutils bsdutils
	gpg gpg-agent gpgv apt-utils)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
	need_root
	src=/etc/apt/sources.list.d/box-bookworm-backports.list
	if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		echo "deps: adding bookworm-backports (for incus-base) in $src" >&2
		echo 'deb http://deb.debian.org/debian bookworm-backports main' >"$src"
	fi
	echo "deps: installing ${missing[*]}" >&2
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		-t bookworm-backports incus-base >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's package may start incusd through systemd; the world runs its own.
if command -v systemctl >/dev/null && systemctl is-active -q incus.service 2>/dev/null; then
	echo "deps: note: a system incusd is running; the hermetic world uses its own under /var/lib/box-world" >&2
fi

if command -v go >/dev/null; then
	go mod download
fi
