#!/usr/bin/env bash
# package.sh builds box's release artefacts into dist/ (or the directory
# given): static binaries stamped with the version, then, through
# cmd/pkgbuild, a .deb for box and one for drill (man page,
# completions for bash, zsh and fish, and for box the systemd units), a
# tarball of both, and SHA256SUMS. It needs Go only: no dpkg-deb, no root.
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
rm -f "$out"/*.deb "$out"/*.tar.gz "$out"/SHA256SUMS
echo "package: box $version for linux/$arch into $out" >&2
GOARCH=$hostarch go run ./cmd/pkgbuild -bin "$work/bin" -docbin "$docbin" -out "$out" -version "$version" -arch "$arch"
