#!/usr/bin/env bash
# soak.sh runs the drill over and over in the hermetic world and counts
# every verdict that was not the expected one (issue 9's bar: zero).
#
#   scripts/soak.sh [CLEAN_RUNS [RUNS_PER_MUTATION]]     (default 20 and 10)
#
# Clean runs must all exit 0 with every claim passing. Each mutation run
# (drill run --mutate, which makes its own clean run first and compares)
# must exit 1, its clean run must have passed, and the drill must say every
# mutation of the run was detected (by probes; the tier restriction by
# Incus's answers) through a claim resting on its layer. Every mutation the
# drill offers is run (a test holds this list to drill.Mutations); the
# bridge's two sibling layers go together, as each holds alone, and the
# guard goes with host-fw, acl, route and ipv6-on, as it holds what each
# holds (a box's router solicitations among the IPv6 it drops). The counts
# per claim say which claims showed each mutation. Run as root; it brings the world up if it is down and
# leaves it up. Not part of `make test` (it takes about 20 minutes:
# docs/measurements.md).
set -euo pipefail
cd "$(dirname "$0")/.."
clean_runs=${1:-20}
per_mutation=${2:-10}
mutations=(bridge-drop,port-isolation pinning route,guard host-fw,guard acl,guard dns-managed hosts-file ipv6-on,guard tier egress door-wide nat-off egress-dns egress-names egress-forward dhcp-open privileged host-path raw-lxc idmap-root guest-api unix-char)

# The world it soaks in: boxw, or $BOX_TEST_WORLD (as scripts/test.sh).
world=${BOX_TEST_WORLD:-boxw}
make --no-print-directory deps build >&2
bin/drill world status --name "$world" >/dev/null 2>&1 || bin/drill world up --name "$world" >&2
export BOX_WORLD_STATE=/run/box-world/$world/state.json
bin/drill world image >&2
log=$(mktemp -d /tmp/box-soak.XXXXXX)
echo "soak: logs in $log" >&2
bad=0

phase() { sed -n 's/.* probes in \([0-9.]*\)s .*/\1/p' "$1" | tail -1; }

phases=()
ok=0
for i in $(seq 1 "$clean_runs"); do
	f=$log/clean-$i.txt
	rc=0
	bin/drill run >"$f" 2>&1 || rc=$?
	p=$(phase "$f")
	phases+=("$p")
	if [ "$rc" -eq 0 ]; then
		ok=$((ok + 1))
	else
		bad=$((bad + 1))
		echo "soak: clean run $i exited $rc (see $f):" >&2
		grep -E ' (FAIL|INCONCLUSIVE) ' "$f" | cut -c1-220 >&2 || true
	fi
done
sorted=$(printf '%s\n' "${phases[@]}" | sort -n)
echo "clean: $ok/$clean_runs passed; probe phase min $(echo "$sorted" | head -1) s, median $(echo "$sorted" | sed -n "$(((clean_runs + 1) / 2))p") s, max $(echo "$sorted" | tail -1) s"

for m in "${mutations[@]}"; do
	ok=0
	declare -A byclaim=()
	for i in $(seq 1 "$per_mutation"); do
		f=$log/mutate-${m//,/+}-$i.txt
		rc=0
		bin/drill run --mutate "$m" >"$f" 2>&1 || rc=$?
		detected=1
		for one in ${m//,/ }; do
			grep -q "^mutation $one (.*: detected by " "$f" || detected=0
		done
		if [ "$rc" -eq 1 ] && [ "$detected" -eq 1 ] && grep -q '^clean run .*exit 0$' "$f"; then
			ok=$((ok + 1))
			for c in $(sed -n 's/^mutation .*: detected by [^:]*: \(.*\) flipped from pass to fail.*/\1/p' "$f" | tr -d ',' | tr ' ' '\n' | sort -u); do
				byclaim[$c]=$((${byclaim[$c]:-0} + 1))
			done
		else
			bad=$((bad + 1))
			echo "soak: --mutate $m run $i exited $rc, or a mutation of it was not detected (see $f)" >&2
			grep -E '^(mutation|clean run|problem)' "$f" >&2 || true
		fi
	done
	per=""
	for c in $(printf '%s\n' "${!byclaim[@]}" | sort); do
		per="$per $c=${byclaim[$c]}"
	done
	echo "mutation $m: $ok/$per_mutation detected; runs in which each claim showed it:${per:- none}"
	unset byclaim
done
echo "unexpected verdicts: $bad"
[ "$bad" -eq 0 ]
