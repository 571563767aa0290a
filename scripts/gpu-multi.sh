#!/usr/bin/env bash
# gpu-multi.sh - the checks of cudefer on a machine with two or more GPUs
# (under 5 minutes).
#
# Run from anywhere on a machine with at least two NVIDIA GPUs that can
# reach each other (NVLink or PCIe peer access), the CUDA toolkit (cuda.h and
# the driver stub), meson + ninja, gcc, python3, and torch with NCCL for the
# all-reduce check:
#
#     scripts/gpu-multi.sh
#
# It builds the shim (meson setup build-gpu -Dtests=false) and
# tests/gpu/multigpu.c, then runs, each in a fresh process and with a
# timeout:
#   - multigpu CASE for every case (peer, peer_legacy, peer_flush, managed,
#     managed_sync, hostmap, unsafe; see tests/gpu/multigpu.c), in three
#     modes: none (no shim), shim (LD_PRELOAD of the shim) and shim-nocache
#     (the shim with CUDEFER_DEVICE_CACHE=0, so that a released device block
#     really goes back at once and only the fence protects the writer);
#   - tests/gpu/nccl_allreduce.py (two processes, one per GPU) without and
#     with the shim, with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
#     NVSHMEM_DISABLE_NVLS=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1;
# and prints a summary table. Everything goes to $OUT (default
# ./gpu-out/multi):
#     summary.txt   the environment and the table (also printed)
#     results.txt   the RUN and RESULT lines
#     runs.log      every run: command, exit status, stdout, stderr
#     build.log     the build output
#
# Verdicts: with the shim, every case but the control must end with fault=0
# and a release that returned CUDA_SUCCESS within half the writer's time;
# the control (unsafe: a bare cuMemFreeAsync) must fault in every mode, which
# shows that the check can fail; without the shim the figures are recorded
# only. The all-reduces must sum right in both modes. Exit status: 0 when
# every verdict passed, 1 otherwise, 3 when fewer than two GPUs (nothing
# checked).
#
# Environment: OUT, CUDA_PATH (default /usr/local/cuda), GPU_MULTI_BUDGET_S
# (seconds after which no further run starts, default 270), GPU_BUILD_DIR
# (the build folder, default build-gpu), and, only to smoke-test this script
# without GPUs, GPU_MULTI_DRIVER_DIR (a folder holding the project's test
# libcuda.so.1; it runs no kernels, so the control cannot fault and
# writer_running is 0; TESTDRIVER_DEVICES=2 is set for it).
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"
OUT_DIR=${OUT:-$ROOT/gpu-out/multi}
CUDA=${CUDA_PATH:-/usr/local/cuda}
BUDGET_S=${GPU_MULTI_BUDGET_S:-270}
BUILD=${GPU_BUILD_DIR:-$ROOT/build-gpu}
BIN=$BUILD/gpu-multi/bin
WORK=$OUT_DIR/work
SHIM=$BUILD/shim/libcudefer.so
CASES="peer peer_legacy peer_flush managed managed_sync hostmap unsafe"
MODES="none shim shim-nocache"
WRITER_MS=400 # tests/gpu/multigpu.c

