#!/usr/bin/env bash
# gpu-ranks.sh - two torchrun ranks on ONE GPU, without and with cudefer,
# each rank writing its own report (under 3 minutes).
#
# Run from anywhere on a machine with an NVIDIA GPU, python3 with torch
# (torchrun), and either a built shim or what building one needs (the CUDA
# toolkit's cuda.h, meson + ninja or gcc):
#
#     scripts/gpu-ranks.sh [SHIM]
#
# SHIM is the libcudefer.so to preload; without it, $CUDEFER_SHIM; without
# that, the script builds build-gpu/ (meson setup build-gpu -Dtests=false, as
# scripts/gpu-multi.sh does; gcc directly if meson fails) and takes the
# library from there. It runs tests/gpu/torchrun_ranks.py twice with
# `torchrun --standalone --nproc-per-node=2`, both ranks on GPU 0
# (CUDA_VISIBLE_DEVICES=0), PYTORCH_NO_CUDA_MEMORY_CACHING=1, the gloo
# backend, and CUDEFER_REPORT=$OUT/<mode>/rank-%p.json:
#   none   without cudefer: no report may appear;
#   shim   LD_PRELOAD=SHIM in front of what LD_PRELOAD had: each rank's report,
#          rank-<its pid>.json, must exist, be valid JSON, name that pid, and
#          count at least the rank's frees among the device releases cudefer
#          took, with no release that failed.
# Both runs must exit with status 0, with every all-reduce summed right.
# Reports of other processes (the torchrun agent, if it used the driver)
# are listed, not judged.
#
# Writes into $OUT (default ./gpu-out/ranks): summary.txt (also printed),
# results.txt (the RUN, RESULT and CHECK lines), runs.log (each run: command,
# exit status, output), build.log, and the reports under none/ and shim/.
# Exit status: 0 when every check passed, 1 otherwise, 3 when torch finds no
# CUDA device (nothing checked).
#
# Environment: OUT, CUDEFER_SHIM, CUDA_PATH (default /usr/local/cuda),
# GPU_RANKS_ITERS (rounds per rank, default 300), GPU_RANKS_TIMEOUT_S (per
# run, default 240).
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/gpu-out/ranks}
CUDA=${CUDA_PATH:-/usr/local/cuda}
ITERS=${GPU_RANKS_ITERS:-300}
LIMIT_S=${GPU_RANKS_TIMEOUT_S:-240}
BUILD=$ROOT/build-gpu
SHIM=${1:-${CUDEFER_SHIM:-}}

mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS=$OUT_DIR/results.txt
RUNLOG=$OUT_DIR/runs.log
BUILDLOG=$OUT_DIR/build.log
SUMMARY=$OUT_DIR/summary.txt
: >"$RESULTS"
: >"$RUNLOG"
: >"$BUILDLOG"
: >"$SUMMARY"

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# ---- the shim ------------------------------------------------------------------

# The library file of build-gpu/shim (its name carries the version, or not).
built_shim() {
    local f
    for f in "$BUILD"/shim/libcudefer.so*; do
        if [ -f "$f" ] && [ ! -L "$f" ]; then
            printf '%s\n' "$f"
            return 0
        fi
    done
    return 1
}

