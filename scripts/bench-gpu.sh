#!/usr/bin/env bash
# bench-gpu.sh - cudefer's benchmarks on a real GPU, in one run (about 4
# minutes, under 7).
#
# Run from the repository root (or anywhere) on a machine with an NVIDIA
# GPU, the CUDA toolkit (nvcc, cuda.h, the driver stub), meson + ninja, gcc
# and python3 (with torch for mlp.py and cupy for cupy_pinned.py):
#
#     scripts/bench-gpu.sh [cudefer-loops options, e.g. --runs 3 --quick]
#
# It builds the shim and cudefer-loops (meson, into build-bench/) and
# bench/programs/rt_hostloop.cu (nvcc), then runs, each without and with
# cudefer (LD_PRELOAD of build-bench/shim/libcudefer.so):
#
#   1. build-bench/bench/cudefer-loops: the stall, loop and call-cost tables
#      (it runs its own children with and without the shim);
#   2. rt_hostloop: cudaMallocHost/cudaFreeHost and cudaHostRegister/
#      cudaHostUnregister loops while another stream computes;
#   3. mlp.py (PyTorch): with the caching allocator, with
#      PYTORCH_NO_CUDA_MEMORY_CACHING=1, and the latter with cudefer;
#   4. cupy_pinned.py (CuPy): with CuPy's pools, without them, and without
#      them with cudefer.
#
# Into $OUT (default build-bench/out) it writes:
#
#     summary.md    the environment, the exact command and every table (also
#                   printed at the end)
#     results.txt   the machine-readable RUN and RESULT lines of every run
#     build.log     the build output
#     loops.log     cudefer-loops: every child's lines and cudefer's JSON reports
#     loops.err     cudefer-loops' stderr (the children's, cudefer statistics)
#     programs.log  each program run: command, exit status, stdout, stderr,
#                   cudefer's report
#
# Every run has a timeout; a failing step is recorded and the script goes
# on. No program is started once BENCH_BUDGET_S seconds (default 400) have
# passed. Exit status: 0 when every step ran and exited 0, 1 otherwise.
#
# Environment: OUT, CUDA_PATH (default /usr/local/cuda), BENCH_BUDGET_S,
# GPU_BUILD_DIR (the build folder, default build-bench), BENCH_DRIVER_DIR
# (only to try this script without a GPU: a folder holding the project's
# test libcuda.so.1; then pass --smoke).
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"
COMMAND="cd $ROOT && ${OUT:+OUT=$OUT }scripts/bench-gpu.sh${*:+ $*}"
CUDA=${CUDA_PATH:-/usr/local/cuda}
BUDGET_S=${BENCH_BUDGET_S:-400}
BUILD=${GPU_BUILD_DIR:-$ROOT/build-bench}
OUT_DIR=${OUT:-$BUILD/out}
SHIM=$BUILD/shim/libcudefer.so
LOOPS=$BUILD/bench/cudefer-loops
RT=$BUILD/bench/rt_hostloop
WORK=$BUILD/bench-work
LOOPS_ARGS=("$@")

