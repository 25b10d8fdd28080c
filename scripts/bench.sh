#!/usr/bin/env bash
# bench.sh prints how long the hermetic world takes to build (cold, with the
# probe image imported into a fresh incusd, and warm), the positive control,
# teardown, and the wall time of `make test`. Run as root. It tears down and
# purges the world it measures; pass --no-make-test to skip the last step.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory deps build >&2

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
field() { sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" | head -1 | awk '{ printf "%.2f", $1 / 1e9 }'; }

bin/drill world down --purge >/dev/null 2>&1
t0=$(now); cold=$(bin/drill world up --json 2>/dev/null); t1=$(now)
warm_t0=$(now); bin/drill world up >/dev/null 2>&1; warm_t1=$(now)
reimport=$(bin/drill world image --json 2>/dev/null); 
c0=$(now); bin/drill world check >/dev/null; c1=$(now)
d0=$(now); bin/drill world down >/dev/null 2>&1; d1=$(now)

echo "world up, cold (namespaces + incusd + services):   $(echo "$cold" | field world_ns) s"
echo "probe image build + import into a fresh incusd:     $(echo "$cold" | field image_ns) s"
echo "world up, cold, whole command:                       $(secs "$t0" "$t1") s"
echo "world up, already up (no-op):                        $(secs "$warm_t0" "$warm_t1") s"
echo "image ensure when already imported (imported=$(echo "$reimport" | sed -n 's/.*"imported": *\([a-z]*\).*/\1/p')): no-op"
echo "world check (launch box, lease, canary, delete):     $(secs "$c0" "$c1") s"
echo "world down:                                          $(secs "$d0" "$d1") s"

if [ "${1:-}" != "--no-make-test" ]; then
	m0=$(now); make --no-print-directory test >/tmp/box-bench-make-test.log 2>&1 && rc=0 || rc=$?; m1=$(now)
	echo "make test wall time (exit $rc, log /tmp/box-bench-make-test.log): $(secs "$m0" "$m1") s"
fi
