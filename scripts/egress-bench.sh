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
. scripts/worldenv.sh
n=${EGRESS_BENCH_N:-1000}
bytes=$((100 * 1000 * 1000))

make --no-print-directory build >&2
CGO_ENABLED=0 go build -o /tmp/egressbench ./scripts/testdata/egressbench
bin/box setup-host >/dev/null
watcher=
if ! bin/box doctor 2>&1 | grep -q "port watcher (pid"; then
	bin/box guard-and-serve >/tmp/egress-bench-watch.log 2>&1 &
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
	incus file push -q /tmp/egressbench "$b/tmp/egressbench" --mode 0755
done
gw=$(ip -n "$BOX_NETNS" -4 -o addr show boxnet | sed -n 's/.* inet \([0-9.]*\)\/.*/\1/p' | head -1)

echo "DNS, $n answers of canary.example.net from the gateway $gw (cached after the first):"
for b in "$open" "$allowed"; do
	printf '  %-16s ' "$b"; bin/box exec "$b" -- /tmp/egressbench dns "$gw" canary.example.net "$n"
done

rounds=${EGRESS_BENCH_ROUNDS:-7}
echo "100 MB from bulk.example.net:80, $rounds rounds, the two boxes taking turns (median; the machine is shared):"
for b in "$open" "$allowed"; do
	bin/box exec "$b" -- /tmp/egressbench dns "$gw" bulk.example.net 1 >/dev/null
done
speeds() { sort -n | awk '{ v[NR] = $1 } END { printf "%s", v[int((NR + 1) / 2)] }'; }
: >/tmp/egress-bench-open; : >/tmp/egress-bench-allowed
for _ in $(seq "$rounds"); do
	for b in "$open" "$allowed"; do
		out=/tmp/egress-bench-open; [ "$b" = "$allowed" ] && out=/tmp/egress-bench-allowed
		bin/box exec "$b" -- /tmp/egressbench get 203.0.113.40:80 bulk.example.net "/bytes/$bytes" |
			sed -n 's/.*mb_per_s=\([0-9.]*\).*/\1/p' >>"$out"
	done
done
mo=$(speeds </tmp/egress-bench-open) ma=$(speeds </tmp/egress-bench-allowed)
printf '  %-16s straight      %s MB/s (all: %s)\n' "$open" "$mo" "$(tr '\n' ' ' </tmp/egress-bench-open)"
printf '  %-16s through proxy %s MB/s (all: %s)\n' "$allowed" "$ma" "$(tr '\n' ' ' </tmp/egress-bench-allowed)"
awk -v o="$mo" -v a="$ma" 'BEGIN { printf "  proxy / straight: %.2f\n", a / o }'

echo "box egress N allow NAME with the policy there (5 times):"
for _ in 1 2 3 4 5; do
	bin/box egress "$allowed" open >/dev/null
	t0=$(date +%s%N)
	bin/box egress "$allowed" allow canary.example.net bulk.example.net >/dev/null
	t1=$(date +%s%N)
	ok=$(bin/box exec "$allowed" -- /tmp/egressbench get 203.0.113.40:80 bulk.example.net /bytes/10 | sed -n 's/.*bytes=\([0-9]*\).*/\1/p')
	printf '  %d ms (first connection after it: %s bytes)\n' $(((t1 - t0) / 1000000)) "${ok:-none}"
done