mkdir -p "$OUT_DIR" "$BIN" "$WORK" || exit 2
RESULTS=$OUT_DIR/results.txt
RUNLOG=$OUT_DIR/runs.log
BUILDLOG=$OUT_DIR/build.log
SUMMARY=$OUT_DIR/summary.txt
: >"$RESULTS"
: >"$RUNLOG"
: >"$BUILDLOG"
rm -f "$WORK"/*

SMOKE=0
if [ -n "${GPU_MULTI_DRIVER_DIR:-}" ]; then
    SMOKE=1
    gl_use_test_driver "$GPU_MULTI_DRIVER_DIR"
    export TESTDRIVER_DEVICES=2 GPU_MULTI_SMOKE=1
fi

# NVLink SHARP / multicast off, no caching allocator: for every run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_NO_CUDA_MEMORY_CACHING=1

# ---- build ---------------------------------------------------------------------

build() {
    say "== build: shim (meson setup $BUILD -Dtests=false)" >>"$BUILDLOG"
    gl_build_shim "$BUILD" "$BUILDLOG"
    [ -f "$SHIM" ] || return 1
    say "== build: multigpu" >>"$BUILDLOG"
    gl_cc tests/gpu/multigpu.c "$BIN/multigpu" "$BUILDLOG"
}

# ---- running -------------------------------------------------------------------

# run ID MODE LIMIT_S COMMAND...: one run with a timeout, its output kept in
# $WORK/ID.MODE.{out,err}, its RUN and RESULT lines in results.txt.
run() {
    local id=$1 mode=$2 limit=$3
    shift 3
    local base=$WORK/$id.$mode
    local left
    left=$(gl_left_s "$BUDGET_S")
    if [ "$left" -lt 5 ]; then
        say "RUN id=$id mode=$mode rc=skipped secs=0" >>"$RESULTS"
        printf '  %-14s %-13s skipped (time budget of %ss spent)\n' "$id" "$mode" "$BUDGET_S"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local -a vars=()
    case $mode in
    none) ;;
    shim) vars+=("LD_PRELOAD=$SHIM" CUDEFER_STATS=1) ;;
    shim-nocache) vars+=("LD_PRELOAD=$SHIM" CUDEFER_STATS=1 CUDEFER_DEVICE_CACHE=0) ;;
    esac
    gl_run "$limit" "$base.out" "$base.err" ${vars[@]+"${vars[@]}"} "$@"
    local rc=$GL_RC secs
    secs=$(gl_secs 0)
    say "RUN id=$id mode=$mode rc=$rc secs=$secs" >>"$RESULTS"
    sed -n "s/^RESULT \\([^ ]*\\)/RESULT \\1 id=$id mode=$mode/p" "$base.out" >>"$RESULTS"
    {
        say ""
        say "=== $id / $mode: exit $rc after ${secs}s (limit ${limit}s)"
        say "command: timeout -k 5 $limit env ${vars[*]:-} $* (LD_PRELOAD, CUDEFER_* unset first)"
        say "--- stdout"
        cat "$base.out"
        say "--- stderr"
        tail -n 200 "$base.err"
    } >>"$RUNLOG"
    printf '  %-14s %-13s exit %-4s %4ss\n' "$id" "$mode" "$rc" "$secs"
}

# ---- the table -----------------------------------------------------------------

# Prints the summary table from results.txt; its last line is
# "verdicts: N passed, N failed".
table() {
    awk -v smoke="$SMOKE" -v writer="$WRITER_MS" -v cases="$CASES" -v modes="$MODES" '
        function field(line, key,    re, s) {
            re = " " key "=[^ ]*"
            if (!match(line, re)) return ""
            s = substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 2)
            return s
        }
        /^RUN / { rc[field($0, "id") "/" field($0, "mode")] = field($0, "rc") }
        /^RESULT (multigpu|nccl_allreduce) / { res[field($0, "id") "/" field($0, "mode")] = $0 }
        END {
            printf "%-14s %-13s %-6s %-22s %11s %-8s %-6s %s\n", "case", "mode", "exit",
                   "release_rc", "release_ms", "running", "fault", "verdict"
            n = split(cases, cs, " "); m = split(modes, ms, " ")
            for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) {
                k = cs[i] "/" ms[j]; r = res[k]
                if (!(k in rc)) continue
                if (r == "") { v = "FAIL (no RESULT)"; if (rc[k] == "skipped") v = "skipped" }
                else if (field(r, "skipped") == "1") v = "skipped (no peer GPUs)"
                else if (cs[i] == "unsafe") {
                    if (field(r, "fault") == "1") v = "ok (control faulted)"
                    else if (smoke) v = "ok (smoke: no kernels)"
                    else v = "FAIL (control did not fault)"
                }
                else if (ms[j] == "none") v = "recorded"
                else if (field(r, "fault") != "0") v = "FAIL (fault)"
                else if (field(r, "release_rc") != "CUDA_SUCCESS") v = "FAIL (release)"
                else if (field(r, "release_ms") + 0 > writer / 2) v = "FAIL (release blocked)"
                else if (field(r, "cudefer") != "1") v = "FAIL (shim not loaded)"
                else v = "ok"
                printf "%-14s %-13s %-6s %-22s %11s %-8s %-6s %s\n", cs[i], ms[j], rc[k],
                       field(r, "release_rc"), field(r, "release_ms"),
                       field(r, "writer_running"), field(r, "fault"), v
                if (v ~ /^FAIL/) failed++; else if (v ~ /^ok/) passed++
            }
            printf "\n%-14s %-13s %-6s %-5s %-5s %10s %s\n", "all-reduce", "mode", "exit",
                   "ok", "bad", "seconds", "verdict"
            for (j = 1; j <= 2; j++) {
                k = "nccl/" (j == 1 ? "none" : "shim"); r = res[k]
                if (!(k in rc)) continue
                if (r == "") v = "FAIL (no RESULT)"
                else if (field(r, "skipped") == "1") v = "skipped (" field(r, "reason") ")"
                else if (field(r, "ok") != "1") v = "FAIL (wrong sums or a crash)"
                else if (j == 2 && field(r, "cudefer") != "1") v = "FAIL (shim not loaded)"
                else v = "ok"
                printf "%-14s %-13s %-6s %-5s %-5s %10s %s\n", "nccl", (j == 1 ? "none" : "shim"),
                       rc[k], field(r, "ok"), field(r, "bad"), field(r, "seconds"), v
                if (v ~ /^FAIL/) failed++; else if (v ~ /^ok/) passed++
            }
            printf "\nverdicts: %d passed, %d failed\n", passed, failed
        }' "$RESULTS"
}

# ---- main ----------------------------------------------------------------------

{
    say "cudefer multi-GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC')"
    say "command: cd $ROOT && scripts/gpu-multi.sh${OUT:+ (OUT=$OUT)}"
    say "commit:  $(gl_commit_line)"
    if ((SMOKE)); then
        say "driver:  the project's TEST DRIVER from $GPU_MULTI_DRIVER_DIR (smoke test, no GPU)"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader |
            sed 's/^/gpu:     /'
        nvidia-smi topo -m 2>/dev/null | sed 's/^/topo:    /'
    fi
    say ""
} | tee "$SUMMARY"

say "== build"
if ! build; then
    tail -n 40 "$BUILDLOG"
    say "build failed (log: $BUILDLOG)" | tee -a "$SUMMARY"
    exit 1
fi

say "== multigpu (each case in a fresh process)"
for c in $CASES; do
    for m in $MODES; do
        run "$c" "$m" 30 "$BIN/multigpu" "$c"
    done
    # Without two GPUs there is nothing to check: stop early.
    if grep -q "^RESULT multigpu id=$c mode=none .*skipped=1" "$RESULTS"; then
        say "fewer than two GPUs that reach each other: nothing checked" | tee -a "$SUMMARY"
        table | tee -a "$SUMMARY"
        exit 3
    fi
done

say "== nccl_allreduce (two processes, one per GPU)"
run nccl none 150 python3 "$ROOT/tests/gpu/nccl_allreduce.py" --port 29531
run nccl shim 150 python3 "$ROOT/tests/gpu/nccl_allreduce.py" --port 29532

say ""
table | tee -a "$SUMMARY"
say "" | tee -a "$SUMMARY"
say "output: $OUT_DIR (summary.txt, results.txt, runs.log, build.log); ${SECONDS}s" |
    tee -a "$SUMMARY"
if grep -q '^verdicts: [0-9]* passed, 0 failed' "$SUMMARY"; then
    exit 0
fi
exit 1