mkdir -p "$OUT_DIR" "$WORK" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS=$OUT_DIR/results.txt
BUILDLOG=$OUT_DIR/build.log
PROGLOG=$OUT_DIR/programs.log
SUMMARY=$OUT_DIR/summary.md
: >"$RESULTS"
: >"$BUILDLOG"
: >"$PROGLOG"
rm -f "$WORK"/*

if [ -n "${BENCH_DRIVER_DIR:-}" ]; then
    gl_use_test_driver "$BENCH_DRIVER_DIR"
fi

FAILURES=0

# ---- build -------------------------------------------------------------------------

build() {
    say "== build: shim and cudefer-loops (meson, $BUILD)" | tee -a "$BUILDLOG"
    if gl_build_shim "$BUILD" "$BUILDLOG" && [ -x "$LOOPS" ]; then
        say "RESULT build step=meson status=ok" >>"$RESULTS"
    else
        say "RESULT build step=meson status=fail" >>"$RESULTS"
        say "   meson build FAILED (build.log)"
        FAILURES=$((FAILURES + 1))
    fi
    say "== build: rt_hostloop (nvcc)" | tee -a "$BUILDLOG"
    if gl_nvcc "$BUILDLOG" "$RT" bench/programs/rt_hostloop.cu; then
        say "RESULT build step=rt_hostloop status=ok" >>"$RESULTS"
    else
        say "RESULT build step=rt_hostloop status=fail" >>"$RESULTS"
        say "   nvcc FAILED (build.log)"
        FAILURES=$((FAILURES + 1))
    fi
}

# ---- cudefer-loops -----------------------------------------------------------------

run_loops() {
    say "== 1. cudefer-loops ${LOOPS_ARGS[*]:-}"
    local limit
    limit=$(gl_left_s "$BUDGET_S")
    [ "$limit" -gt 330 ] && limit=330
    if [ ! -x "$LOOPS" ] || [ ! -f "$SHIM" ] || [ "$limit" -lt 20 ]; then
        say "RUN prog=loops variant=- rc=skipped secs=0" >>"$RESULTS"
        say "   skipped (not built, or no time left)"
        FAILURES=$((FAILURES + 1))
        return
    fi
    say "command: timeout -k 5 $limit $LOOPS --shim $SHIM --log $OUT_DIR/loops.log ${LOOPS_ARGS[*]:-}" \
        >"$OUT_DIR/loops.err"
    gl_run "$limit" "$WORK/loops.md" "$WORK/loops.stderr" "$LOOPS" --shim "$SHIM" \
        --log "$OUT_DIR/loops.log" ${LOOPS_ARGS[@]+"${LOOPS_ARGS[@]}"}
    cat "$WORK/loops.stderr" >>"$OUT_DIR/loops.err"
    local rc=$GL_RC secs
    secs=$(gl_secs 0)
    say "RUN prog=loops variant=- rc=$rc secs=$secs" >>"$RESULTS"
    say "   exit $rc after $secs s"
    [ "$rc" = 0 ] || FAILURES=$((FAILURES + 1))
}

# ---- the real programs -------------------------------------------------------------

# run_prog PROG VARIANT LIMIT_S MODE [VAR=value ...] -- COMMAND...
# MODE: none or cudefer. Records RUN and the program's RESULT lines (tagged
# prog= variant=) in results.txt, and everything in programs.log.
run_prog() {
    local prog=$1 variant=$2 limit=$3 mode=$4
    shift 4
    local -a vars=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        vars+=("$1")
        shift
    done
    shift
    local base=$WORK/$prog.$variant
    local left
    left=$(gl_left_s "$BUDGET_S")
    if [ "$left" -lt 15 ]; then
        say "RUN prog=$prog variant=$variant rc=skipped secs=0" >>"$RESULTS"
        say "=== $prog / $variant: SKIPPED (time budget of ${BUDGET_S}s spent)" >>"$PROGLOG"
        printf '   %-12s %-18s skipped (time budget spent)\n' "$prog" "$variant"
        FAILURES=$((FAILURES + 1))
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$mode" = cudefer ]; then
        vars=("LD_PRELOAD=$SHIM" CUDEFER_STATS=1 "CUDEFER_REPORT=$base.json" ${vars[@]+"${vars[@]}"})
    fi
    gl_run "$limit" "$base.out" "$base.err" ${vars[@]+"${vars[@]}"} "$@"
    local rc=$GL_RC secs
    secs=$(gl_secs 1)
    say "RUN prog=$prog variant=$variant rc=$rc secs=$secs" >>"$RESULTS"
    sed -n "s/^RESULT \\([^ ]*\\)/RESULT \\1 prog=$prog variant=$variant/p" "$base.out" \
        >>"$RESULTS"
    {
        say ""
        say "=== $prog / $variant: exit $rc after ${secs}s (limit ${limit}s)"
        say "command: timeout -k 5 $limit env ${vars[*]:-} $* (LD_PRELOAD, CUDEFER_* unset first)"
        say "--- stdout"
        cat "$base.out"
        say "--- stderr (last 60 lines)"
        tail -n 60 "$base.err"
        if [ -f "$base.json" ]; then
            say "--- cudefer report"
            cat "$base.json"
        fi
    } >>"$PROGLOG"
    printf '   %-12s %-18s exit %-4s %6ss\n' "$prog" "$variant" "$rc" "$secs"
    [ "$rc" = 0 ] || FAILURES=$((FAILURES + 1))
}

run_programs() {
    say "== 2. rt_hostloop (CUDA runtime)"
    if [ -x "$RT" ]; then
        run_prog rt_hostloop none 90 none -- "$RT"
        run_prog rt_hostloop cudefer 90 cudefer -- "$RT"
    else
        say "RUN prog=rt_hostloop variant=- rc=skipped secs=0" >>"$RESULTS"
        FAILURES=$((FAILURES + 1))
    fi

    say "== 3. mlp.py (PyTorch)"
    local mlp=$ROOT/bench/programs/mlp.py
    run_prog mlp caching 120 none -- python3 "$mlp"
    run_prog mlp nocache 120 none PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 "$mlp"
    run_prog mlp nocache+cudefer 120 cudefer PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 "$mlp"

    say "== 4. cupy_pinned.py (CuPy)"
    local cpy=$ROOT/bench/programs/cupy_pinned.py
    run_prog cupy caching 120 none -- python3 "$cpy" --caching
    run_prog cupy nocache 120 none -- python3 "$cpy"
    run_prog cupy nocache+cudefer 120 cudefer -- python3 "$cpy"
}

# ---- the tables of the real programs -----------------------------------------------

programs_table() {
    python3 - "$RESULTS" <<'EOF'
import sys

results = {}   # (prog, variant) -> list of dicts (RESULT lines)
runs = {}      # (prog, variant) -> dict (RUN line)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 2 or f[0] not in ("RUN", "RESULT"):
        continue
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    key = (kv.get("prog"), kv.get("variant"))
    if f[0] == "RUN":
        runs[key] = kv
    else:
        results.setdefault(key, []).append(kv)


def fnum(v):
    v = float(v)
    a = abs(v)
    return (f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else
            f"{v:.2f}" if a >= 10 else f"{v:.3f}")


def pick(prog, variant, sel):
    for r in results.get((prog, variant), []):
        if all(r.get(k) == v for k, v in sel.items()):
            return r
    return None


def cell(r, key, lo="min", hi="max"):
    if r is None:
        return None, "-"
    return float(r[key]), f"{fnum(r[key])} ({fnum(r[lo])}–{fnum(r[hi])})"


def status(prog, variant):
    k = runs.get((prog, variant))
    if k is None:
        return "not run"
    return "" if k.get("rc") == "0" else f"exit {k.get('rc')}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "-"


rows = [
    # prog, measure label, selector, value key, hash key, goal
    ("mlp", "mlp.py: µs per training step", {}, "us_per_step", "loss_sha256", "cudefer ≤ 1.25× caching"),
    ("cupy", "cupy_pinned.py pinned round trip: µs per iteration", {"loop": "pinned"}, "us_per_iter", "sha256", "≥ 5× faster than no caching"),
    ("cupy", "cupy_pinned.py small device allocations: µs per iteration", {"loop": "device"}, "us_per_iter", "sha256", "≥ 5× faster than no caching"),
    ("rt_hostloop", "rt_hostloop cudaMallocHost/cudaFreeHost: µs per iteration", {"loop": "mallochost"}, "us_per_iter", "checksum", None),
    ("rt_hostloop", "rt_hostloop cudaHostRegister/Unregister: µs per iteration", {"loop": "register"}, "us_per_iter", "checksum", None),
]
variants = {  # no caching, caching, cudefer
    "mlp": ("nocache", "caching", "nocache+cudefer"),
    "cupy": ("nocache", "caching", "nocache+cudefer"),
    "rt_hostloop": ("none", None, "cudefer"),
}

print("### Real programs\n")
print("Median (min–max). \"no caching\": PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1, CuPy "
      "with set_allocator(None) and set_pinned_memory_allocator(None); \"caching\": their "
      "default allocators. rt_hostloop has no caching variant. Speedup: no caching without / "
      "with cudefer. Peak device memory: MiB above the level before the work "
      "(mem_get_info sampled), no caching / caching / cudefer.\n")
print("| program | no caching | caching | no caching + cudefer | speedup (cudefer vs no caching) "
      "| cudefer / caching | results identical | peak device memory (MiB) | goal |")
print("|---|---|---|---|---|---|---|---|---|")
notes = []
for prog, label, sel, key, hkey, goal in rows:
    vn, vc, vd = variants[prog]
    rn = pick(prog, vn, sel)
    rc = pick(prog, vc, sel) if vc else None
    rd = pick(prog, vd, sel)
    xn, cn = cell(rn, key)
    xc, cc = cell(rc, key) if vc else (None, "-")
    xd, cd = cell(rd, key)
    for v in (vn, vc, vd):
        if v and status(prog, v):
            notes.append(f"{prog} / {v}: {status(prog, v)}")
    hashes = {v: r.get(hkey) for v, r in ((vn, rn), (vc, rc), (vd, rd)) if r is not None}
    oks = [r.get("ok", "1") == "1" and r.get("errors", "0") == "0"
           for r in (rn, rc, rd) if r is not None]
    if len(hashes) < (3 if vc else 2):
        same = f"incomplete ({len(hashes)} runs)"
    elif len(set(hashes.values())) == 1:
        same = f"yes ({len(hashes)} runs)"
    else:
        same = "NO: " + ", ".join(f"{v} {h[:16]}" for v, h in hashes.items())
    if not all(oks):
        same += "; CHECK FAILED"
    mem = " / ".join(r.get("peak_mem_mib", "-") if r else "-" for r in (rn, rc, rd)) \
        if prog != "rt_hostloop" else "-"
    g = "-"
    if goal and goal.startswith("cudefer ≤") and xd and xc:
        g = f"{goal}: {'met' if xd <= 1.25 * xc else 'NOT met'}"
    elif goal and goal.startswith("≥ 5×") and xd and xn:
        g = f"{goal}: {'met' if xn >= 5 * xd else 'NOT met'}"
    elif goal:
        g = f"{goal}: -"
    print(f"| {label} | {cn} | {cc} | {cd} | {ratio(xn, xd)} | "
          f"{ratio(xd, xc) if vc else '-'} | {same} | {mem} | {g} |")
if notes:
    print("\nRuns that did not exit 0: " + "; ".join(sorted(set(notes))) + ".")
extra = []
for (prog, variant), lst in sorted(results.items(), key=lambda kv: str(kv[0])):
    for r in lst:
        if prog == "rt_hostloop":
            extra.append(f"rt_hostloop {variant} {r.get('loop')}: {r.get('bg_kernels')} background "
                         f"kernels of {r.get('bg_ms')} ms, {r.get('iters')} iterations × "
                         f"{r.get('runs')} runs, {r.get('bytes')} bytes, errors {r.get('errors')}")
        if prog == "mlp":
            extra.append(f"mlp {variant}: p10 {r.get('p10')} µs, p90 {r.get('p90')} µs, "
                         f"{r.get('steps')} steps ({r.get('warmup')} warm-up), total "
                         f"{r.get('total_s')} s, final loss {r.get('final_loss')}")
if extra:
    print("\n" + "\n".join(f"- {e}" for e in extra))
EOF
}

# ---- main --------------------------------------------------------------------------

environment() {
    say "# cudefer benchmarks"
    say ""
    say "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    say "- command: \`$COMMAND\`"
    say "- gpu: $(gl_gpu_line)"
    say "- commit: $(gl_commit_line)"
    say "- host: $(gl_host_line); $(nproc) CPUs"
    say "- tools: $(gl_tools_line)"
    [ -n "${BENCH_DRIVER_DIR:-}" ] && say "- NOTE: libcuda.so.1 from $BENCH_DRIVER_DIR (a dry run of this script, not a GPU run)"
    return 0
}

environment | tee "$WORK/env.md"
build
run_loops
run_programs

{
    cat "$WORK/env.md"
    say "- elapsed: $SECONDS s; steps that failed or were skipped: $FAILURES"
    say ""
    if [ -s "$WORK/loops.md" ]; then
        # cudefer-loops' own heading one level down.
        sed 's/^## cudefer-loops$/### cudefer-loops (driver API)/' "$WORK/loops.md"
    else
        say "### cudefer-loops: no output (see loops.err)"
    fi
    say ""
    programs_table 2>&1
    say ""
    say "Full logs in $OUT_DIR: results.txt, build.log, loops.log, loops.err, programs.log."
} >"$SUMMARY"

say ""
cat "$SUMMARY"
[ "$FAILURES" = 0 ]
