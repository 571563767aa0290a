#!/usr/bin/env bash
# bench-gpu.sh - cudefer's benchmarks on a real GPU, in one run (about 4
# minutes on an H200, under 6).
#
# Run from the repository root (or anywhere) on a machine with an NVIDIA
# GPU, the CUDA toolkit (cuda.h, the driver stub; nvcc only for the extra
# rt_hostloop), meson + ninja, gcc and python3 with torch (mlp.py,
# transformer.py), jax with its CUDA plugin (jax_mlp.py) and cupy
# (cupy_pinned.py):
#
#     scripts/bench-gpu.sh [cudefer-loops options, e.g. --runs 3, or --rounds 5 to
#                          judge the loop goals over five rounds of children]
#
# It builds the shim and cudefer-loops (meson, into build-bench/), then
# runs, each without and with cudefer (LD_PRELOAD of
# build-bench/shim/libcudefer.so):
#
#   1. build-bench/bench/cudefer-loops --only loops,cost,live (unless the
#      options name sections): the loop tables (light and full touch; the
#      driver alone, cudefer, cudefer with CUDEFER_KEEP, and the driver's
#      stream-ordered pool), the
#      cost of calls with no GPU work, and the bookkeeping cost as live
#      blocks grow (about 100 s; it runs its own children);
#   2. mlp.py and transformer.py (PyTorch): with the caching allocator,
#      with PYTORCH_NO_CUDA_MEMORY_CACHING=1, and the latter with cudefer
#      (the transformer twice: the default device cache, and BENCH_BIG_CACHE);
#   3. jax_mlp.py (JAX): the default allocator, XLA_PYTHON_CLIENT_ALLOCATOR=
#      platform, and platform with cudefer;
#   4. cupy_pinned.py (CuPy): with CuPy's pools, without them, and without
#      them with cudefer;
#
# and prints every table, then one table of the goals: each goal, the
# measured value, met or not. BENCH_EXTRA (comma-separated) adds steps:
# "stall" (cudefer-loops' stall section, 1 s kernels, about 150 s) and
# "rt" (bench/programs/rt_hostloop.cu, built with nvcc, about 40 s).
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
# on. No program is started once BENCH_BUDGET_S seconds (default 330) have
# passed. Exit status: 0 when every step ran and exited 0, 1 otherwise (a
# goal not met is not a failure).
#
# Environment: OUT, CUDA_PATH (default /usr/local/cuda), BENCH_BUDGET_S,
# BENCH_LOOPS_MAX_S (cudefer-loops' share, default 200), BENCH_BIG_CACHE (the
# CUDEFER_DEVICE_CACHE of the transformer's second cudefer run, default 8G),
# BENCH_PROGRAMS=0 (cudefer-loops alone, no real programs), BENCH_EXTRA,
# GPU_BUILD_DIR (the build folder, default build-bench),
# BENCH_DRIVER_DIR (only to try this script without a GPU: a folder holding
# the project's test libcuda.so.1; then pass --smoke).
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"
COMMAND="cd $ROOT && ${OUT:+OUT=$OUT }${BENCH_EXTRA:+BENCH_EXTRA=$BENCH_EXTRA }scripts/bench-gpu.sh${*:+ $*}"
CUDA=${CUDA_PATH:-/usr/local/cuda}
BUDGET_S=${BENCH_BUDGET_S:-330}
# At most this long for cudefer-loops (about 100 s expected on an H200), so
# that the programs keep their time.
LOOPS_MAX_S=${BENCH_LOOPS_MAX_S:-200}
# The device cache of the transformer's second cudefer run.
BIG_CACHE=${BENCH_BIG_CACHE:-8G}
[[ ",${BENCH_EXTRA:-}," == *",stall,"* ]] && LOOPS_MAX_S=${BENCH_LOOPS_MAX_S:-360}
BUILD=${GPU_BUILD_DIR:-$ROOT/build-bench}
OUT_DIR=${OUT:-$BUILD/out}
SHIM=$BUILD/shim/libcudefer.so
LOOPS=$BUILD/bench/cudefer-loops
RT=$BUILD/bench/rt_hostloop
WORK=$BUILD/bench-work
PROGRAMS=$ROOT/bench/programs
LOOPS_ARGS=("$@")

extra() { [[ ",${BENCH_EXTRA:-}," == *",$1,"* ]]; }

