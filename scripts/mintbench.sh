#!/usr/bin/env bash
# mintbench.sh measures box new against incus launch in a running world
# ($BOX_WORLD_STATE, boxw's by default): for each template, with its image
# built, ROUNDS (default 5) alternating rounds of box new and incus launch
# of the same image fingerprint with the same profile, limits and
# user-data, each timed to one endpoint (running with an address, the
# ready marker present, the agent's --version answering), with the
# medians, their ratio and the load average; and claude's first mint (it
# builds the image) against a mint provisioned in the box. Run as root,
# with the world's Debian image (bin/drill world image --debian).
# mintbench.sh [ROUNDS] [TEMPLATE...]; scripts/mintbench/main.go says
# more, docs/images.md has the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
export BOX_WORLD_STATE=${BOX_WORLD_STATE:-/run/box-world/boxw/state.json}
make --no-print-directory build >&2
exec go run ./scripts/mintbench -rounds "$rounds" "$@"
