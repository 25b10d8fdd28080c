#!/usr/bin/env bash
# mintbench.sh measures box new with the templates' own image in a running
# world ($BOX_WORLD_STATE, boxw's by default), one mint at a time:
#   - each template's first mint (incusd downloads images:debian/12/cloud
#     from the world's image server) and a second one from its cache, each
#     split into what box new reports: made (incusd made and started it),
#     address, provisioned (cloud-init: packages and agent);
#   - ROUNDS (default 5) cached mints of blank beside `incus launch` of the
#     same image on the same profile and limits: the Incus part of a mint
#     against Incus alone (the goal is at most 1.1x).
# mintbench.sh [ROUNDS] [all|templates|compare] runs both parts (all) or
# one. Run as root, with bin/box built (make build) and the world's Debian image
# (bin/drill world image --debian). It removes the boxes it makes (named
# mb-*) and the image it downloads stays cached. docs/measurements.md has
# the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
what=${2:-all}
state=${BOX_WORLD_STATE:-/run/box-world/boxw/state.json}
json() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" "$2" | head -1; }
export INCUS_DIR=$(json incus_dir "$state")
export INCUS_CONF=$(json incus_conf "$state")
export BOX_NETNS=$(json host_ns "$state")
export BOX_DNS=203.0.113.53
[ -n "$INCUS_DIR" ] && [ -n "$INCUS_CONF" ] || { echo "mintbench: no world with an image server at $state" >&2; exit 2; }
image=images:debian/12/cloud
incus() { ip netns exec "$BOX_NETNS" env INCUS_DIR="$INCUS_DIR" INCUS_CONF="$INCUS_CONF" /usr/bin/incus "$@"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
field() { sed -n "s/.*\"$1\": *\([0-9][0-9.]*\).*/\1/p" | head -1; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
forget() { # the Debian image out of incusd's store: the next mint downloads it
	incus image list -f csv -c Fd | awk -F, '$2 ~ /^Debian 12/ { print $1 }' | while read -r fp; do incus image delete "$fp"; done
}
out=$(mktemp)
trap 'rm -f "$out"; for n in $(incus list -f csv -c n | grep "^mb-"); do incus delete --force "$n" >/dev/null 2>&1 || true; done' EXIT

bin/box setup-host >/dev/null
mint() { # NAME TEMPLATE: box new, printing wall made address provisioned
	local t0 t1
	t0=$(now)
	bin/box new --name "$1" --template "$2" --json >"$out" || { echo "mintbench: box new $1 failed" >&2; cat "$out" >&2; }
	t1=$(now)
	printf '%s %s %s %s\n' "$(secs "$t0" "$t1")" "$(field made <"$out")" "$(field address <"$out")" "$(field provisioned <"$out")"
}

[ "$what" = compare ] || printf '%-8s %-6s %8s %8s %8s %12s\n' template mint wall made address provisioned
for t in blank claude codex grok; do
	[ "$what" != compare ] || break
	forget
	read -r w m a p < <(mint "mb-$t-1" "$t")
	printf '%-8s %-6s %8s %8s %8s %12s\n' "$t" first "$w" "$m" "$a" "$p"
	read -r w m a p < <(mint "mb-$t-2" "$t")
	printf '%-8s %-6s %8s %8s %8s %12s\n' "$t" cached "$w" "$m" "$a" "$p"
	bin/box rm "mb-$t-1" --force >/dev/null
	bin/box rm "mb-$t-2" --force >/dev/null
done

[ "$what" != templates ] || exit 0
echo
echo "cached: box new's Incus part (made) against incus launch, $rounds rounds"
# Each one alone, after the last one's removal is written out (a create
# right after the dir pool deleted two roots took twice as long, whichever
# came first), and in turns, so that neither always goes first.
quiet() { sync; sleep 2; }
made=() launch=()
box_once() {
	read -r w m a p < <(mint "mb-box-$1" blank)
	made+=("$m")
	bin/box rm "mb-box-$1" --force >/dev/null
	quiet
}
launch_once() {
	local t0 t1
	t0=$(now)
	incus launch "$image" "mb-launch-$1" --profile box-net -c limits.cpu=2 -c limits.memory=4GiB -d root,size=20GiB >/dev/null
	t1=$(now)
	launch+=("$(secs "$t0" "$t1")")
	incus exec "mb-launch-$1" -- cloud-init status --wait >/dev/null || true
	incus delete --force "mb-launch-$1" >/dev/null
	quiet
}
quiet
for i in $(seq "$rounds"); do
	if [ $((i % 2)) -eq 1 ]; then box_once "$i"; launch_once "$i"; else launch_once "$i"; box_once "$i"; fi
	echo "round $i: box new made ${made[-1]} s, incus launch ${launch[-1]} s"
done
bm=$(printf '%s\n' "${made[@]}" | median)
lm=$(printf '%s\n' "${launch[@]}" | median)
echo "median: box new made $bm s, incus launch $lm s: $(awk -v a="$bm" -v b="$lm" 'BEGIN { printf "%.2f", a / b }')x"