# cudefer-loops' sections: the options' --only, else loops, cost and live
# (and stall when BENCH_EXTRA names it).
if [[ " $* " != *" --only "* ]]; then
    if extra stall; then
        LOOPS_ARGS+=(--only "loops,cost,live,stall")
    else
        LOOPS_ARGS+=(--only "loops,cost,live")
    fi
fi

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
    extra rt || return 0
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
    say "== 1. cudefer-loops ${LOOPS_ARGS[*]}"
    local limit
    limit=$(gl_left_s "$BUDGET_S")
    [ "$limit" -gt "$LOOPS_MAX_S" ] && limit=$LOOPS_MAX_S
    if [ ! -x "$LOOPS" ] || [ ! -f "$SHIM" ] || [ "$limit" -lt 30 ]; then
        say "RUN prog=loops variant=- rc=skipped secs=0" >>"$RESULTS"
        say "   skipped (not built, or no time left)"
        FAILURES=$((FAILURES + 1))
        return
    fi
    # cudefer-loops starts no child after its --budget and prints what it
    # has: it ends well before the timeout.
    local -a budget=()
    [[ " ${LOOPS_ARGS[*]} " == *" --budget "* ]] || budget=(--budget $((limit - 20)))
    say "command: timeout -k 5 $limit $LOOPS --shim $SHIM --log $OUT_DIR/loops.log --goals $WORK/loops.goals ${budget[*]} ${LOOPS_ARGS[*]}" \
        >"$OUT_DIR/loops.err"
    gl_run "$limit" "$WORK/loops.md" "$WORK/loops.stderr" "$LOOPS" --shim "$SHIM" \
        --log "$OUT_DIR/loops.log" --goals "$WORK/loops.goals" ${budget[@]+"${budget[@]}"} \
        "${LOOPS_ARGS[@]}"
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
    # The statistics and the report, without what cudefer saved: gathering
    # it costs each release made while the GPU runs behind about 0.55 us
    # (bench/RESULTS.md, run 57), and nothing gathers it by default.
    if [ "$mode" = cudefer ]; then
        vars=("LD_PRELOAD=$SHIM" CUDEFER_STATS=1 CUDEFER_SAVINGS=0 "CUDEFER_REPORT=$base.json"
            ${vars[@]+"${vars[@]}"})
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
    say "== 2. PyTorch: mlp.py, transformer.py"
    local mlp=$PROGRAMS/mlp.py tf=$PROGRAMS/transformer.py
    run_prog mlp caching 90 none -- python3 "$mlp"
    run_prog mlp nocache 90 none PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 "$mlp"
    run_prog mlp nocache+cudefer 90 cudefer PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 "$mlp"
    run_prog transformer caching 120 none -- python3 "$tf"
    run_prog transformer nocache 120 none PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 "$tf"
    run_prog transformer nocache+cudefer 120 cudefer PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- \
        python3 "$tf"
    # Its activations of 16-64 MiB outgrow the default device cache (256 MiB).
    run_prog transformer nocache+cudefer-bigcache 120 cudefer PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        CUDEFER_DEVICE_CACHE=$BIG_CACHE -- python3 "$tf"

    say "== 3. JAX: jax_mlp.py"
    local jx=$PROGRAMS/jax_mlp.py
    run_prog jax default 120 none -- python3 "$jx"
    run_prog jax platform 120 none XLA_PYTHON_CLIENT_ALLOCATOR=platform -- python3 "$jx"
    run_prog jax platform+cudefer 120 cudefer XLA_PYTHON_CLIENT_ALLOCATOR=platform -- \
        python3 "$jx"

    say "== 4. CuPy: cupy_pinned.py"
    local cpy=$PROGRAMS/cupy_pinned.py
    run_prog cupy caching 120 none -- python3 "$cpy" --caching
    run_prog cupy nocache 120 none -- python3 "$cpy"
    run_prog cupy nocache+cudefer 120 cudefer -- python3 "$cpy"

    extra rt || return 0
    say "== 5. rt_hostloop (CUDA runtime; BENCH_EXTRA=rt)"
    if [ -x "$RT" ]; then
        run_prog rt_hostloop none 90 none -- "$RT"
        run_prog rt_hostloop cudefer 90 cudefer -- "$RT"
    else
        say "RUN prog=rt_hostloop variant=- rc=skipped secs=0" >>"$RESULTS"
        FAILURES=$((FAILURES + 1))
    fi
}

# ---- the tables of the real programs, and the goals ---------------------------------

