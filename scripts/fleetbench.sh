#!/usr/bin/env bash
# fleetbench.sh measures what a fleet of idle boxes costs the drill and
# box's verbs (scripts/fleetbench/main.go says what it times): in its own
# world (boxfl, brought up here and torn down after unless KEEP=1),
# the curve at 0, 50, 120 and 240 boxes by default. Run as root.
# fleetbench.sh [-sizes 0,50,120,240] [-runs 3] [-rounds 5] [-json];
# docs/measurements.md, "A busy host", has the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
world=${FLEET_WORLD:-boxfl}
make --no-print-directory build >&2
up=0
if ! bin/drill world status --name "$world" >/dev/null 2>&1; then
	bin/drill world up --name "$world" >&2
	up=1
fi
export BOX_WORLD_STATE=/run/box-world/$world/state.json
# A world made here goes with its fleet: no box removed one by one.
keep=()
if [ "$up" = 1 ] && [ "${KEEP:-0}" != 1 ]; then keep=(-keep); fi
rc=0
go run ./scripts/fleetbench "${keep[@]}" "$@" || rc=$?
if [ "$up" = 1 ] && [ "${KEEP:-0}" != 1 ]; then
	bin/drill world down --purge --name "$world" >&2
fi
exit "$rc"
