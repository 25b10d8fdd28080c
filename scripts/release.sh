#!/usr/bin/env bash
# release.sh VERSION: the release gate (docs/release.md), run by
# `make release VERSION=x.y.z`. It tags vVERSION only when:
#   - the work tree is clean (a release is cut from a commit);
#   - `drill record verify` passes: every row of RUNS.md matches its
#     report under drills/ (present, same SHA-256, same fields);
#   - `drill record gate` finds a row for a --host run (mode host) that
#     exited 0 with every claim passed (none failed, inconclusive or
#     skipped: a skipped claim is not proven), built from a clean tree at a
#     commit X that is HEAD or its ancestor, with nothing but RUNS.md and
#     drills/ changed from X to HEAD.
# Then it tags vVERSION (annotated, naming the row and its report's hash)
# and builds the packages when the Makefile has a `package` target.
# There is no waiver: the way past a refusal is a passing host run.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
	echo "release: $*" >&2
	exit 1
}

[ $# -eq 1 ] && [ -n "$1" ] || die "usage: make release VERSION=x.y.z (e.g. VERSION=1.4.0)"
version=${1#v}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
	die "VERSION=$1 is not x.y.z (e.g. make release VERSION=1.4.0)"
tag=v$version

git rev-parse --verify --quiet HEAD >/dev/null || die "no commit to release here"
if git rev-parse --verify --quiet "refs/tags/$tag" >/dev/null; then
	die "tag $tag exists already: release the next version"
fi
status=$(git status --porcelain --untracked-files=normal)
if [ -n "$status" ]; then
	printf '%s\n' "$status" >&2
	die "the work tree has changes (above): a release is cut from a commit; commit them (RUNS.md and drills/ included) or stash them, then run make release VERSION=$version again"
fi

# The checks are HEAD's own drill, built outside the tree.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CGO_ENABLED=0 "${GO:-go}" build -trimpath -o "$tmp/drill" ./cmd/drill ||
	die "could not build drill to check the record (fix the build, then run make release VERSION=$version again)"

if ! "$tmp/drill" record verify RUNS.md >&2; then
	die "RUNS.md does not match its reports under drills/ (above): restore what changed from git, or record a new host run; no release without a record that verifies"
fi
if ! proof=$("$tmp/drill" record gate RUNS.md); then
	die "no recorded drill run proves HEAD (above): no release without a passing host run of this code"
fi

git tag -a "$tag" -m "box $tag" -m "$proof"
echo "release: tagged $tag on $(git rev-parse --short HEAD):" >&2
printf '%s\n' "$proof" >&2

# Packaging comes with another branch; build the packages where it exists.
if make --no-print-directory -n package >/dev/null 2>&1; then
	# The row that vouches for it goes beside the tarball, in the sums.
	BOX_DRILL_RECORD=$proof make --no-print-directory package VERSION="$version" ||
		die "tagged $tag, but make package failed: fix it and run make package VERSION=$version (the tag stays)"
else
	echo "release: no make package target here; nothing packaged" >&2
fi
echo "release: push the tag when ready: git push origin $tag" >&2