# programs_table RESULTS GOALS_OUT: the real programs' table on stdout, their
# goals (goal, measured, verdict; tab-separated) into GOALS_OUT.
programs_table() {
    python3 - "$1" "$2" "$BIG_CACHE" <<'PY'
import sys

results = {}   # (prog, variant) -> list of dicts (RESULT lines)
runs = {}      # (prog, variant) -> dict (RUN line)
order = []     # (prog, variant) in the order they ran
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 2 or f[0] not in ("RUN", "RESULT"):
        continue
    kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
    key = (kv.get("prog"), kv.get("variant"))
    if f[0] == "RUN":
        runs[key] = kv
        order.append(key)
    else:
        results.setdefault(key, []).append(kv)
goals_out = open(sys.argv[2], "w")


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
    if r is None or key not in r:
        return None, "-"
    return float(r[key]), f"{fnum(r[key])} ({fnum(r[lo])}–{fnum(r[hi])})"


def status(prog, variant):
    k = runs.get((prog, variant))
    if k is None:
        return "not run"
    return "" if k.get("rc") == "0" else f"exit {k.get('rc')}"


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "-"


# prog, label, selector, value key, hash key, goal: (kind, limit, text) or None,
# and optionally the variant with cudefer (else the third of variants[prog])
BIG_CACHE = sys.argv[3]
rows = [
    ("mlp", "PyTorch MLP training step (mlp.py), µs", {}, "us_per_step", "loss_sha256",
     ("le_caching", 1.0, "PyTorch MLP: cudefer without caching ≤ 1.0× the caching allocator")),
    ("transformer", "PyTorch transformer training step (transformer.py: torch.nn."
     "TransformerEncoder, 6 layers, d_model 512, 8 heads, batch 64 × 128, AdamW), µs", {},
     "us_per_step", "loss_sha256",
     ("le_caching", 1.0, "PyTorch transformer: cudefer without caching ≤ 1.0× the caching "
      "allocator")),
    ("transformer", "the same, cudefer with CUDEFER_DEVICE_CACHE=" + BIG_CACHE + ", µs", {},
     "us_per_step", "loss_sha256",
     ("le_caching", 1.0, "PyTorch transformer, CUDEFER_DEVICE_CACHE=" + BIG_CACHE +
      ": cudefer without caching ≤ 1.0× the caching allocator"), "nocache+cudefer-bigcache"),
    ("jax", "JAX MLP training step (jax_mlp.py), µs; no caching = "
     "XLA_PYTHON_CLIENT_ALLOCATOR=platform, caching = the default allocator", {},
     "us_per_step", "loss_sha256",
     ("le_caching", 1.25, "JAX MLP: cudefer + platform allocator ≤ 1.25× the default allocator")),
    ("cupy", "CuPy pinned 4 MiB round trip (cupy_pinned.py pinned), µs per iteration",
     {"loop": "pinned"}, "us_per_iter", "sha256",
     ("speedup", 5.0, "CuPy pools off, pinned 4 MiB round trip: cudefer ≥ 5× faster")),
    ("cupy", "CuPy 100 small device allocations while another stream computes "
     "(cupy_pinned.py device_busy), µs per 100", {"loop": "device_busy"}, "us_per_iter",
     "sha256",
     ("speedup", 5.0, "CuPy pools off, 100 small device allocations: cudefer ≥ 5× faster")),
    ("cupy", "CuPy 100 small device allocations, nothing else running (device_idle: the "
     "earlier loop, for reference), µs per 100", {"loop": "device_idle"}, "us_per_iter",
     "sha256", None),
    ("rt_hostloop", "rt_hostloop cudaMallocHost/cudaFreeHost: µs per iteration",
     {"loop": "mallochost"}, "us_per_iter", "checksum", None),
    ("rt_hostloop", "rt_hostloop cudaHostRegister/Unregister: µs per iteration",
     {"loop": "register"}, "us_per_iter", "checksum",
     ("never_slower", 1.0, "rt_hostloop registration beside a busy stream: never slower")),
]
variants = {  # no caching, caching, no caching + cudefer
    "mlp": ("nocache", "caching", "nocache+cudefer"),
    "transformer": ("nocache", "caching", "nocache+cudefer"),
    "jax": ("platform", "default", "platform+cudefer"),
    "cupy": ("nocache", "caching", "nocache+cudefer"),
    "rt_hostloop": ("none", None, "cudefer"),
}

print("### Real programs\n")
print("Median (min–max). \"no caching\": PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1, JAX "
      "with XLA_PYTHON_CLIENT_ALLOCATOR=platform, CuPy with set_allocator(None) and "
      "set_pinned_memory_allocator(None); \"caching\": their default allocators. Speedup: "
      "no caching without / with cudefer. Results: the programs' hashes of their losses or "
      "outputs, compared across the three runs (where they differ, which runs agree, and "
      "the spread of the final losses relative to their size: a difference between the "
      "two runs without cudefer is the allocators' own). Peak device memory: MiB above "
      "the level before the work, no caching / caching / cudefer: NVML's figure for the "
      "GPU, sampled after every step (what the GPU holds, cudefer's cache included; where "
      "NVML could not be had, mem_get_info's, which under cudefer counts its cache as "
      "free: the notes below say which); JAX: its peak_bytes_in_use where reported.\n")
print("| program | no caching | caching | no caching + cudefer | speedup (cudefer vs no caching) "
      "| cudefer / caching | results identical | peak device memory (MiB) | goal |")
print("|---|---|---|---|---|---|---|---|---|")
notes = []
for prog, label, sel, key, hkey, goal, *other in rows:
    vn, vc, vd = variants[prog]
    if other:
        vd = other[0]
    if not any(k[0] == prog for k in runs):
        continue
    rn = pick(prog, vn, sel)
    rc = pick(prog, vc, sel) if vc else None
    rd = pick(prog, vd, sel)
    xn, cn = cell(rn, key)
    xc, cc = cell(rc, key) if vc else (None, "-")
    xd, cd = cell(rd, key)
    for v in (vn, vc, vd):
        if v and status(prog, v):
            notes.append(f"{prog} / {v}: {status(prog, v)}")
    got = [(v, r) for v, r in ((vn, rn), (vc, rc), (vd, rd)) if r is not None]
    hashes = {v: r.get(hkey) for v, r in got}
    oks = [r.get("ok", "1") == "1" and r.get("errors", "0") == "0" for _, r in got]
    if len(hashes) < (3 if vc else 2):
        same = f"incomplete ({len(hashes)} runs)"
    elif len(set(hashes.values())) == 1:
        same = f"yes ({len(hashes)} runs)"
    else:
        # Which runs agree: a difference already there without cudefer (the
        # two allocators alone) is not cudefer's doing.
        groups = {}
        for v, h in hashes.items():
            groups.setdefault(h, []).append(v)
        agree = ("no two runs agree" if len(groups) == len(hashes) else
                 "; ".join(" = ".join(g) for g in groups.values()))
        losses = [float(r["final_loss"]) for _, r in got if "final_loss" in r]
        if len(losses) == len(got) and max(abs(x) for x in losses) > 0:
            spread = (max(losses) - min(losses)) / max(abs(x) for x in losses)
            same = f"NO, {agree}: final losses within {spread:.1e} (relative)"
        else:
            same = "NO: " + ", ".join(f"{v} {str(h)[:12]}" for v, h in hashes.items())
    if not all(oks):
        same += "; CHECK FAILED"
    mem = " / ".join(r.get("peak_mem_mib", "-") if r else "-" for r in (rn, rc, rd)) \
        if prog != "rt_hostloop" else "-"
    g = "-"
    if goal:
        kind, limit, text = goal
        verdict, measured = "not measured", "–"
        if kind == "le_caching" and xd and xc:
            verdict = "met" if xd <= limit * xc else "NOT met"
            measured = f"{xd / xc:.2f}× ({fnum(xd)} vs {fnum(xc)} µs)"
        elif kind == "speedup" and xd and xn:
            verdict = "met" if xn >= limit * xd else "NOT met"
            measured = f"{xn / xd:.2f}× faster ({fnum(xn)} → {fnum(xd)} µs)"
        elif kind == "never_slower" and xd and xn:
            verdict = "met" if xd <= xn else "NOT met"
            measured = f"{xd / xn:.2f}× the driver ({fnum(xd)} vs {fnum(xn)} µs)"
        if not all(oks):
            verdict = "NOT met (a result check failed)"
        elif same.startswith("NO"):
            measured += "; results differ"
        short = {"le_caching": f"cudefer ≤ {limit:g}× caching",
                 "speedup": f"≥ {limit:g}× faster than no caching",
                 "never_slower": "never slower"}[kind]
        g = f"{short}: {verdict}"
        goals_out.write(f"{text}\t{measured}\t{verdict}\n")
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
        if prog in ("mlp", "transformer", "jax"):
            peak = ""
            if r.get("mem_source"):
                peak = (f", peak memory {r.get('peak_mem_mib')} MiB from {r.get('mem_source')}, "
                        f"{r.get('visible_peak_mib')} MiB as mem_get_info said")
            extra.append(f"{prog} {variant}: p10 {r.get('p10')} µs, p90 {r.get('p90')} µs, "
                         f"{r.get('steps')} steps ({r.get('warmup')} warm-up), total "
                         f"{r.get('total_s')} s, final loss {r.get('final_loss')}{peak}")
        if prog == "cupy":
            bg = ""
            if r.get("bg_launched") not in (None, "0"):
                bg = (f", {r.get('bg_launched')} products of {r.get('bg_n')}² on the other "
                      f"stream")
            extra.append(f"cupy {variant} {r.get('loop')}: {r.get('iters')} iterations × "
                         f"{r.get('runs')} runs, {r.get('words')} words{bg}")
if extra:
    print("\n" + "\n".join(f"- {e}" for e in extra))
if order:
    print("\nSeconds per run: " + ", ".join(
        f"{p} {v} {runs[(p, v)].get('secs', '?')}"
        + ("" if runs[(p, v)].get("rc") == "0" else f" (exit {runs[(p, v)].get('rc')})")
        for p, v in order) + ".")
PY
}

