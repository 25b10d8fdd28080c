#!/usr/bin/env bash
# egress-bench.sh measures an egress allowlist in the hermetic world
# (docs/measurements.md, "Egress allowlists"): DNS answer latency (p50,
# p99) for an allowlisted box (box's resolver) and an open one (the
# bridge's dnsmasq); a 100 MB download through box's egress proxy (the
# allowlisted box, port 80) against the same download straight (the open
# box); and how long `box egress N allow NAME` takes with the policy there.
# Run as root with the world up; BOX_WORLD_STATE picks the world (boxw by
# default). It starts a port watcher (which runs the egress service) when
# none runs, and removes its two boxes.
set -euo pipefail
cd "$(dirname "$0")/.."
state=${BOX_WORLD_STATE:-/run/box-world/boxw/state.json}
[ -r "$state" ] || { echo "no world state at $state: bin/drill world up" >&2; exit 2; }
export INCUS_DIR=$(jq -r .incus_dir "$state") BOX_NETNS=$(jq -r .names.host_ns "$state")
export BOX_DNS=203.0.113.53 BOX_IMAGE=box-probe BOX_MEMORY=none
n=${EGRESS_BENCH_N:-2000}
bytes=$((100 * 1000 * 1000))

make --no-print-directory build >&2
CGO_ENABLED=0 go build -o /tmp/egressbench ./scripts/testdata/egressbench
bin/box setup-host >/dev/null
watcher=
if ! bin/box doctor 2>&1 | grep -q "port watcher (pid"; then
	bin/box watch-ports >/tmp/egress-bench-watch.log 2>&1 &
	watcher=$!
	sleep 1
fi
open=eb-open-$$ allowed=eb-allow-$$
allow=$(mktemp)
printf 'canary.example.net\nbulk.example.net\n' >"$allow"
cleanup() {
	bin/box rm --force "$open" >/dev/null 2>&1 || true
	bin/box rm --force "$allowed" >/dev/null 2>&1 || true
	rm -f "$allow"
	[ -z "$watcher" ] || { kill "$watcher"; wait "$watcher" 2>/dev/null || true; }
}
trap cleanup EXIT
bin/box new --name "$open" >/dev/null
bin/box new --name "$allowed" --egress "allow:$allow" >/dev/null
for b in "$open" "$allowed"; do
	incus file push /tmp/egressbench "$b/usr/local/bin/egressbench" --mode 0755
done
gw=$(bin/box info "$open" --json | jq -r '.addresses[0]' | sed 's/\.[0-9]*$/.1/')

echo "DNS, $n answers of canary.example.net from the gateway $gw (cached after the first):"
for b in "$open" "$allowed"; do
	printf '  %-16s ' "$b"; bin/box exec "$b" -- egressbench dns "$gw" canary.example.net "$n"
done

echo "100 MB from bulk.example.net:80 (best of 3):"
for b in "$open" "$allowed"; do
	bin/box exec "$b" -- egressbench dns "$gw" bulk.example.net 1 >/dev/null
	best=0
	for _ in 1 2 3; do
		r=$(bin/box exec "$b" -- egressbench get 203.0.113.30:80 bulk.example.net "/bytes/$bytes")
		v=$(echo "$r" | sed -n 's/.*mb_per_s=\([0-9.]*\).*/\1/p')
		best=$(awk -v a="$best" -v b="$v" 'BEGIN { print (b > a) ? b : a }')
	done
	printf '  %-16s %s MB/s\n' "$b" "$best"
	eval "mbps_${b//-/_}=$best"
done
o=mbps_${open//-/_} a=mbps_${allowed//-/_}
awk -v o="${!o}" -v a="${!a}" 'BEGIN { printf "  proxy / straight: %.2f\n", a / o }'

echo "box egress N allow NAME with the policy there (5 times):"
for _ in 1 2 3 4 5; do
	bin/box egress "$allowed" open >/dev/null
	t0=$(date +%s%N)
	bin/box egress "$allowed" allow canary.example.net bulk.example.net >/dev/null
	t1=$(date +%s%N)
	ok=$(bin/box exec "$allowed" -- egressbench get 203.0.113.30:80 bulk.example.net /bytes/10 | sed -n 's/.*bytes=\([0-9]*\).*/\1/p')
	printf '  %d ms (first connection after it: %s bytes)\n' $(((t1 - t0) / 1000000)) "${ok:-none}"
done