build_shim() {
    echo "== meson setup build-gpu -Dtests=false; ninja -C build-gpu" >>"$BUILDLOG"
    if { [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dtests=false; } >>"$BUILDLOG" 2>&1 &&
        ninja -C "$BUILD" >>"$BUILDLOG" 2>&1 && built_shim >/dev/null; then
        built_shim
        return 0
    fi
    echo "== meson failed; the shim with gcc directly" >>"$BUILDLOG"
    mkdir -p "$BUILD/shim-gcc" || return 1
    gcc -std=c11 -O2 -g -fPIC -shared -D_GNU_SOURCE -fvisibility=hidden \
        -I"$ROOT/include" -I"$ROOT/shim/base" -I"$ROOT/shim/engine" -I"$ROOT/shim/doors" \
        -I"$CUDA/include" "$ROOT"/shim/*/*.c \
        -Wl,--version-script="$ROOT/shim/doors/libcudefer.map" \
        -o "$BUILD/shim-gcc/libcudefer.so" -lpthread -ldl >>"$BUILDLOG" 2>&1 || return 1
    printf '%s\n' "$BUILD/shim-gcc/libcudefer.so"
}

# ---- running -------------------------------------------------------------------

if command -v torchrun >/dev/null 2>&1; then
    TORCHRUN=(torchrun)
else
    TORCHRUN=(python3 -m torch.distributed.run)
fi

# run MODE [VAR=VALUE...]: the two ranks, with the environment given; their
# output in $OUT_DIR/MODE.{out,err}, the RUN and RESULT lines in results.txt.
run() {
    local mode=$1
    shift
    local dir=$OUT_DIR/$mode
    rm -rf "$dir"
    mkdir -p "$dir"
    local -a vars=(-u LD_PRELOAD)
    local v
    for v in $(env | sed -n 's/^\(CUDEFER_[A-Za-z0-9_]*\)=.*/\1/p'); do
        vars+=(-u "$v")
    done
    # gloo over the loopback interface: both ranks are on this host, whose
    # name may not resolve to an address.
    vars+=(CUDA_VISIBLE_DEVICES=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 GLOO_SOCKET_IFNAME=lo
        "CUDEFER_REPORT=$dir/rank-%p.json" "$@")
    local -a cmd=(timeout -k 10 "$LIMIT_S" env "${vars[@]}" "${TORCHRUN[@]}" --standalone
        --nproc-per-node=2 "$ROOT/tests/gpu/torchrun_ranks.py" --iters "$ITERS")
    local t0=$SECONDS rc
    "${cmd[@]}" >"$OUT_DIR/$mode.out" 2>"$OUT_DIR/$mode.err"
    rc=$?
    echo "RUN mode=$mode rc=$rc secs=$((SECONDS - t0))" >>"$RESULTS"
    # (torchrun may put a prefix before a rank's lines)
    grep -o 'RESULT torchrun_ranks .*' "$OUT_DIR/$mode.out" |
        sed "s/^RESULT torchrun_ranks /RESULT torchrun_ranks mode=$mode /" >>"$RESULTS"
    {
        echo
        echo "=== $mode: exit $rc after $((SECONDS - t0))s (limit ${LIMIT_S}s)"
        echo "command: ${cmd[*]}"
        echo "--- stdout"
        cat "$OUT_DIR/$mode.out"
        echo "--- stderr"
        tail -n 200 "$OUT_DIR/$mode.err"
    } >>"$RUNLOG"
    printf '  %-5s exit %-4s %4ss\n' "$mode" "$rc" "$((SECONDS - t0))" | tee -a "$SUMMARY"
}

# The checks of both runs, from results.txt and the reports: CHECK lines
# in results.txt, a table on stdout, and the last line
# "verdicts: N passed, N failed".
verdicts() {
    python3 - "$RESULTS" "$OUT_DIR" <<'EOF'
import json, os, re, sys

results, out = sys.argv[1], sys.argv[2]
fields = lambda line: dict(re.findall(r"(\w+)=(\S+)", line))
runs, ranks = {}, {}
for line in open(results):
    if line.startswith("RUN "):
        f = fields(line)
        runs[f["mode"]] = f
    elif line.startswith("RESULT torchrun_ranks "):
        f = fields(line)
        ranks.setdefault(f["mode"], []).append(f)

checks = []
def check(mode, ok, what):
    checks.append((mode, bool(ok), what))

for mode in ("none", "shim"):
    run = runs.get(mode)
    got = ranks.get(mode, [])
    check(mode, run and run["rc"] == "0", "torchrun exit status %s" % (run or {}).get("rc"))
    done = [r for r in got if "ok" in r]
    check(mode, len(done) == 2, "2 ranks reported (%d)" % len(done))
    for r in done:
        check(mode, r["ok"] == "1", "rank %s: all-reduces and products right (bad=%s)"
              % (r["rank"], r["bad"]))
        check(mode, r["cudefer"] == ("1" if mode == "shim" else "0"),
              "rank %s: cudefer loaded=%s" % (r["rank"], r["cudefer"]))
    folder = os.path.join(out, mode)
    files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if mode == "none":
        check(mode, not files, "no report without cudefer (%s)" % (files or "none"))
        continue
    if "rank-%p.json" in files:
        check(mode, False, "the shim wrote rank-%p.json: it does not expand %p in CUDEFER_REPORT")
    pids = set()
    for r in done:
        pid = int(r["pid"])
        pids.add("rank-%d.json" % pid)
        path = os.path.join(folder, "rank-%d.json" % pid)
        if not os.path.isfile(path):
            check(mode, False, "rank %s: report rank-%d.json exists" % (r["rank"], pid))
            continue
        try:
            report = json.load(open(path))
        except ValueError as e:
            check(mode, False, "rank %s: rank-%d.json is valid JSON (%s)" % (r["rank"], pid, e))
            continue
        check(mode, report.get("pid") == pid,
              "rank %s: the report names pid %d (%r)" % (r["rank"], pid, report.get("pid")))
        kinds = report.get("kinds", {})
        deferred = kinds.get("deferred", {}).get("device", 0)
        check(mode, deferred >= int(r["frees"]),
              "rank %s: device releases taken by cudefer %d >= the rank's frees %s"
              % (r["rank"], deferred, r["frees"]))
        errors = sum(kinds.get("errors", {}).values())
        check(mode, errors == 0, "rank %s: no release failed (%d)" % (r["rank"], errors))
    others = [f for f in files if f not in pids]
    if others:
        print("other reports (not judged): %s" % " ".join(others))

with open(results, "a") as f:
    for mode, ok, what in checks:
        f.write("CHECK mode=%s ok=%d %s\n" % (mode, ok, what))
for mode, ok, what in checks:
    print("  %-5s %-4s %s" % (mode, "ok" if ok else "FAIL", what))
seconds = {m: [r.get("seconds") for r in ranks.get(m, [])] for m in ("none", "shim")}
print("seconds per rank (the loop): without cudefer %s, with cudefer %s"
      % (" ".join(map(str, seconds["none"])) or "-", " ".join(map(str, seconds["shim"])) or "-"))
passed = sum(ok for _, ok, _ in checks)
print("verdicts: %d passed, %d failed" % (passed, len(checks) - passed))
EOF
}

# ---- main ----------------------------------------------------------------------

say "cudefer: two torchrun ranks on one GPU, $(date -u '+%Y-%m-%d %H:%M UTC')"
say "command: cd $ROOT && scripts/gpu-ranks.sh${1:+ $1}${OUT:+ (OUT=$OUT)}"
say "commit:  $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '(with local changes)')"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null |
        sed 's/^/gpu:     /' | tee -a "$SUMMARY"
fi
torch_line=$(python3 -c 'import torch; print(torch.__version__, int(torch.cuda.is_available()))' \
    2>&1 | tail -n 1)
say "torch:   $torch_line"
case $torch_line in
*" 1") ;;
*)
    say "torch with a CUDA device is missing: nothing checked"
    exit 3
    ;;
esac

if [ -z "$SHIM" ]; then
    if ! SHIM=$(build_shim); then
        tail -n 40 "$BUILDLOG"
        say "the shim could not be built (log: $BUILDLOG)"
        exit 1
    fi
fi
if [ ! -f "$SHIM" ]; then
    say "no shim at $SHIM"
    exit 1
fi
SHIM=$(cd "$(dirname "$SHIM")" && pwd)/$(basename "$SHIM")
say "shim:    $SHIM"
say ""

say "== torchrun --standalone --nproc-per-node=2 tests/gpu/torchrun_ranks.py --iters $ITERS"
run none
run shim "LD_PRELOAD=$SHIM${LD_PRELOAD:+:$LD_PRELOAD}"
say ""
verdicts | tee -a "$SUMMARY"
say ""
say "output: $OUT_DIR (summary.txt, results.txt, runs.log, build.log, none/, shim/); ${SECONDS}s"
if grep -q '^verdicts: [0-9]* passed, 0 failed' "$SUMMARY"; then
    exit 0
fi
exit 1
