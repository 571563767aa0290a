#!/bin/bash
# hotpath.sh - a probe, run by hand on a GPU machine: where a 4 KiB loop
# iteration's time goes under cudefer, and how far the 4 KiB loop rows
# move between runs.
#
#   OUT=/some/folder bench/probes/hotpath.sh [SHIM] [REPEATS]
#
# 1. cudefer-phases without the shim, with it, with it and CUDEFER_STATS=1,
#    with it again, with CUDEFER_KEEP=1T and with CUDEFER_FENCE_WORD=0 (ns
#    per call).
# 2. cudefer-phases --sample ITERS --sample-offsets with the shim, at the
#    default and with CUDEFER_KEEP=1T: SIGPROF samples of the dev4k loop;
#    the samples inside libcudefer.so are resolved to functions with
#    addr2line (static ones included) and counted, in
#    $OUT/shim-functions.TAG.txt.
# 3. REPEATS (default 3) runs of cudefer-loops over the 4 KiB rows
#    (dev4k, host4k, man4k): each run has every mode (driver, cudefer,
#    pool, CUDEFER_KEEP, pool at threshold 0) as children of one parent,
#    so that the ratios of one run come from neighbouring processes. With
#    WORD_AB=1 the runs alternate between CUDEFER_FENCE_WORD=1 (odd runs,
#    the default) and 0 (even runs), each beside its own pool.
#
# SHIM: libcudefer.so (default: build-bench/shim/libcudefer.so, built with
# meson when missing). SAMPLE_ITERS (default 1000000). TAR=FILE: everything
# written also goes into one .tar.gz.
set -u
cd "$(dirname "$0")/../.." || exit 2
O=${OUT:-/tmp/hotpath}
mkdir -p "$O"
S=${1:-$PWD/build-bench/shim/libcudefer.so}
REPEATS=${2:-3}
B=build-bench
if [ ! -x "$B/bench/cudefer-phases" ] || [ ! -f "$S" ]; then
    { [ -f "$B/build.ninja" ] || meson setup "$B" -Dtests=false; } >"$O/build.log" 2>&1 &&
        ninja -C "$B" >>"$O/build.log" 2>&1 || exit 4
fi
P=$B/bench/cudefer-phases
{
    echo "== phases, without cudefer"
    timeout 120 "$P"
    echo "== phases, with cudefer"
    LD_PRELOAD=$S timeout 120 "$P"
    echo "== phases, with cudefer and CUDEFER_STATS=1 (what it saved gathered)"
    LD_PRELOAD=$S CUDEFER_STATS=1 timeout 120 "$P"
    echo "== phases, with cudefer, again"
    LD_PRELOAD=$S timeout 120 "$P"
    echo "== phases, with cudefer and CUDEFER_KEEP=1T"
    LD_PRELOAD=$S CUDEFER_KEEP=1T timeout 120 "$P"
    echo "== phases, with cudefer and CUDEFER_FENCE_WORD=0 (reuses query the fences' events)"
    LD_PRELOAD=$S CUDEFER_FENCE_WORD=0 timeout 120 "$P"
} >"$O/phases.log" 2>&1

real=$(readlink -f "$S")
# sample TAG [VAR=VALUE...]: the dev4k loop sampled, with the shim.
sample() {
    local tag=$1
    shift
    env LD_PRELOAD="$S" "$@" timeout 200 "$P" --sample "${SAMPLE_ITERS:-1000000}" \
        --sample-offsets >"$O/sample.$tag.log" 2>&1
    # The shim as loaded: the path in LD_PRELOAD (a link) or its target.
    grep "^sample-offset " "$O/sample.$tag.log" | awk '$2 ~ /libcudefer/ { print $3 }' \
        >"$O/shim-offsets.$tag.txt"
    if [ -s "$O/shim-offsets.$tag.txt" ]; then
        addr2line -f -C -e "$real" <"$O/shim-offsets.$tag.txt" | awk 'NR % 2 == 1' | sort |
            uniq -c | sort -rn >"$O/shim-functions.$tag.txt"
    fi
    # Callers inside the shim, by function.
    grep "^sample-caller " "$O/sample.$tag.log" | while read -r _ n rest; do
        off=$(printf '%s\n' "$rest" | grep -o 'libcudefer[^ ]* +0x[0-9a-f]*' | grep -o '0x.*')
        if [ -n "$off" ]; then
            fn=$(addr2line -f -C -e "$real" "$off" | head -1)
            rest="$rest ($fn)"
        fi
        printf '%6s  %s\n' "$n" "$rest"
    done >"$O/callers.$tag.txt"
    grep -v "^sample-offset \|^sample-caller " "$O/sample.$tag.log" >"$O/sample-summary.$tag.log"
    rm -f "$O/sample.$tag.log" "$O/shim-offsets.$tag.txt"
}
sample default
sample keep CUDEFER_KEEP=1T

for i in $(seq 1 "$REPEATS"); do
    word=${CUDEFER_FENCE_WORD:-1}
    [ "${WORD_AB:-0}" = 1 ] && word=$((i % 2))
    CUDEFER_FENCE_WORD=$word timeout 250 "$B/bench/cudefer-loops" --shim "$S" --only loops \
        --rows dev4k,host4k,man4k >"$O/loops.$i.md" 2>"$O/loops.$i.err"
    echo "loops run $i (CUDEFER_FENCE_WORD=$word): rc=$?" >>"$O/loops.rc"
done
# One file for the device tool's few (with TAR set).
if [ -n "${TAR:-}" ]; then
    tar -C "$O" -czf "$TAR" . && echo "tarred into $TAR"
fi
