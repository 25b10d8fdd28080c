#!/bin/sh
# install.sh installs box and drill from a signed release, or removes what
# it installed (docs/install.md):
#
#   curl -fsSL https://RELEASE-HOST/install.sh | sh          # or: sh install.sh
#   sh install.sh --uninstall
#
# As root it installs into /usr/local (box and drill into BOX_BIN, default
# /usr/local/bin); as a user into ~/.local (~/.local/bin). What it
# installed is listed in BOX_HOME (default /usr/local/share/box or
# ~/.local/share/box), and --uninstall removes exactly that.
#
#   BOX_REPO  where the releases are: a URL or a local directory holding
#             release directories (default: the project's releases)
#   BOX_REF   which release: a tag such as v0.5.0 (default: latest)
#   BOX_BIN   where the commands go
#   BOX_HOME  where the record of the install goes
#
# The release's SHA256SUMS must carry a valid signature by box's release
# key, built into this script when the release was made (no setting
# replaces it), and the tarball must match its line there. That protects
# against a tampered mirror, proxy or cache; it does not protect against a
# compromised release host, which could serve a different script and key
# together.
set -eu

# Rendered when a release is made (scripts/release.sh): the release key's
# public part (binary OpenPGP, base64) and its fingerprint.
RELEASE_KEY='@BOX_RELEASE_KEY@'
RELEASE_FPR='@BOX_RELEASE_FPR@'
DEFAULT_REPO='@BOX_DEFAULT_REPO@'

say() { printf 'box-install: %s\n' "$*" >&2; }
die() {
	say "$*"
	exit 1
}

uninstall=0
for arg in "$@"; do
	case $arg in
	--uninstall) uninstall=1 ;;
	-h | --help)
		sed -n '2,24s/^# \{0,1\}//p' "$0" 2>/dev/null || true
		exit 0
		;;
	*) die "unknown argument $arg: run sh install.sh --help" ;;
	esac
done

if [ "$(id -u)" = 0 ]; then
	prefix=/usr/local
	home_default=/usr/local/share/box
else
	[ -n "${HOME:-}" ] || die "HOME is not set: set it, or BOX_BIN and BOX_HOME"
	prefix=$HOME/.local
	home_default=$HOME/.local/share/box
fi
bin=${BOX_BIN:-$prefix/bin}
boxhome=${BOX_HOME:-$home_default}
manifest=$boxhome/installed

# remove_listed removes the files a manifest lists, then the directories
# it made, deepest first, where they are empty.
remove_listed() {
	while IFS=' ' read -r kind path; do
		[ "$kind" = f ] && rm -f "$path"
	done <"$1"
	sed -n 's/^d //p' "$1" | sort -r | while IFS= read -r dir; do
		rmdir "$dir" 2>/dev/null || true
	done
}

if [ "$uninstall" = 1 ]; then
	[ -f "$manifest" ] || die "nothing to uninstall: no record of an install in $boxhome (BOX_HOME)"
	list=$(mktemp)
	cp "$manifest" "$list"
	rm -f "$manifest" "$boxhome/version"
	remove_listed "$list"
	rm -f "$list"
	say "removed box and drill from $bin and what came with them; your boxes and the host's stack are untouched (box teardown-host, as root, removes the stack)"
	exit 0
fi

case $RELEASE_KEY in
@*) die "this install.sh carries no release key: take the install.sh attached to a release" ;;
esac
for tool in gpgv sha256sum base64 tar; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is missing: install it (apt-get install gpgv coreutils tar) and run this again"
done

# A box the Debian package installed is apt's to upgrade: a second copy
# first on the PATH would hide it, or it this one.
if command -v dpkg-query >/dev/null 2>&1 &&
	dpkg-query -W -f='${Status}' box 2>/dev/null | grep -q 'install ok installed'; then
	die "box is installed from its Debian package (/usr/bin/box): upgrade it with apt-get install --only-upgrade box drill, or remove it (apt-get remove box drill) and run this again"
fi

case $(uname -m) in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*) die "no release is built for $(uname -m)" ;;
esac