# goals_table FILE...: the goals (tab-separated lines: goal, measured,
# verdict) as one table, with the date, the GPU and driver, and the command.
goals_table() {
    say "## Goals"
    say ""
    say "$(date -u '+%Y-%m-%d %H:%M UTC'); $(gl_gpu_line); \`$COMMAND\`."
    say ""
    say "| goal | measured | verdict |"
    say "|---|---|---|"
    cat "$@" 2>/dev/null | awk -F'\t' '
        NF >= 3 { printf "| %s | %s | %s |\n", $1, $2, $3; n++ }
        NF >= 3 && $3 ~ /^met/ { met++ }
        NF >= 3 && $3 ~ /^NOT met/ { not++ }
        NF >= 3 && $1 ~ /^loops,/ && $1 !~ /median over rounds/ { single++ }
        END { printf "\n%d goals: %d met, %d not met, %d without a verdict.\n",
                     n, met, not, n - met - not
              if (single)
                  printf "\nThe loop goals are judged here by one process of each " \
                         "mode. At 4 KiB two processes of the same code differ by up to " \
                         "1.5× (bench/RESULTS.md, runs 117–127): judge those by the " \
                         "median over rounds of processes (--rounds N, or " \
                         "bench/probes/rounds.sh).\n" }'
}

# ---- main --------------------------------------------------------------------------

