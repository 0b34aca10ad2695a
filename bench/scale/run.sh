#!/usr/bin/env bash
# The scale harness's sittings, one after another (see README.md):
#   1. the default sweep, proxy off: lightweight 64, 256, 1024 nodes x 8 ranks (the ranks'
#      first barrier is torch's ADD + WAIT), real ddprun static and c10d at 64 and 256 nodes,
#      torchrun (torch 2.x) at 8, 16 and 32 nodes (64 takes about 14 GiB of memory)
#   2. lightweight with ddprun's own worker barrier, rdzv_barrier(), at 64, 256 and 1024 nodes
#   3. proxy on, the same as 1 without torchrun, where the build has the store proxy
#      (scale-bench --proxy on refuses to run otherwise, and this says so)
#
# Usage: bench/scale/run.sh [BUILD_DIR [OUT_DIR]]     (default: build, and a new temporary dir)
# Environment: LIGHT, REAL, TORCHRUN (node lists for 1 and 3), RDZV_NODES (for 2), ARGS (more
# scale-bench options for every sitting, e.g. "--ranks 4 -v").
# Each sitting's table goes to stdout and OUT_DIR/<name>.txt, its figures to OUT_DIR/<name>.json.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$here/../../build}
out=${2:-$(mktemp -d "${TMPDIR:-/tmp}/scale-bench.XXXXXX")}
sb=$build/bench/scale-bench
[[ -x $sb ]] || { echo "$sb is not built (ninja -C $build bench/scale-bench)" >&2; exit 1; }
mkdir -p "$out" || exit 1
light=${LIGHT:-64,256,1024}
real=${REAL:-64,256}
torchrun=${TORCHRUN:-8,16,32}
rdzv_nodes=${RDZV_NODES:-64,256,1024}
# shellcheck disable=SC2206
extra=(${ARGS:-})
status=0

sitting() {  # NAME ARGS...: one scale-bench run, its table kept and shown
    local name=$1
    shift
    echo "== $name: scale-bench $*"
    "$sb" "$@" "${extra[@]}" --json "$out/$name.json" | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    ((rc == 0)) || { echo "== $name: exit status $rc" >&2; status=1; }
}

sitting proxy-off --proxy off --light-nodes "$light" --real-nodes "$real" \
    --torchrun-nodes "$torchrun"
sitting rdzv-barrier --proxy off --barrier rdzv --light-nodes "$rdzv_nodes" --real-nodes none \
    --torchrun-nodes none
if "$sb" --proxy on --light-nodes 2 --real-nodes none --torchrun-nodes none --steady 0.1 \
    >/dev/null 2>&1; then
    sitting proxy-on --proxy on --light-nodes "$light" --real-nodes "$real" --torchrun-nodes none
else
    echo "== proxy-on: skipped: this build has no store proxy (scale-bench --proxy on refuses)"
fi
echo "results in $out"
exit "$status"
