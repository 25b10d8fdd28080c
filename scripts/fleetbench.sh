#!/usr/bin/env bash
# fleetbench.sh measures what a fleet of idle boxes costs the drill and
# box's verbs (scripts/fleetbench/main.go says what it times), in a world
# of its own (boxfl, brought up here and torn down after unless KEEP=1):
#
#   fleetbench.sh [-sizes 0,50,120,240] [-runs 3] [-rounds 5] [-json]
#       the curve at each fleet size (about 12 minutes with the defaults);
#   SERIES=1 fleetbench.sh [-sizes 240] [-series 10] [-json]
#       alternating warm drill runs beside the largest fleet and beside 2
#       boxes, in a second world (boxfl2) on the same machine (about 12
#       minutes with the defaults).
#
# Run as root. docs/measurements.md, "A busy host", has the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
world=${FLEET_WORLD:-boxfl}
worlds=("$world")
args=()
if [ "${SERIES:-0}" = 1 ]; then
	worlds+=("${world}2")
	args+=(-pair "/run/box-world/${world}2/state.json")
fi
make --no-print-directory build >&2
made=()
for w in "${worlds[@]}"; do
	if ! bin/drill world status --name "$w" >/dev/null 2>&1; then
		bin/drill world up --name "$w" >&2
		made+=("$w")
	fi
done
# A world made here goes with its fleet: no box removed one by one.
if [ "${#made[@]}" -gt 0 ] && [ "${KEEP:-0}" != 1 ]; then args+=(-keep); fi
export BOX_WORLD_STATE=/run/box-world/$world/state.json
rc=0
go run ./scripts/fleetbench "${args[@]}" "$@" || rc=$?
if [ "${KEEP:-0}" != 1 ]; then
	for w in "${made[@]}"; do bin/drill world down --purge --name "$w" >&2; done
fi
exit "$rc"
