#!/usr/bin/env bash
# guard-bench.sh measures the guard (L-GUARD) in the hermetic world
# (docs/measurements.md, "The guard"): a box's 100 MB download from the
# world's bulk server (public, by the default route: the guard's longest
# path, two route lookups a packet) with the guard attached and detached,
# the two taking turns (median of EGRESS_BENCH_ROUNDS, 7 by default, the
# machine being shared), and the kernel's count of the guard's runs and
# their time during one guarded download (guardstats: BPF statistics held
# on for that download only). Run as root with the world up;
# BOX_WORLD_STATE picks the world (boxw by default). It leaves the guard
# attached and removes its box.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/worldenv.sh
bytes=$((100 * 1000 * 1000))
rounds=${EGRESS_BENCH_ROUNDS:-7}

make --no-print-directory build >&2
CGO_ENABLED=0 go build -o /tmp/egressbench ./scripts/testdata/egressbench
CGO_ENABLED=0 go build -o /tmp/guardstats ./scripts/testdata/guardstats
bin/box setup-host >/dev/null
b=gb-$$
attach() {
	local out
	out=$(bin/box setup-host --firewall-only 2>&1) || { echo "$out" >&2; exit 1; }
}
# detach takes both programs off (tc's own command, as another tool
# would); a healer running would put them back, which the check refuses.
detach() {
	ip netns exec "$BOX_NETNS" tc filter del dev boxnet ingress pref 45253 2>/dev/null || true
	ip netns exec "$BOX_NETNS" tc filter del dev "$uplink" egress pref 45253 2>/dev/null || true
	sleep 0.2
	if ip netns exec "$BOX_NETNS" tc filter show dev boxnet ingress | grep -q box_guard; then
		echo "guard-bench: the guard came back after it was detached (box guard-and-serve heals it): stop it for the benchmark" >&2
		exit 1
	fi
}
cleanup() {
	bin/box rm --force "$b" >/dev/null 2>&1 || true
	attach
}
trap cleanup EXIT
bin/box new --name "$b" >/dev/null
incus file push -q /tmp/egressbench "$b/tmp/egressbench" --mode 0755
get() { bin/box exec "$b" -- /tmp/egressbench get 203.0.113.40:80 bulk.example.net "/bytes/$bytes"; }

echo "the guard's runs during one 100 MB download (BPF statistics on for it only):"
attach
/tmp/guardstats "$BOX_NETNS" boxnet "$uplink" -- bin/box exec "$b" -- /tmp/egressbench get 203.0.113.40:80 bulk.example.net "/bytes/$bytes" |
	sed 's/^/  /'

echo "100 MB from bulk.example.net:80, $rounds rounds, guarded and not taking turns (median):"
speeds() { sort -n | awk '{ v[NR] = $1 } END { printf "%s", v[int((NR + 1) / 2)] }'; }
: >/tmp/guard-bench-on; : >/tmp/guard-bench-off
# Each download a second after its attach or detach (setup-host's own
# work done), the two orders taking turns round by round.
on() { attach; sleep 1; get | sed -n 's/.*mb_per_s=\([0-9.]*\).*/\1/p' >>/tmp/guard-bench-on; }
off() { detach; sleep 1; get | sed -n 's/.*mb_per_s=\([0-9.]*\).*/\1/p' >>/tmp/guard-bench-off; }
for i in $(seq "$rounds"); do
	if [ $((i % 2)) -eq 1 ]; then on; off; else off; on; fi
done
on=$(speeds </tmp/guard-bench-on) off=$(speeds </tmp/guard-bench-off)
printf '  guarded   %s MB/s (all: %s)\n' "$on" "$(tr '\n' ' ' </tmp/guard-bench-on)"
printf '  unguarded %s MB/s (all: %s)\n' "$off" "$(tr '\n' ' ' </tmp/guard-bench-off)"
awk -v a="$on" -v o="$off" 'BEGIN { printf "  guarded / unguarded: %.2f\n", a / o }'
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
