#!/bin/bash
# jax-ab.sh - a probe, run by hand on a GPU machine: JAX with its platform
# allocator (jax_mlp.py) without cudefer, with it, and with CUDEFER_KEEP=1G,
# two rounds interleaved; then one run of each under symtrace.so (which
# driver calls the steps make: bench/probes/symtrace.c); then CuPy's pinned
# round trip (cupy_pinned.py --loops pinned) the same three ways.
#
#   OUT=/some/folder bench/probes/jax-ab.sh [SHIM]
#
# SHIM: libcudefer.so (default: build-bench/shim/libcudefer.so, built with
# meson when missing). Writes $OUT/ab.log (one line a run: us per step,
# min, max, the first 12 hex digits of the losses' hash), $OUT/sym.*.log
# (the symtrace tables) and $OUT/stats.*.log (cudefer's statistics).
set -u
cd "$(dirname "$0")/../.." || exit 2
O=${OUT:-/tmp/jax-ab}
mkdir -p "$O"
S=${1:-$PWD/build-bench/shim/libcudefer.so}
if [ ! -f "$S" ]; then
    { meson setup build-bench -Dtests=false && ninja -C build-bench; } >"$O/build.log" 2>&1 || exit 4
fi
gcc -shared -fPIC -O1 -o "$O/symtrace.so" bench/probes/symtrace.c -ldl || exit 3
J=bench/programs/jax_mlp.py
run() { # tag steps env...
    local tag=$1 steps=$2
    shift 2
    env XLA_PYTHON_CLIENT_ALLOCATOR=platform "$@" timeout 60 python3 "$J" --steps "$steps" \
        --warmup 10 >"$O/run.out" 2>"$O/run.err"
    echo "$tag rc=$? $(grep RESULT "$O/run.out" |
        grep -o 'us_per_step=[^ ]* min=[^ ]* max=[^ ]*\|loss_sha256=.\{12\}' | tr '\n' ' ')" >>"$O/ab.log"
    grep SYMTRACE "$O/run.err" >"$O/sym.$tag.log"
    grep -A18 "statistics" "$O/run.err" >"$O/stats.$tag.log"
}
for round in 1 2; do
    run none.$round 150
    run cudefer.$round 150 LD_PRELOAD="$S" CUDEFER_STATS=1
    run keep.$round 150 LD_PRELOAD="$S" CUDEFER_STATS=1 CUDEFER_KEEP=1G
done
run trace-none 60 LD_PRELOAD="$O/symtrace.so"
run trace-cudefer 60 LD_PRELOAD="$O/symtrace.so $S" CUDEFER_STATS=1
run trace-keep 60 LD_PRELOAD="$O/symtrace.so $S" CUDEFER_STATS=1 CUDEFER_KEEP=1G
C=bench/programs/cupy_pinned.py
for v in none cudefer keep; do
    case $v in
    none) e=() ;;
    cudefer) e=(LD_PRELOAD="$S") ;;
    keep) e=(LD_PRELOAD="$S" CUDEFER_KEEP=1G) ;;
    esac
    env ${e[@]+"${e[@]}"} timeout 100 python3 "$C" --loops pinned >"$O/run.out" 2>&1
    echo "cupy $v $(grep RESULT "$O/run.out" |
        grep -o 'loop=[^ ]*\|us_per_iter=[^ ]* min=[^ ]* max=[^ ]*' | tr '\n' ' ')" >>"$O/ab.log"
done
