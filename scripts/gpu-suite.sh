#!/usr/bin/env bash
# gpu-suite.sh - a pytest suite that this project did not write, run on a GPU
# machine twice, without and with cudefer, and the two outcomes compared
# test by test.
#
#     OUT=/some/folder scripts/gpu-suite.sh SUITE_DIR [PYTEST_ARGS...]
#
# SUITE_DIR holds the suite's files (fetched from its public repository and
# carried to the machine, which has no network). Each run is made in the
# cleaned environment (no LD_PRELOAD, no CUDEFER_*), the second with the
# shim preloaded and CUDEFER_STATS=1, with pytest -v. Writes
# $OUT/without.log and $OUT/with.log (and .err), and prints: the counts of
# each run, every test whose outcome differs (of those that ended in both:
# a run stopped by its limit still counts what it finished), and whether
# cudefer printed anything on stderr besides its statistics.
#
# CuPy's suite with its memory pools off in both runs (every array a
# cudaMalloc and a cudaFree; tests/gpu/cupy_pools_off.py):
#
#     PYTHONPATH=$PWD/tests/gpu OUT=... scripts/gpu-suite.sh ../cupy/tests \
#         -p cupy_pools_off cupy_tests/core_tests/test_ndarray_indexing.py
#
# JAX's with its platform allocator in both runs (every buffer made and
# freed as the program goes; SUITE_DIR holds JAX's conftest.py and tests/):
#
#     XLA_PYTHON_CLIENT_ALLOCATOR=platform OUT=... scripts/gpu-suite.sh \
#         ../jax tests/memories_test.py tests/array_test.py
#
# Environment: OUT (default ./gpu-out/suite), SUITE_LIMIT_S (each run's
# limit, default 240), SUITE_CUDEFER (CUDEFER_* settings, NAME=VALUE words,
# for the run with cudefer).
# Exit status: 0 when every test has the same outcome in both runs and
# cudefer printed nothing else, 1 otherwise, 2 on bad use.
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
CUDA=${CUDA_PATH:-/usr/local/cuda}
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"

if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    echo "usage: OUT=DIR scripts/gpu-suite.sh SUITE_DIR [PYTEST_ARGS...]" >&2
    exit 2
fi
SUITE=$(cd "$1" && pwd)
shift
OUT_DIR=${OUT:-$ROOT/gpu-out/suite}
LIMIT=${SUITE_LIMIT_S:-240}
mkdir -p "$OUT_DIR" || exit 2

BUILD=$ROOT/build-suite
gl_build_shim "$BUILD" "$OUT_DIR/build.log" || {
    say "gpu-suite: the shim did not build (see $OUT_DIR/build.log)"
    exit 1
}
SHIM=$BUILD/shim/libcudefer.so
gl_gpu_line
gl_commit_line
say "suite: $SUITE $*"

run() {
    local name=$1
    shift
    (cd "$SUITE" && gl_run "$LIMIT" "$OUT_DIR/$name.log" "$OUT_DIR/$name.err" "$@" \
        python3 -m pytest -v -p no:cacheprovider "${ARGS[@]}" &&
        say "$name: exit $GL_RC after $(gl_secs 1) s, $(tail -1 "$OUT_DIR/$name.log")")
}
ARGS=("$@")
run without
# SUITE_CUDEFER: more CUDEFER_* settings for the run with cudefer (words
# NAME=VALUE), for example CUDEFER_KEEP=1G.
read -r -a EXTRA <<<"${SUITE_CUDEFER:-}"
run with LD_PRELOAD="$SHIM" CUDEFER_STATS=1 "${EXTRA[@]}"

python3 - "$OUT_DIR" <<'EOF'
import re, sys
out = sys.argv[1]
# pytest -v prints "FILE::TEST OUTCOME [ n%]" as each test ends: a run
# stopped by its limit still tells the tests it finished.
line = re.compile(r"^(\S+::.+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: +\[ *\d+%\])?\s*$")
def outcomes(name):
    res = {}
    with open(f"{out}/{name}.log", errors="replace") as f:
        for l in f:
            m = line.match(l)
            if m:
                res[m.group(1)] = m.group(2).lower()
    return res
a, b = outcomes("without"), outcomes("with")
for name, r in (("without", a), ("with", b)):
    counts = {}
    for v in r.values():
        counts[v] = counts.get(v, 0) + 1
    print(f"{name} cudefer: {len(r)} tests ended: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
both = set(a) & set(b)
diff = sorted(k for k in both if a[k] != b[k])
for k in diff:
    print(f"DIFFERS: {k}: without {a[k]}, with {b[k]}")
print(f"compared: {len(both)} tests that ended in both runs; outcome differs: {len(diff)}")
sys.exit(1 if diff or not both else 0)
EOF
same=$?
# What cudefer printed besides its statistics (CUDEFER_STATS=1).
grep '^cudefer:' "$OUT_DIR/with.err" | grep -v -E '^cudefer: (statistics|  )' >"$OUT_DIR/with.cudefer" || true
noise=$(wc -l <"$OUT_DIR/with.cudefer")
say "lines cudefer printed besides its statistics: $noise"
grep -A16 '^cudefer: statistics' "$OUT_DIR/with.err" | head -40
[ "$same" -eq 0 ] && [ "$noise" -eq 0 ] && exit 0
exit 1
