#!/usr/bin/env bash
# fuzz.sh - builds the libFuzzer targets of tests/fuzz with clang and runs them.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    run each target SECONDS (default 20)
#   scripts/fuzz.sh --build                  only build
#
# Targets (tests/fuzz/README.md): fuzz_options (the CUDEFER_* parser),
# fuzz_api (random call sequences through the shim over the test driver, with
# a 1 MiB device cache) and fuzz_api_pre125 (the same binary with
# TESTDRIVER_VERSION=12040, the fence made of per-stream events for drivers
# before 12.5, and CUDEFER_DEVICE_CACHE=0, device frees issued at once).
# Default: all three, one after the other.
#
# Everything goes under build-fuzz/ (or $CUDEFER_FUZZ_BUILD):
#   libcuda.so.1    the test driver, built with ASan + UBSan
#   libcudefer.so   the shim from shim/*.c, ASan + UBSan + coverage
#   fuzz_options, fuzz_api
#   corpus/TARGET/  the corpus, kept between runs (not in git)
#   crashes/TARGET/ inputs that failed (crash-*, timeout-*, oom-*)
#   logs/TARGET.log libFuzzer's output
# The dictionaries in tests/fuzz/*.dict seed the runs.
#
# Each run ends with a line "fuzz: TARGET: N runs in S s, cov C, ft F,
# corpus K, OK|FAILED". A failing input is reproduced with
#   build-fuzz/fuzz_api build-fuzz/crashes/fuzz_api/crash-...
# Exit status: 0 when every run ended without a finding, 1 otherwise, 2 when
# the build failed; 77 when clang or its libFuzzer runtime is missing.
#
# Environment: CLANG (default clang), CUDA_PATH (default /usr/local/cuda),
# CUDEFER_FUZZ_BUILD, FUZZ_JOBS (parallel libFuzzer jobs per target, default 1),
# FUZZ_ARGS (more libFuzzer flags).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${CUDEFER_FUZZ_BUILD:-$root/build-fuzz}
cc=${CLANG:-clang}
cuda=${CUDA_PATH:-/usr/local/cuda}

say() { printf 'fuzz: %s\n' "$*"; }

build_only=0
seconds=20
if [[ ${1:-} == --build ]]; then
    build_only=1
    shift
elif [[ ${1:-} =~ ^[0-9]+$ ]]; then
    seconds=$1
    shift
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
    targets=(fuzz_options fuzz_api fuzz_api_pre125)
fi

if ! command -v "$cc" >/dev/null 2>&1; then
    say "$cc not found: the fuzz targets need clang with libFuzzer (skipped)"
    exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; return (int)n * 0; }' |
    "$cc" -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then
    say "$cc cannot link -fsanitize=fuzzer (no libFuzzer runtime; skipped)"
    exit 77
fi
if [[ ! -f $cuda/include/cuda.h ]]; then
    say "no $cuda/include/cuda.h (set CUDA_PATH)"
    exit 2
fi

# ---- build ------------------------------------------------------------------

mkdir -p "$build/obj/shim" "$build/obj/driver" "$build/logs"
common=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Wall -Wextra
        -fvisibility=hidden -I"$cuda/include" -I"$root/include"
        -I"$root/shim/base" -I"$root/shim/engine" -I"$root/shim/doors")
# shellcheck disable=SC2054 # the commas belong to -fsanitize's value
sanitize=(-fsanitize=address,undefined -fno-sanitize-recover=all)

# Compiles each source into DIR/NAME.o with the extra flags of the array named
# FLAGS, unless the object is newer than the source, every header of the
# project and this script; prints the objects.
newest_header=$(find "$root/shim" "$root/include" "$root/tests/driver" -name '*.h' \
                     -printf '%T@\n' | sort -n | tail -1)
compile() { # dir flags-array-name sources...
    local dir=$1
    local -n extra=$2
    shift 2
    local src obj
    for src in "$@"; do
        obj=$dir/$(basename "${src%.c}").o
        if [[ ! -f $obj || $src -nt $obj || ${BASH_SOURCE[0]} -nt $obj ]] ||
            (($(stat -c %Y "$obj") < ${newest_header%.*} + 1)); then
            "$cc" "${common[@]}" "${extra[@]}" -fPIC -c "$src" -o "$obj" || return 1
        fi
        echo "$obj"
    done
}

