#!/bin/bash
# rounds.sh - a probe, run by hand on a GPU machine: the goals that one
# process of each kind cannot settle, because two processes running the
# same code differ by more than their margin (bench/RESULTS.md, runs
# 117-121).
#
#   OUT=/some/folder bench/probes/rounds.sh [SHIM] [ROUNDS]
#
# 1. cudefer-loops --only loops --rounds ROUNDS (default 7; 0: not run)
#    over the rows in $ROWS (default the 4 KiB rows and the registrations):
#    every mode of a row side by side in each round; the table of rounds
#    gives each round's ratio and their median ($OUT/loops.md,
#    $OUT/loops.log).
# 2. The PyTorch MLP step (bench/programs/mlp.py) with the caching
#    allocator and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under cudefer, in
#    turn, $MLP_ROUNDS times (default 4): one line a process in
#    $OUT/mlp.log (us per step, p10, p90, the losses' hash).
# 3. The same for the PyTorch transformer step (bench/programs/
#    transformer.py), $TF_ROUNDS times (default 0): $OUT/transformer.log.
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
if [ "$ROUNDS" -gt 0 ]; then
    timeout "${LOOPS_LIMIT_S:-400}" "$B/bench/cudefer-loops" --shim "$S" --only loops \
        --rows "${ROWS:-dev4k,host4k,man4k,reg4k,reg64m}" --rounds "$ROUNDS" \
        --budget "$((${LOOPS_LIMIT_S:-400} - 20))" --log "$O/loops.log" >"$O/loops.md" \
        2>"$O/loops.err"
    echo "cudefer-loops rc=$?" >"$O/rc.log"
fi

step() { # program tag env...
    local p=$1 tag=$2
    shift 2
    env "$@" timeout 120 python3 "bench/programs/$p.py" >"$O/$p.out" 2>"$O/$p.err"
    echo "$tag rc=$? $(grep '^RESULT' "$O/$p.out" |
        grep -o 'us_per_step=[^ ]*\|p10=[^ ]*\|p90=[^ ]*\|loss_sha256=.\{12\}' |
        tr '\n' ' ')" >>"$O/$p.log"
    rm -f "$O/$p.out" "$O/$p.err"
}
for p in mlp:"${MLP_ROUNDS:-4}" transformer:"${TF_ROUNDS:-0}"; do
    for i in $(seq 1 "${p#*:}"); do
        step "${p%%:*}" "caching $i"
        step "${p%%:*}" "nocache+cudefer $i" LD_PRELOAD="$S" PYTORCH_NO_CUDA_MEMORY_CACHING=1
    done
done