environment() {
    say "# cudefer benchmarks"
    say ""
    say "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    say "- command: \`$COMMAND\`"
    say "- gpu and driver: $(gl_gpu_line)"
    say "- commit: $(gl_commit_line)"
    say "- host: $(gl_host_line); $(nproc) CPUs"
    say "- tools: $(gl_tools_line)"
    [ -n "${BENCH_DRIVER_DIR:-}" ] && say "- NOTE: libcuda.so.1 from $BENCH_DRIVER_DIR (a dry run of this script, not a GPU run)"
    return 0
}

environment | tee "$WORK/env.md"
build
run_loops
[ "${BENCH_PROGRAMS:-1}" = 0 ] || run_programs

{
    cat "$WORK/env.md"
    say "- elapsed: $SECONDS s; steps that failed or were skipped: $FAILURES"
    say ""
    if [ -s "$WORK/loops.md" ]; then
        # cudefer-loops' own heading one level down; its goals go into the
        # table at the end.
        sed -e 's/^## cudefer-loops$/### cudefer-loops (driver API)/' \
            -e '/^### Goals (cudefer-loops)$/,$d' "$WORK/loops.md"
    else
        say "### cudefer-loops: no output (see loops.err)"
    fi
    say ""
    programs_table "$RESULTS" "$WORK/programs.goals" 2>&1
    say ""
    goals_table "$WORK/loops.goals" "$WORK/programs.goals"
    say ""
    say "Full logs in $OUT_DIR: results.txt, build.log, loops.log, loops.err, programs.log."
} >"$SUMMARY"

say ""
cat "$SUMMARY"
[ "$FAILURES" = 0 ]