build_all() {
    local objs driver_srcs=() shim_srcs=() f
    # The test driver: every source of tests/driver but its own suites.
    for f in "$root"/tests/driver/*.c; do
        [[ $(basename "$f") == test_* ]] || driver_srcs+=("$f")
    done
    # The shim: every source of shim/ (shim/meson.build lists them all).
    shim_srcs=("$root"/shim/*/*.c)

    # shellcheck disable=SC2034 # used through compile's nameref
    local driver_flags=("${sanitize[@]}")
    mapfile -t objs < <(compile "$build/obj/driver" driver_flags "${driver_srcs[@]}") || return 1
    ((${#objs[@]} == ${#driver_srcs[@]})) || return 1
    "$cc" -shared -Wl,-soname,libcuda.so.1 "${sanitize[@]}" \
        -o "$build/libcuda.so.1" "${objs[@]}" -lpthread -lm || return 1

    # shellcheck disable=SC2034 # used through compile's nameref
    local shim_flags=("${sanitize[@]}" -fsanitize=fuzzer-no-link)
    mapfile -t objs < <(compile "$build/obj/shim" shim_flags "${shim_srcs[@]}") || return 1
    ((${#objs[@]} == ${#shim_srcs[@]})) || return 1
    "$cc" -shared -Wl,-soname,libcudefer.so "${sanitize[@]}" -fsanitize=fuzzer-no-link \
        -Wl,--version-script="$root/shim/doors/libcudefer.map" \
        -o "$build/libcudefer.so" "${objs[@]}" -ldl -lpthread || return 1

    # The options parser, linked directly.
    "$cc" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$root/shim/base" -o "$build/fuzz_options" \
        "$root/tests/fuzz/fuzz_options.c" "$root/shim/base/options.c" || return 1

    # The API: the shim before the test driver in the link order, so that its
    # cu* symbols come first in the lookup scope, as with LD_PRELOAD.
    "$cc" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$root/tests" -I"$root/tests/driver" -o "$build/fuzz_api" \
        "$root/tests/fuzz/fuzz_api.c" "$build/libcudefer.so" "$build/libcuda.so.1" \
        -Wl,-rpath,"$build" -ldl -lpthread || return 1
}

log=$build/logs/build.log
if ! build_all >"$log" 2>&1; then
    cat "$log"
    say "the build failed (log: $log)"
    exit 2
fi
if grep -q 'warning:' "$log"; then
    grep -B2 -A6 'warning:' "$log"
    say "the build has warnings (log: $log)"
fi
if ((build_only)); then
    say "built under $build"
    exit 0
fi

# ---- run ----------------------------------------------------------------------

# The sanitizer runtimes are linked into the fuzzer binaries; the two
# libraries find theirs there.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
lsan_supp=$root/tests/sanitizers/lsan.supp
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$lsan_supp:print_suppressions=0}

status=0
for target in "${targets[@]}"; do
    binary=$target
    env=()
    case $target in
        fuzz_options) dict=$root/tests/fuzz/options.dict ;;
        fuzz_api) dict= ;;
        fuzz_api_pre125)
            binary=fuzz_api
            dict=
            env=(TESTDRIVER_VERSION=12040 CUDEFER_DEVICE_CACHE=0)
            ;;
        *) say "unknown target $target"; status=1; continue ;;
    esac
    corpus=$build/corpus/$target
    crashes=$build/crashes/$target
    mkdir -p "$corpus" "$crashes"
    args=(-max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
          -artifact_prefix="$crashes/")
    [[ -n $dict ]] && args+=(-dict="$dict")
    # A call sequence is at most 64 operations of a few bytes: long inputs
    # from the start, rather than libFuzzer's slowly growing length limit.
    [[ $binary == fuzz_api ]] && args+=(-max_len=320 -len_control=0)
    if ((${FUZZ_JOBS:-1} > 1)); then
        args+=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
    fi
    # shellcheck disable=SC2206
    args+=(${FUZZ_ARGS:-})
    tlog=$build/logs/$target.log
    start=$SECONDS
    env "${env[@]}" "$build/$binary" "${args[@]}" "$corpus" >"$tlog" 2>&1
    rc=$?
    took=$((SECONDS - start))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tlog" | tail -1)
    last=$(grep -E '^#[0-9]+' "$tlog" | tail -1)
    # Fork mode (-fork=N) prints no stat:: lines: the last "#N:" line then.
    [[ -n $runs ]] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    files=$(find "$corpus" -type f | wc -l)
    if ((rc == 0)); then
        result=OK
    else
        result="FAILED (exit $rc; log: $tlog)"
        status=1
        grep -E '^(fuzz_api|==[0-9]+==|SUMMARY|    #[0-9]+ )|runtime error|fuzz_options|Test unit written' \
            "$tlog" | head -40
    fi
    say "$target: ${runs:-?} runs in $took s, cov ${cov:-?}, ft ${ft:-?}, corpus $files, $result"
done
exit "$status"
