#!/bin/bash
# rounds.sh - a probe, run by hand on a GPU machine: the goals that one
# process of each kind cannot settle, because two processes running the
# same code differ by more than their margin (bench/RESULTS.md, runs
# 117-121).
#
#   OUT=/some/folder bench/probes/rounds.sh [SHIM] [ROUNDS]
#
# 1. cudefer-loops --only loops --rounds ROUNDS (default 7) over the rows in
#    $ROWS (default the 4 KiB rows and the registrations): every mode of a
#    row side by side in each round; the table of rounds gives each
#    round's ratio and their median ($OUT/loops.md, $OUT/loops.log).
# 2. The PyTorch MLP step (bench/programs/mlp.py) with the caching
#    allocator and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under cudefer, in
#    turn, $MLP_ROUNDS times (default 4): one line a process in
#    $OUT/mlp.log (us per step, p10, p90, the losses' hash).
#
# SHIM: libcudefer.so (default: build-bench/shim/libcudefer.so, built with
# meson when missing, with cudefer-loops).
set -u
cd "$(dirname "$0")/../.." || exit 2
O=${OUT:-/tmp/rounds}
mkdir -p "$O"
S=${1:-$PWD/build-bench/shim/libcudefer.so}
ROUNDS=${2:-7}
B=build-bench
if [ ! -x "$B/bench/cudefer-loops" ] || [ ! -f "$S" ]; then
    { [ -f "$B/build.ninja" ] || meson setup "$B" -Dtests=false; } >"$O/build.log" 2>&1 &&
        ninja -C "$B" >>"$O/build.log" 2>&1 || exit 4
fi
timeout "${LOOPS_LIMIT_S:-400}" "$B/bench/cudefer-loops" --shim "$S" --only loops \
    --rows "${ROWS:-dev4k,host4k,man4k,reg4k,reg64m}" --rounds "$ROUNDS" \
    --budget "$((${LOOPS_LIMIT_S:-400} - 20))" --log "$O/loops.log" >"$O/loops.md" \
    2>"$O/loops.err"
echo "cudefer-loops rc=$?" >"$O/rc.log"

mlp() { # tag env...
    local tag=$1
    shift
    env "$@" timeout 90 python3 bench/programs/mlp.py >"$O/mlp.out" 2>"$O/mlp.err"
    echo "$tag rc=$? $(grep '^RESULT' "$O/mlp.out" |
        grep -o 'us_per_step=[^ ]*\|p10=[^ ]*\|p90=[^ ]*\|loss_sha256=.\{12\}' |
        tr '\n' ' ')" >>"$O/mlp.log"
}
for i in $(seq 1 "${MLP_ROUNDS:-4}"); do
    mlp "caching $i"
    mlp "nocache+cudefer $i" LD_PRELOAD="$S" PYTORCH_NO_CUDA_MEMORY_CACHING=1
done
rm -f "$O/mlp.out" "$O/mlp.err"
