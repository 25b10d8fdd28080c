#!/usr/bin/env bash
# package.sh builds box's release artefacts into dist/ (or the directory
# given): static binaries stamped with the version, then, through
# cmd/pkgbuild, a .deb for box and one for drill (man page,
# completions for bash, zsh and fish, and for box the systemd units), a
# tarball of both, and SHA256SUMS. It needs Go only: no dpkg-deb, no root.
# With BOX_RELEASE_KEY (a key in gpg's keyring, GNUPGHOME honoured) it also
# signs SHA256SUMS (SHA256SUMS.asc) and writes install.sh rendered with
# that key's public part (docs/install.md); BOX_RELEASE_REPO is where that
# script fetches releases from by default. With BOX_DRILL_RECORD (the
# release gate's RUNS.md row, from make release) it writes that row to
# drill-record.txt, listed in SHA256SUMS. With BOX_RELEASE_KEY it also
# makes the signed apt repository (scripts/aptrepo.sh) under OUT/apt.
#
#   scripts/package.sh [OUT]        VERSION=v0.4.0 GOARCH=arm64 work too
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-dist}
version=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
export CGO_ENABLED=0
# Every packaged file carries the commit's time: the same commit packs the
# same bytes.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
arch=$(go env GOARCH)
hostarch=$(GOARCH= go env GOARCH)
for prog in box drill; do
	go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$work/bin/$prog" "./cmd/$prog"
	if [ "$arch" != "$hostarch" ]; then
		# The man pages and completions are asked of a binary that runs here.
		GOARCH=$hostarch go build -trimpath -ldflags "-X main.version=$version" -o "$work/host/$prog" "./cmd/$prog"
	fi
done
docbin=$work/bin
[ "$arch" = "$hostarch" ] || docbin=$work/host

mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.tar.gz "$out"/SHA256SUMS "$out"/SHA256SUMS.asc "$out"/install.sh "$out"/drill-record.txt
rm -rf "$out"/apt
echo "package: box $version for linux/$arch into $out" >&2
release=()
if [ -n "${BOX_RELEASE_KEY:-}" ]; then
	gpg --batch --export "$BOX_RELEASE_KEY" >"$work/release.gpg"
	fpr=$(gpg --batch --with-colons --fingerprint "$BOX_RELEASE_KEY" | awk -F: '$1 == "fpr" { print $10; exit }')
	release=(-release-key "$work/release.gpg" -release-fpr "$fpr")
	[ -z "${BOX_RELEASE_REPO:-}" ] || release+=(-release-repo "$BOX_RELEASE_REPO")
fi
GOARCH=$hostarch go run ./cmd/pkgbuild -bin "$work/bin" -docbin "$docbin" -out "$out" -version "$version" -arch "$arch" "${release[@]}"
if [ -n "${BOX_DRILL_RECORD:-}" ]; then
	printf '%s\n' "$BOX_DRILL_RECORD" >"$out/drill-record.txt"
	(cd "$out" && sha256sum drill-record.txt >>SHA256SUMS)
fi
if [ -n "${BOX_RELEASE_KEY:-}" ]; then
	gpg --batch --yes --local-user "$BOX_RELEASE_KEY" --armor --detach-sign -o "$out/SHA256SUMS.asc" "$out/SHA256SUMS"
	echo "package: SHA256SUMS signed by $fpr; install.sh carries its public part" >&2
	scripts/aptrepo.sh "$out" "$BOX_RELEASE_KEY"
else
	echo "package: no BOX_RELEASE_KEY: SHA256SUMS is not signed and there is no install.sh (docs/install.md)" >&2
fi