repo=${BOX_REPO:-$DEFAULT_REPO}
ref=${BOX_REF:-latest}
case $repo in
@*) die "this install.sh names no release host: set BOX_REPO" ;;
esac
case $repo in
/*) from=$repo/$ref ;;
*)
	if [ "$ref" = latest ]; then from=$repo/latest/download; else from=$repo/download/$ref; fi
	;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
fetch() {
	case $from in
	/*) cp "$from/$1" "$tmp/$1" 2>/dev/null ;;
	*)
		if command -v curl >/dev/null 2>&1; then
			curl -fsSL -o "$tmp/$1" "$from/$1"
		else
			wget -q -O "$tmp/$1" "$from/$1"
		fi
		;;
	esac
}
fetch SHA256SUMS || die "could not fetch SHA256SUMS from $from: check BOX_REPO and BOX_REF"
fetch SHA256SUMS.asc || die "the release at $from has no signature (SHA256SUMS.asc): refusing to install an unsigned release"

printf '%s' "$RELEASE_KEY" | base64 -d >"$tmp/release.gpg" || die "this install.sh's release key is damaged: take the one attached to a release"
status=$(gpgv --status-fd 1 --keyring "$tmp/release.gpg" "$tmp/SHA256SUMS.asc" "$tmp/SHA256SUMS" 2>/dev/null || true)
# The release key's fingerprint is the signing key's, or (a subkey signed)
# the primary key's, the line's last field.
validsig=$(printf '%s\n' "$status" | grep '^\[GNUPG:\] VALIDSIG ' || true)
case " $validsig " in
*" $RELEASE_FPR "*) status=valid ;;
esac
case $status in
valid) ;;
*"[GNUPG:] BADSIG "*) die "the signature of $from/SHA256SUMS does not match it: the release was altered (a tampered mirror or cache?); nothing was installed" ;;
*"[GNUPG:] ERRSIG "*" 9 "*) die "$from/SHA256SUMS is signed by another key than box's release key ($RELEASE_FPR); nothing was installed" ;;
*) die "$from/SHA256SUMS.asc is no valid signature by box's release key; nothing was installed" ;;
esac

tarball=$(awk -v a="-linux-$arch.tar.gz" '{ n = $2; sub(/^\*/, "", n) } substr(n, length(n) - length(a) + 1) == a { print n; exit }' "$tmp/SHA256SUMS")
[ -n "$tarball" ] || die "the release at $from has no tarball for linux/$arch"
case $tarball in
*/* | .*) die "the release's SHA256SUMS names a strange file ($tarball); nothing was installed" ;;
esac
fetch "$tarball" || die "could not fetch $tarball from $from"
(cd "$tmp" && grep -E "^[0-9a-f]{64} [ *]$tarball\$" SHA256SUMS | sha256sum -c --status -) ||
	die "$tarball does not match its checksum in the signed SHA256SUMS: it was altered or damaged in transit; nothing was installed"
say "verified $tarball: signed by box's release key $RELEASE_FPR (this guards against a tampered mirror or cache, not against a compromised release host)"

# The original tool's installs, which this one replaces: the Bash box (its
# tree in ~/.local/share/box, BOX_HOME's default, with a bin/box script
# and host/ scripts) and the claudebox-era tree and command. Code only:
# boxes and their data are Incus's and stay.
legacy_share=${HOME:-/nonexistent}/.local/share
legacy_bin=${HOME:-/nonexistent}/.local/bin
old_box=
if [ ! -f "$manifest" ] && [ -d "$boxhome" ] && [ -d "$boxhome/host" ] && [ -f "$boxhome/bin/box" ] &&
	head -n 1 "$boxhome/bin/box" | grep -q 'sh'; then
	old_box=$boxhome
elif [ -d "$boxhome" ] && [ ! -f "$manifest" ] && [ -n "$(ls -A "$boxhome" 2>/dev/null)" ]; then
	die "$boxhome (BOX_HOME) holds something this script did not install and does not know: move it away, or set BOX_HOME elsewhere, and run this again"
fi

mkdir "$tmp/x"
tar -xzf "$tmp/$tarball" -C "$tmp/x"
root=$(find "$tmp/x" -mindepth 1 -maxdepth 1 -type d | head -n 1)
[ -x "$root/usr/bin/box" ] && [ -x "$root/usr/bin/drill" ] || die "$tarball holds no usr/bin/box and usr/bin/drill; nothing was installed"
version=$("$root/usr/bin/box" version 2>/dev/null | head -n 1 || true)

zsh_dir=$prefix/share/zsh/site-functions
new=$tmp/installed
: >"$new"
# mkdirs makes dir and records each directory it had to make.
mkdirs() {
	d=$1
	while [ ! -d "$d" ]; do
		echo "d $d" >>"$new"
		d=$(dirname "$d")
	done
	mkdir -p "$1"
}
# place copies one file of the release into dir.
place() {
	src=$1 dir=$2 mode=$3
	mkdirs "$dir"
	cp "$src" "$dir/.box-install.$$" && chmod "$mode" "$dir/.box-install.$$" && mv -f "$dir/.box-install.$$" "$dir/$(basename "$src")"
	echo "f $dir/$(basename "$src")" >>"$new"
}
for p in box drill; do
	place "$root/usr/bin/$p" "$bin" 0755
	place "$root/usr/share/man/man1/$p.1.gz" "$prefix/share/man/man1" 0644
	place "$root/usr/share/bash-completion/completions/$p" "$prefix/share/bash-completion/completions" 0644
	place "$root/usr/share/zsh/vendor-completions/_$p" "$zsh_dir" 0644
	place "$root/usr/share/fish/vendor_completions.d/$p.fish" "$prefix/share/fish/vendor_completions.d" 0644
done

# The original tool's trees and commands go now that box is in place.
found=
if [ -n "$old_box" ]; then
	rm -rf "$old_box"
	found="$found the Bash box in $old_box;"
fi
if [ -d "$legacy_share/claudebox" ]; then
	rm -rf "$legacy_share/claudebox"
	found="$found the claudebox-era tree $legacy_share/claudebox;"
fi
# drop removes an old command where this user may.
drop() {
	if rm -f "$1" 2>/dev/null && [ ! -e "$1" ] && [ ! -L "$1" ]; then
		found="$found $2 $1;"
	else
		say "could not remove $1 ($2): remove it as its owner"
	fi
}
for cmd in "$legacy_bin/claudebox" /usr/local/bin/claudebox; do
	if [ -L "$cmd" ] || { [ -f "$cmd" ] && head -n 1 "$cmd" | grep -q 'sh'; }; then
		drop "$cmd" "the claudebox command"
	fi
done
# A command the old box left beside the new one's (a link into its tree).
for cmd in "$legacy_bin/box" /usr/local/bin/box; do
	if [ -L "$cmd" ] && [ ! -e "$cmd" ]; then
		drop "$cmd" "the old box command"
	fi
done

# An earlier install of this script: what it put somewhere this one did
# not goes; the directories it made stay recorded.
if [ -f "$manifest" ]; then
	while IFS=' ' read -r kind path; do
		if [ "$kind" = f ] && ! grep -qxF "f $path" "$new"; then rm -f "$path"; fi
		if [ "$kind" = d ] && ! grep -qxF "d $path" "$new"; then echo "d $path" >>"$new"; fi
	done <"$manifest"
fi
mkdirs "$boxhome"
sort -u "$new" >"$manifest"
printf '%s\n' "$version" >"$boxhome/version"

if [ -n "$found" ]; then
	say "replaced the original tool's install:${found%;} (your boxes and their data stay)"
fi
# What is left for the user: settings of the claudebox era, a legacy stack.
for f in "${HOME:-/nonexistent}/.profile" "${HOME:-/nonexistent}/.bashrc" "${HOME:-/nonexistent}/.bash_profile" "${HOME:-/nonexistent}/.zshrc" "${HOME:-/nonexistent}/.config/fish/config.fish"; do
	if [ -f "$f" ] && grep -q 'CLAUDEBOX_' "$f"; then
		say "$f still sets $(grep -o 'CLAUDEBOX_[A-Z_]*' "$f" | sort -u | tr '\n' ' ')(box reads BOX_* now): rename them, e.g. CLAUDEBOX_REPO to BOX_REPO"
	fi
done
# The legacy stack's bridge, from the kernel (the incus CLI would leave
# its config behind in a home).
if command -v ip >/dev/null 2>&1 && ip -o link show claudenet >/dev/null 2>&1; then
	say "this host still runs the legacy stack (claudenet): move its boxes with box migrate-host --all-boxes (as root), then retire it with box migrate-host --retire-legacy"
fi

say "installed ${version:-box} and drill into $bin (man pages and completions under $prefix/share); $manifest lists every file, and sh install.sh --uninstall removes them"
case ":$PATH:" in
*":$bin:"*) ;;
*) say "$bin is not on your PATH: add it (export PATH=\"$bin:\$PATH\")" ;;
esac
if [ "$(id -u)" = 0 ]; then
	say "next: box setup-host"
else
	say "next: the host's stack needs box installed for root too, where only root can write: run this script as root (curl -fsSL URL/install.sh | sudo sh), then sudo box setup-host"
fi
