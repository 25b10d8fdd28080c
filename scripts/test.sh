#!/usr/bin/env bash
# test.sh runs every test tier (docs/world.md) from a bare Debian machine:
# it installs what is missing, builds static binaries, brings up the
# hermetic world (incusd in its own namespace), a second one for the drill
# package and the cluster world boxc (three members, for the cluster
# tests), runs unit, privileged and system tests with BOX_REQUIRE_TIERS=1
# (a tier that cannot run fails instead of skipping) in two streams at
# once, the drill package and then the machine tier (a world of its own
# with its Debian machine) beside every other package, and tears the
# worlds down again, also on failure. A world that was already up before
# is left up. BOX_TEST_WORLD, BOX_TEST_DRILL_WORLD, BOX_TEST_CLUSTER and
# BOX_TEST_MACHINE name the worlds (boxw, boxd, boxc and boxmac by
# default), so a development machine can run it beside worlds it must not
# touch; the tests are pointed at them by path. go test's JSON stream goes
# through internal/testjson, which prints the usual output as it comes and
# fails the run on any skipped test, listing each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "test: the privileged and system tiers need root; running the unit tier only (make unit)" >&2
	exec go test -count=1 ./...
fi

scripts/deps.sh
make --no-print-directory build

echo "test: gofmt and go vet" >&2
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "test: gofmt would change: $unformatted" >&2
	exit 1
fi
go vet ./...

# The worlds this run built are torn down on exit (also on failure); a
# world that was already up is left up.
owned=() kept=()
teardown() {
	local w
	# The background stream, if it still runs, ends before its worlds go.
	if [ -n "${bpid:-}" ]; then
		wait "$bpid" 2>/dev/null || true
	fi
	for w in ${owned[@]+"${owned[@]}"}; do
		bin/drill world down --purge --name "$w" >&2 || echo "test: world $w teardown failed; run: bin/drill world down --purge --name $w" >&2
	done
}
trap teardown EXIT
# upworld brings world $1 up (the rest are world up's arguments) from
# nothing: a database kept by an earlier run that was killed holds its
# boxes, which the tests would meet. A world already up is used as it is,
# and left up.
upworld() {
	local w=$1
	shift
	if bin/drill world status --name "$w" >/dev/null 2>&1; then
		kept+=("$w")
		return
	fi
	owned+=("$w")
	bin/drill world down --purge --name "$w" >&2
	bin/drill world up --name "$w" "$@" >&2
}
world=${BOX_TEST_WORLD:-boxw}
cluster=${BOX_TEST_CLUSTER:-boxc}
upworld "$world"
export BOX_WORLD_STATE=/run/box-world/$world/state.json
bin/drill world image >&2
# The drill package's world (BOX_TEST_DRILL_WORLD, boxd by default): its
# system tests run beside the other packages' (below), each stream in a
# standalone world of its own.
dworld=${BOX_TEST_DRILL_WORLD:-boxd}
upworld "$dworld"
BOX_WORLD_STATE=/run/box-world/$dworld/state.json bin/drill world image >&2
# The cluster tests' world (internal/testenv.Cluster): a cluster of 3
# beside the standalone world, unless $BOX_CLUSTER_STATE names another.
if [ -z "${BOX_CLUSTER_STATE:-}" ]; then
	upworld "$cluster" --cluster 3
fi
export BOX_CLUSTER_STATE=${BOX_CLUSTER_STATE:-/run/box-world/$cluster/state.json}

# Two streams at once (the drill's runs wait on boxes far more than on
# the CPU: about a quarter of this 2-core machine's while they run):
# - in the background, the drill package's tests in world $dworld, then
#   the machine tier (build tag machine, docs/world.md "The machine"): a
#   Debian machine booted in a world of its own (BOX_TEST_MACHINE, boxmac
#   by default), this tree's .debs installed in it by apt: host mode there,
#   reboots with no window (BOX_MACHINE_REBOOTS, 2 here; the soak is 10
#   and more), a granted user's session; its image is built from the
#   mirror once per machine and cached;
# - in the foreground, every other package, one at a time (their system
#   tests share world $world's one incusd and its one boxnet).
# The cluster world is one for both: a test that uses it holds it
# (internal/testenv.Cluster). The background's output is kept in a file
# and shown when both are done.
go build -o bin/testjson ./internal/testjson
export BOX_REQUIRE_TIERS=1
machine=${BOX_TEST_MACHINE:-boxmac}
make --no-print-directory package >&2
if bin/drill world status --name "$machine" >/dev/null 2>&1; then
	kept+=("$machine")
	bin/drill world down --name "$machine" >&2 # its machine takes this tree's .debs at the next up
else
	owned+=("$machine")
	bin/drill world down --purge --name "$machine" >&2
fi
blog=$(mktemp /tmp/box-test-drill-machine.XXXXXX.log)
(
	start=$(date +%s)
	drc=0
	BOX_WORLD_STATE=/run/box-world/$dworld/state.json \
		go test -json -p 1 -count=1 -timeout 60m ./drill/ 2>&1 | bin/testjson || drc=$?
	echo "test: the drill package ran $(($(date +%s) - start))s (exit $drc)"
	start=$(date +%s)
	mrc=0
	bin/drill world up --name "$machine" --machine &&
		BOX_MACHINE_STATE=/run/box-world/$machine/state.json BOX_MACHINE_REBOOTS=${BOX_MACHINE_REBOOTS:-2} \
			go test -json -tags machine -p 1 -count=1 -timeout 30m -run '^TestSystemMachine' ./fixtures/world/ 2>&1 | bin/testjson || mrc=$?
	echo "test: the machine tier (its world's bring-up included) ran $(($(date +%s) - start))s (exit $mrc)"
	[ "$drc" -eq 0 ] || exit "$drc"
	exit "$mrc"
) >"$blog" 2>&1 &
bpid=$!
echo "test: the drill package, then the machine tier, run beside the rest; their output: $blog" >&2

start=$(date +%s)
rc=0
go test -json -p 1 -count=1 -timeout 60m $(go list ./... | grep -vx 'github.com/box-isolation/box/drill') 2>&1 | bin/testjson || rc=$?
echo "test: go test of every other package ran $(($(date +%s) - start))s (exit $rc)" >&2

brc=0
wait "$bpid" || brc=$?
echo "test: the drill package's and the machine tier's output ($blog):" >&2
cat "$blog" >&2
rm -f "$blog"
if [ "$rc" -eq 0 ]; then
	rc=$brc
fi
for w in ${kept[@]+"${kept[@]}"}; do
	echo "test: world $w was up before this run and is left up (bin/drill world down --name $w removes it)" >&2
done
exit "$rc"
