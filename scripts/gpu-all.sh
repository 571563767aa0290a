#!/usr/bin/env bash
# gpu-all.sh - every real-GPU run of cudefer in one command, for one call of
# a GPU machine (about 9 minutes): the checks (scripts/gpu-check.sh), the
# benchmarks (scripts/bench-gpu.sh) and, where two or more GPUs reach each
# other, the multi-GPU checks (scripts/gpu-multi.sh). Each script builds
# what it needs (the shim with meson, the programs with gcc and nvcc).
#
#     OUT=/some/folder scripts/gpu-all.sh
#
# Writes $OUT/check, $OUT/bench and $OUT/multi (each script's own output,
# see its header) and $OUT/summary.txt: the short table printed at the end,
# one line per script (its exit status, seconds, and its summary lines).
#
#     scripts/gpu-all.sh --shim-hash   prints the hash of the shim's sources
#                                      that the summary names
#
# Environment: OUT (default ./gpu-out/all); GPU_ALL_SKIP (comma-separated:
# check, bench, multi) leaves steps out; each script's own budget variable
# (GPU_CHECK_BUDGET_S, BENCH_BUDGET_S, GPU_MULTI_BUDGET_S) is set here so
# that the whole stays within about 9 minutes unless already set (a budget
# stops new program runs, not the one under way).
# Exit status: 0 when every script that ran passed (gpu-multi's 3, fewer
# than two GPUs, counts as not run), 1 otherwise.
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
CUDA=${CUDA_PATH:-/usr/local/cuda}
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"
if [ "${1:-}" = --shim-hash ]; then
    gl_shim_hash
    exit 0
fi

OUT_DIR=${OUT:-$ROOT/gpu-out/all}
mkdir -p "$OUT_DIR" || exit 2
SUMMARY=$OUT_DIR/summary.txt
: >"$SUMMARY"
status=0

skipped() { [[ ",${GPU_ALL_SKIP:-}," == *",$1,"* ]]; }

# step NAME SCRIPT: runs scripts/SCRIPT with OUT=$OUT_DIR/NAME; records
# NAME, its exit status and seconds.
step() {
    local name=$1 script=$2 start=$SECONDS rc
    if skipped "$name"; then
        printf '%-6s %-7s %5s  %s\n' "$name" "skipped" "-" "GPU_ALL_SKIP" >>"$SUMMARY"
        return
    fi
    echo "=== gpu-all: $script"
    OUT=$OUT_DIR/$name "$ROOT/scripts/$script"
    rc=$?
    local verdict=PASS
    case $rc in
    0) ;;
    3) [ "$name" = multi ] && verdict="no-2-gpus" || verdict="FAIL(3)" ;;
    *) verdict="FAIL($rc)" ;;
    esac
    [[ $verdict == FAIL* ]] && status=1
    printf '%-6s %-9s %5s s\n' "$name" "$verdict" "$((SECONDS - start))" >>"$SUMMARY"
}

# The checks take about 5 minutes on an H200 (261-296 s in runs 90 and 92;
# at 300 s the last ones were skipped in run 92). The benchmarks about 3:
# cudefer-loops 73 s, the real programs 100 s (run 86); with 170 s, CuPy's
# runs found the budget spent (run 82).
export GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-330}
export BENCH_BUDGET_S=${BENCH_BUDGET_S:-215}
export BENCH_LOOPS_MAX_S=${BENCH_LOOPS_MAX_S:-100}
export GPU_MULTI_BUDGET_S=${GPU_MULTI_BUDGET_S:-60}

step check gpu-check.sh
step bench bench-gpu.sh
step multi gpu-multi.sh

{
    echo
    echo "### gpu-all: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ';')"
    echo "commit $(gl_commit_line)"
    echo "step   verdict   time"
    cat "$SUMMARY"
    if [ -f "$OUT_DIR/check/summary.txt" ]; then
        echo
        echo "check:"
        sed -n '/^### summary/,$p' "$OUT_DIR/check/summary.txt" | sed 1d
    fi
    if [ -f "$OUT_DIR/bench/summary.md" ]; then
        echo
        echo "bench (real programs: speedup of cudefer vs no caching; cudefer / caching; goal):"
        awk -F' [|] ' '/^[|] program/ { on = 1; next }
            on && /^[|]---/ { next }
            on && /^[|]/ { sub(/^[|] /, "", $1); printf "  %-62s %8s %8s  %s\n", $1, $5, $6, $9; next }
            on { exit }' "$OUT_DIR/bench/summary.md" | sed 's/ [|]$//'
    fi
    if [ -f "$OUT_DIR/multi/summary.txt" ]; then
        echo
        echo "multi:"
        grep '^verdicts:' "$OUT_DIR/multi/summary.txt"
    fi
} >"$SUMMARY.tmp"
mv "$SUMMARY.tmp" "$SUMMARY"
cat "$SUMMARY"
exit "$status"
