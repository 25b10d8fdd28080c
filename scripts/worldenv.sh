# worldenv.sh, sourced by the benchmark scripts: points box and incus at
# the hermetic world BOX_WORLD_STATE names (boxw by default), with the
# world's resolver and the probe image, and sets $uplink to the world's
# uplink (the host side).
state=${BOX_WORLD_STATE:-/run/box-world/boxw/state.json}
[ -r "$state" ] || { echo "no world state at $state: bin/drill world up" >&2; exit 2; }
json() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" "$state" | head -1; }
export INCUS_DIR=$(json incus_dir) BOX_NETNS=$(json host_ns)
export BOX_DNS=203.0.113.53 BOX_IMAGE=box-probe BOX_MEMORY=none
uplink=$(json uplink)
