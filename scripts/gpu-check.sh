#!/usr/bin/env bash
# gpu-check.sh - the real-GPU checks of cudefer, in one run (under 7 minutes).
#
# Run from anywhere on a machine with an NVIDIA GPU, the CUDA toolkit
# (nvcc, cuda.h, the driver stub), meson + ninja, gcc and python3 (torch
# for check 1d; torch, jax and cupy for check 16):
#
#     scripts/gpu-check.sh
#
# It builds the shim (build-gpu/shim/libcudefer.so) and the programs of
# tests/gpu, runs every check, and writes into $OUT (default ./gpu-out):
#
#     summary.txt      the environment, every table and the summary (also printed)
#     results.txt      the machine-readable RUN and RESULT lines
#     runs.log         each program run: command, exit status, stdout, stderr
#     build.log        the build output
#     doors-debug.log  the shim's debug lines about doors, per program
#
# Modes of a program run: none (no shim), passthrough (shim preloaded with
# CUDEFER_ENABLE=0), shim (shim preloaded, enabled, CUDEFER_STATS=1),
# shim-defaults (shim preloaded, every CUDEFER_* variable unset). Every run
# has a timeout; a failing step is recorded and the script goes on. Exit
# status: 0 when every check passed, 1 otherwise.
#
# The checks (GPU_CHECK_ONLY names them): doors, stall, hazards, deadlock,
# oom, conform, capture (1-7), and registered, hidden-wait, teardown-race,
# oom-concurrent, capture-ptsz, green, primary-unseen, sticky, quiet,
# contexts, inherit (8-18;
# each a program of tests/gpu run without and with cudefer; see
# tests/gpu/README.md), and libs (the CUDA libraries' handle and plan
# destruction, without and with cudefer, one program per library in
# tests/gpu/libs; informational, about 60 s).
#
# Environment: OUT (output folder), CUDA_PATH (default /usr/local/cuda),
# GPU_CHECK_BUDGET_S (seconds after which no further program is started,
# default 420), GPU_CHECK_ONLY (a comma-separated list of the checks to run;
# default all), GPU_BUILD_DIR (the build folder, default build-gpu),
# GPU_CHECK_DRIVER_DIR (only to smoke-test this script without a GPU: a
# folder holding the project's test libcuda.so.1; kernels are then
# simulated, so the verdicts of the checks that need real kernels say
# "simulated").
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
# shellcheck source=scripts/gpu-lib.sh
. "$ROOT/scripts/gpu-lib.sh"
COMMAND="cd $ROOT && scripts/gpu-check.sh${*:+ $*}${OUT:+ (OUT=$OUT)}"
OUT_DIR=${OUT:-$ROOT/gpu-out}
CUDA=${CUDA_PATH:-/usr/local/cuda}
BUDGET_S=${GPU_CHECK_BUDGET_S:-420}
BUILD=${GPU_BUILD_DIR:-$ROOT/build-gpu}
BIN=$BUILD/gpu-check/bin
WORK=$BUILD/gpu-check/work
SHIM=$BUILD/shim/libcudefer.so

mkdir -p "$OUT_DIR" "$BIN" "$WORK" || exit 2
RESULTS=$OUT_DIR/results.txt
RUNLOG=$OUT_DIR/runs.log
BUILDLOG=$OUT_DIR/build.log
DOORSLOG=$OUT_DIR/doors-debug.log
SUMMARY=$OUT_DIR/summary.txt
: >"$RESULTS"
: >"$RUNLOG"
: >"$BUILDLOG"
: >"$DOORSLOG"
rm -f "$WORK"/*

if [ -n "${GPU_CHECK_DRIVER_DIR:-}" ]; then
    gl_use_test_driver "$GPU_CHECK_DRIVER_DIR"
fi

elapsed() { echo $((SECONDS)); }

# ---- recording ---------------------------------------------------------------

build_result() { # step status how
    say "RESULT build check=build mode=- id=$1 status=$2 how=$3" >>"$RESULTS"
}

# A line of k=v fields for results.txt, from a program's RESULT lines.
tag_results() { # check mode id file
    local id=${3//[&\/\\]/_}
    sed -n "s/^RESULT \\([^ ]*\\)/RESULT \\1 check=$1 mode=$2 id=$id/p" "$4" >>"$RESULTS"
}

# Appends a file to runs.log, cut in the middle when it is long.
append_log() { # file
    local n
    n=$(wc -l <"$1")
    if [ "$n" -le 400 ]; then
        cat "$1"
    else
        head -n 200 "$1"
        say "[... $((n - 300)) lines left out ...]"
        tail -n 100 "$1"
    fi >>"$RUNLOG"
}

# ---- running -------------------------------------------------------------------

# run_prog CHECK MODE ID LIMIT_S [VAR=value ...] -- COMMAND...
# Runs COMMAND in MODE with a timeout; its stdout and stderr stay in
# $WORK/CHECK.MODE.ID.{out,err}; records RUN and RESULT lines.
# The path, less .out/.err, where run_prog keeps a run's output.
run_base() { # check mode id
    printf '%s/%s.%s.%s' "$WORK" "$1" "$2" "$(printf '%s' "$3" | tr -c 'A-Za-z0-9_.-' '_')"
}

run_prog() {
    local check=$1 mode=$2 id=$3 limit=$4
    shift 4
    local -a vars=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        vars+=("$1")
        shift
    done
    shift
    local base
    base=$(run_base "$check" "$mode" "$id")
    : >"$base.out"
    : >"$base.err"

    local left
    left=$(gl_left_s "$BUDGET_S")
    if [ "$left" -lt 5 ]; then
        say "RUN check=$check mode=$mode id=$id rc=skipped secs=0" >>"$RESULTS"
        say "=== $check / $mode / $id: SKIPPED (time budget of ${BUDGET_S}s spent)" >>"$RUNLOG"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left

    # The run's environment: the caller's, less LD_PRELOAD and CUDEFER_*,
    # plus the mode's variables and the run's own.
    local -a set_args=()
    case $mode in
    none) ;;
    passthrough) set_args+=("LD_PRELOAD=$SHIM" CUDEFER_ENABLE=0) ;;
    shim) set_args+=("LD_PRELOAD=$SHIM" CUDEFER_ENABLE=1 CUDEFER_STATS=1) ;;
    shim-defaults) set_args+=("LD_PRELOAD=$SHIM") ;;
    esac
    set_args+=(${vars[@]+"${vars[@]}"})

    gl_run "$limit" "$base.out" "$base.err" ${set_args[@]+"${set_args[@]}"} "$@"
    local rc=$GL_RC secs
    secs=$(gl_secs 2)

    say "RUN check=$check mode=$mode id=$id rc=$rc secs=$secs" >>"$RESULTS"
    tag_results "$check" "$mode" "$id" "$base.out"
    {
        say ""
        say "=== $check / $mode / $id: exit $rc after ${secs}s (limit ${limit}s)"
        say "command: timeout -k 5 $limit env ${set_args[*]:-} $* (LD_PRELOAD, CUDEFER_* unset first)"
        say "--- stdout"
    } >>"$RUNLOG"
    append_log "$base.out"
    say "--- stderr" >>"$RUNLOG"
    append_log "$base.err"
    printf '  %-8s %-12s %-40s exit %-4s %6ss\n' "$check" "$mode" "$id" "$rc" "$secs"
    return 0
}

# ---- build ---------------------------------------------------------------------

build_shim() {
    say "== build: shim (meson)" | tee -a "$BUILDLOG"
    if gl_build_shim "$BUILD" "$BUILDLOG"; then
        build_result shim ok meson
    else
        build_result shim fail "$GL_SHIM_HOW"
    fi
}

# The driver-API programs of tests/gpu, each built on its own.
PROGRAMS="stall hazard deadlock oom conform capture doors_drv registered hidden_wait
    teardown_race oom_concurrent capture_ptsz green primary_unseen sticky multigpu inherit"

build_programs() {
    local p
    for p in $PROGRAMS; do
        say "== build: $p" >>"$BUILDLOG"
        if gl_cc "tests/gpu/$p.c" "$BIN/$p" "$BUILDLOG"; then
            build_result "$p" ok gcc
        else
            build_result "$p" fail gcc
        fi
    done
    say "== build: doors_rt_static" >>"$BUILDLOG"
    if gl_nvcc "$BUILDLOG" "$BIN/doors_rt_static" tests/gpu/doors_rt.cu; then
        build_result doors_rt_static ok nvcc
    else
        build_result doors_rt_static fail nvcc
    fi
    say "== build: inherit_rt" >>"$BUILDLOG"
    if gl_nvcc "$BUILDLOG" "$BIN/inherit_rt" tests/gpu/inherit_rt.cu; then
        build_result inherit_rt ok nvcc
    else
        build_result inherit_rt fail nvcc
    fi
    say "== build: doors_rt_shared" >>"$BUILDLOG"
    if gl_nvcc "$BUILDLOG" "$BIN/doors_rt_shared" -cudart shared -Xlinker -rpath \
        -Xlinker "$CUDA/lib64" tests/gpu/doors_rt.cu; then
        build_result doors_rt_shared ok nvcc
    else
        build_result doors_rt_shared fail nvcc
    fi
}

# ---- the checks ------------------------------------------------------------------

doors_command() { # prog: sets DOORS_CMD
    case $1 in
    rt_static) DOORS_CMD=("$BIN/doors_rt_static") ;;
    rt_shared) DOORS_CMD=("$BIN/doors_rt_shared") ;;
    drv) DOORS_CMD=("$BIN/doors_drv") ;;
    torch) DOORS_CMD=(python3 "$ROOT/tests/gpu/doors_torch.py") ;;
    esac
}

check_doors() {
    say "== 1. doors"
    local prog limit
    local -a DOORS_CMD=()
    for prog in rt_static rt_shared drv torch; do
        doors_command "$prog"
        limit=60
        [ "$prog" = torch ] && limit=120
        run_prog doors none "$prog" "$limit" -- "${DOORS_CMD[@]}"
        run_prog doors passthrough "$prog" "$limit" -- "${DOORS_CMD[@]}"
        run_prog doors shim "$prog" "$limit" CUDEFER_LOG=debug \
            "CUDEFER_REPORT=$WORK/doors.$prog.report.json" -- "${DOORS_CMD[@]}"
        doors_compare "$prog"
    done
}

doors_compare() { # prog
    local prog=$1 none="$WORK/doors.none.$1.out" pass="$WORK/doors.passthrough.$1.out"
    local shim="$WORK/doors.shim.$1.out" err="$WORK/doors.shim.$1.err"
    local same_p=0 same_s=0 done=0
    cmp -s "$none" "$pass" && same_p=1
    cmp -s "$none" "$shim" && same_s=1
    [ "$(tail -n 1 "$none")" = "done" ] && done=1
    say "RESULT doors_compare check=doors mode=- id=$prog same_passthrough=$same_p" \
        "same_shim=$same_s done=$done lines=$(wc -l <"$none")" >>"$RESULTS"
    if [ $same_p = 0 ] || [ $same_s = 0 ]; then
        {
            say "=== doors / $prog: stdout differs"
            diff -u "$none" "$pass" | head -n 30
            diff -u "$none" "$shim" | head -n 30
        } >>"$RUNLOG"
    fi
    # cudefer: first call of NAME (reached through: DOORS)
    sed -n 's/^cudefer: first call of \([^ ]*\) (reached through: \(.*\))$/\1 \2/p' "$err" |
        while read -r name doors; do
            say "RESULT doors_name check=doors mode=shim id=$prog name=$name via=${doors// /_}"
        done >>"$RESULTS"
    say "RESULT doors_handouts check=doors mode=shim id=$prog" \
        "dlsym=$(grep -c '^cudefer: dlsym(.*) -> wrapper' "$err")" \
        "procaddr=$(grep -c '^cudefer: cuGetProcAddress(.*) -> wrapper' "$err")" >>"$RESULTS"
    {
        say "=== $prog (shim enabled, CUDEFER_LOG=debug)"
        grep -E '^cudefer: (first call of|dlsym\(|cuGetProcAddress\()' "$err"
        grep -E '^cudefer: (statistics|  )' "$err"
        [ -f "$WORK/doors.$prog.report.json" ] && cat "$WORK/doors.$prog.report.json"
        say ""
    } >>"$DOORSLOG"
}

check_stall() {
    say "== 2. stall"
    run_prog stall none stall 60 -- "$BIN/stall" 1
    run_prog stall passthrough stall 60 -- "$BIN/stall" 1
    run_prog stall shim stall 90 -- "$BIN/stall" 3
}

check_hazards() {
    say "== 3. hazards"
    local s m
    for s in nonblocking blocking legacy perthread ptsz; do
        for m in device managed hostmap; do
            run_prog hazards shim "$s:$m" 20 -- "$BIN/hazard" "$s" "$m"
        done
    done
}

# The unsafe control of check 3 kills its context with a fault: it runs
# last, so that nothing else can be affected by it.
check_hazard_control() {
    say "== 3. hazards: the unsafe control, and a fault with releases queued"
    run_prog hazards none unsafe:device 20 -- "$BIN/hazard" unsafe device
    run_prog hazards shim unsafe:device 20 CUDEFER_LOG=error -- "$BIN/hazard" unsafe device
    # What cudefer reported keeping for the context's destruction (its error
    # line on stderr).
    local dropped
    dropped=$(sed -n 's/.*its \([0-9][0-9]*\) queued releases are kept.*/\1/p' \
        "$(run_base hazards shim unsafe:device).err" 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')
    say "RESULT hazard_dropped check=hazards mode=shim id=unsafe:device dropped=${dropped:-0}" \
        >>"$RESULTS"
}

check_deadlock() {
    say "== 4. deadlock"
    run_prog deadlock shim deadlock 30 -- "$BIN/deadlock" 2000
    run_prog deadlock passthrough deadlock 30 -- "$BIN/deadlock" 2000
}

check_oom() {
    say "== 5. out-of-memory"
    run_prog oom shim oom 150 -- "$BIN/oom" 200
    run_prog oom none oom 150 -- "$BIN/oom" 200
}

check_conform() {
    say "== 6. conformance"
    local case mode
    local -a cases=()
    mapfile -t cases < <(timeout 10 "$BIN/conform" list 2>/dev/null)
    if [ ${#cases[@]} -eq 0 ]; then
        say "RUN check=conform mode=none id=list rc=1 secs=0" >>"$RESULTS"
        return
    fi
    for case in "${cases[@]}"; do
        for mode in none shim; do
            run_prog conform "$mode" "$case" 20 -- "$BIN/conform" "$case"
        done
    done
}

check_capture() {
    say "== 7. capture"
    run_prog capture shim capture 60 -- "$BIN/capture" 10
    run_prog capture none capture 60 -- "$BIN/capture" 10
}

# ---- 8-16: each program without cudefer (none) and with it (shim) ------------------------

# run_both CHECK ID LIMIT -- COMMAND...: run_prog without cudefer, then with it.
run_both() {
    local check=$1 id=$2 limit=$3
    shift 4
    run_prog "$check" none "$id" "$limit" -- "$@"
    run_prog "$check" shim "$id" "$limit" -- "$@"
}

check_registered() {
    say "== 8. registered"
    run_both registered registered 30 -- "$BIN/registered"
}

check_hidden_wait() {
    say "== 9. hidden-wait"
    local c
    for c in pinned device-cache second-context other-context-sync register-over oom-kind \
        oom-managed oom-other; do
        run_both hidden-wait "$c" 30 -- "$BIN/hidden_wait" "$c"
    done
}

check_teardown_race() {
    say "== 10. teardown-race"
    run_both teardown-race teardown_race 60 -- "$BIN/teardown_race"
}

check_oom_concurrent() {
    say "== 11. oom-concurrent"
    run_both oom-concurrent oom_concurrent 60 -- "$BIN/oom_concurrent"
}

check_capture_ptsz() {
    say "== 12. capture-ptsz"
    run_both capture-ptsz capture_ptsz 30 -- "$BIN/capture_ptsz"
}

check_green() {
    say "== 13. green"
    run_both green green 30 -- "$BIN/green"
}

check_primary_unseen() {
    say "== 14. primary-unseen"
    local v
    for v in twice reset; do
        run_both primary-unseen "$v" 20 -- "$BIN/primary_unseen" "$v"
    done
}

# A block allocated after a release must carry nothing the program set on
# the released block (advice, a prefetch, a stream attachment, SYNC_MEMOPS;
# and a dma-buf export passes through):
# tests/gpu/inherit.c, one process a variant; the advice and the prefetch
# through the CUDA runtime too (tests/gpu/inherit_rt.cu).
check_inherit() {
    say "== 18. inherit"
    local v
    for v in advise prefetch attach syncmemops dmabuf; do
        run_both inherit "$v" 20 -- "$BIN/inherit" "$v"
    done
    for v in rt_advise rt_prefetch; do
        run_both inherit "$v" 20 -- "$BIN/inherit_rt" "$v"
    done
}

# A second context of the GPU writes memory of the primary context (managed,
# portable mapped pinned) while the primary context releases it, and, in the
# _sync cases, synchronises right after (tests/gpu/multigpu.c). Without
# cudefer the writer faults (its context dies), so these run late too.
check_contexts() {
    say "== 17. contexts"
    local c
    for c in ctx_managed ctx_managed_sync ctx_hostmap ctx_hostmap_sync; do
        run_both contexts "$c" 20 -- "$BIN/multigpu" "$c"
    done
}

# Its kernel fault kills its context: it runs late, with the hazard control.
check_sticky() {
    say "== 15. sticky"
    run_both sticky sticky 30 -- "$BIN/sticky"
}

# cudefer at its defaults (mode shim-defaults): no CUDEFER_LOG, no
# CUDEFER_STATS; stderr must hold no "cudefer:" line.
check_quiet() {
    say "== 16. quiet"
    local f
    for f in torch jax cupy; do
        run_prog quiet none "$f" 120 -- python3 "$ROOT/tests/gpu/quiet.py" "$f"
        run_prog quiet shim-defaults "$f" 120 -- python3 "$ROOT/tests/gpu/quiet.py" "$f"
        say "RESULT quiet_stderr check=quiet mode=shim-defaults id=$f" \
            "cudefer_lines=$(grep -c '^cudefer:' "$(run_base quiet shim-defaults "$f").err")" \
            >>"$RESULTS"
    done
}

# ---- libs: CUDA libraries' handle and plan destruction (informational) ---------------

# One program per library in tests/gpu/libs, run once without cudefer (none)
# and once with it (shim); each prints how long each destruction blocked its
# caller and another thread's launch (tests/gpu/libs/libs.h). Nothing here
# fails the run: a library that cannot be found, built or loaded gets a
# RESULT line saying so, and the next one goes on.
LIBS_SOURCES="cublas cublaslt cufft curand cusparse cusolver cudnn nccl"
LIBS_IDS="cublas cublaslt cufft curand cusparse cusolver cudnn cudnn-backend nccl"

# libs_spec ID: LIBS_SRC (tests/gpu/libs/LIBS_SRC.c), LIBS_ARG (its argument),
# LIBS_HEADER, LIBS_LIB (the library's file name less .so), LIBS_PREFER
# (where to look first: the toolkit, or pip, whose copy PyTorch uses) and
# LIBS_PIP (the pip modules that may hold it).
libs_spec() {
    LIBS_SRC=$1 LIBS_ARG='' LIBS_PREFER=toolkit LIBS_PIP=''
    case $1 in
    cublas) LIBS_HEADER=cublas_v2.h LIBS_LIB=libcublas LIBS_PIP="nvidia.cublas nvidia.cu13" ;;
    cublaslt) LIBS_HEADER=cublasLt.h LIBS_LIB=libcublasLt LIBS_PIP="nvidia.cublas nvidia.cu13" ;;
    cufft) LIBS_HEADER=cufft.h LIBS_LIB=libcufft LIBS_PIP="nvidia.cufft nvidia.cu13" ;;
    curand) LIBS_HEADER=curand.h LIBS_LIB=libcurand LIBS_PIP="nvidia.curand nvidia.cu13" ;;
    cusparse) LIBS_HEADER=cusparse.h LIBS_LIB=libcusparse LIBS_PIP="nvidia.cusparse nvidia.cu13" ;;
    cusolver)
        LIBS_HEADER=cusolverDn.h LIBS_LIB=libcusolver LIBS_PIP="nvidia.cusolver nvidia.cu13"
        ;;
    cudnn) LIBS_ARG=legacy LIBS_HEADER=cudnn.h LIBS_LIB=libcudnn LIBS_PREFER=pip
        LIBS_PIP="nvidia.cudnn nvidia.cu13" ;;
    cudnn-backend) LIBS_SRC=cudnn LIBS_ARG=backend LIBS_HEADER=cudnn.h LIBS_LIB=libcudnn
        LIBS_PREFER=pip LIBS_PIP="nvidia.cudnn nvidia.cu13" ;;
    nccl) LIBS_HEADER=nccl.h LIBS_LIB=libnccl LIBS_PREFER=pip LIBS_PIP="nvidia.nccl nvidia.cu13" ;;
    esac
}

# The folders of the pip modules given that python3 can import, one a line.
libs_pip_roots() { # modules...
    local m
    for m in "$@"; do
        python3 -c "import $m as p; print(list(p.__path__)[0])" 2>/dev/null
    done
}

# libs_locate: a folder pair, include and lib, holding LIBS_HEADER and
# LIBS_LIB.so (or .so.N), tried in the order of LIBS_PREFER, then the
# system's; sets LIBS_INC_DIR and LIBS_LIB_FILE (empty when none has both).
libs_locate() {
    local root pair file system
    local -a pip=() order=()
    local toolkit="$CUDA/include:$CUDA/lib64"
    system="/usr/include:/usr/lib/$(gcc -print-multiarch 2>/dev/null)"
    # shellcheck disable=SC2086 # LIBS_PIP is a list of module names
    while read -r root; do
        [ -n "$root" ] && pip+=("$root/include:$root/lib" "$root/include:$root/lib64")
    done < <(libs_pip_roots $LIBS_PIP)
    if [ "$LIBS_PREFER" = pip ]; then
        order=(${pip[@]+"${pip[@]}"} "$toolkit" "$system")
    else
        order=("$toolkit" ${pip[@]+"${pip[@]}"} "$system")
    fi
    LIBS_INC_DIR='' LIBS_LIB_FILE=''
    for pair in "${order[@]}"; do
        [ -f "${pair%%:*}/$LIBS_HEADER" ] || continue
        for file in "${pair#*:}/$LIBS_LIB.so" "${pair#*:}/$LIBS_LIB".so.[0-9]*; do
            if [ -e "$file" ]; then
                LIBS_INC_DIR=${pair%%:*} LIBS_LIB_FILE=$file
                return 0
            fi
        done
    done
    return 1
}

# libs_build SRC: $BIN/libs_SRC, linked with its library where libs_locate
# finds it, else without it (a program built without its header says so
# itself). Sets LIBS_STATUS (ok, stub or not_built) and LIBS_LIB_DIR.
libs_build() {
    libs_spec "$1"
    local src="$ROOT/tests/gpu/libs/$LIBS_SRC.c" out="$BIN/libs_$LIBS_SRC"
    local -a cc=(gcc -std=gnu11 -O2 -g -Wall -Wextra -I"$ROOT/bench")
    # shellcheck disable=SC2054 # the comma belongs to -Wl,-rpath
    local -a link=(-L"$CUDA/lib64/stubs" -lcuda -L"$CUDA/lib64" -lcudart
        -Wl,-rpath,"$CUDA/lib64" -lpthread -ldl)
    LIBS_LIB_DIR=
    rm -f "$out"
    if libs_locate; then
        LIBS_LIB_DIR=$(dirname "$LIBS_LIB_FILE")
        say "== build: libs_$LIBS_SRC ($LIBS_INC_DIR/$LIBS_HEADER, $LIBS_LIB_FILE)" >>"$BUILDLOG"
        if "${cc[@]}" -I"$LIBS_INC_DIR" -I"$CUDA/include" "$src" -o "$out" "$LIBS_LIB_FILE" \
            -Wl,-rpath,"$LIBS_LIB_DIR" "${link[@]}" >>"$BUILDLOG" 2>&1; then
            LIBS_STATUS=ok
            return 0
        fi
    else
        say "== build: libs_$LIBS_SRC: no folder holds both $LIBS_HEADER and $LIBS_LIB.so" \
            >>"$BUILDLOG"
    fi
    say "== build: libs_$LIBS_SRC without its library" >>"$BUILDLOG"
    if "${cc[@]}" -I"$CUDA/include" "$src" -o "$out" "${link[@]}" >>"$BUILDLOG" 2>&1; then
        LIBS_STATUS=stub
    else
        LIBS_STATUS=not_built
    fi
}

# A setup line of the check for a run that printed none itself.
libs_line() { # mode id rc
    say "RESULT libs check=libs mode=$1 id=$2 lib=$2 call=- stage=setup caller_ms=-" \
        "launch_ms=- rc=$3" >>"$RESULTS"
}

# A run with no "RESULT libs" line (its library not found when loading, a
# crash or a timeout before its first line) gets one.
libs_no_result() { # mode id
    local base rc why=no_result
    base=$(run_base libs "$1" "$2")
    grep -q '^RESULT libs ' "$base.out" && return 0
    rc=$(sed -n "s/^RUN check=libs mode=$1 id=$2 rc=\\([^ ]*\\) .*/\\1/p" "$RESULTS" | tail -n 1)
    grep -q 'error while loading shared libraries' "$base.err" && why=not_loaded
    libs_line "$1" "$2" "${why}_exit_${rc:-none}"
}

check_libs() {
    say "== libs"
    local src id mode path
    local -A built=() dirs=()
    for src in $LIBS_SOURCES; do
        libs_build "$src"
        built[$src]=$LIBS_STATUS
        dirs[$src]=$LIBS_LIB_DIR
        say "RESULT libs_build check=libs mode=- id=$src status=$LIBS_STATUS" \
            "from=$(printf '%s' "${LIBS_LIB_FILE:--}" | tr -c 'A-Za-z0-9_./+-' '_')" >>"$RESULTS"
    done
    for id in $LIBS_IDS; do
        libs_spec "$id"
        # The library's own folder first: cuDNN loads its parts from there.
        path="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${dirs[$LIBS_SRC]:+${dirs[$LIBS_SRC]}:}$CUDA/lib64"
        for mode in none shim; do
            if [ "${built[$LIBS_SRC]}" = not_built ]; then
                libs_line "$mode" "$id" not_built
                continue
            fi
            run_prog libs "$mode" "$id" 30 "LD_LIBRARY_PATH=$path" NCCL_DEBUG=WARN -- \
                "$BIN/libs_$LIBS_SRC" ${LIBS_ARG:+"$LIBS_ARG"}
            libs_no_result "$mode" "$id"
        done
    done
}

# ---- main ----------------------------------------------------------------------------

environment() {
    say "# cudefer GPU checks"
    say "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    say "command: $COMMAND"
    say "gpu:     $(gl_gpu_line)"
    say "commit:  $(gl_commit_line)"
    say "host:    $(gl_host_line)"
    say "tools:   $(gl_tools_line)"
    [ -n "${GPU_CHECK_DRIVER_DIR:-}" ] && say "NOTE:    libcuda.so.1 from $GPU_CHECK_DRIVER_DIR (smoke test, not a GPU run)"
    return 0
}

environment | tee "$OUT_DIR/env.tmp"
build_shim
build_programs
say "== build: $(grep -c 'status=ok' "$RESULTS") steps ok, $(grep -c 'status=fail' "$RESULTS") failed (build.log)"

# GPU_CHECK_ONLY (e.g. "conform" or "doors,stall"): only those checks.
wanted() { [ -z "${GPU_CHECK_ONLY:-}" ] || [[ ",${GPU_CHECK_ONLY// /}," == *",$1,"* ]]; }
wanted doors && check_doors
wanted stall && check_stall
wanted hazards && check_hazards
wanted deadlock && check_deadlock
wanted oom && check_oom
wanted conform && check_conform
wanted capture && check_capture
wanted registered && check_registered
wanted hidden-wait && check_hidden_wait
wanted teardown-race && check_teardown_race
wanted oom-concurrent && check_oom_concurrent
wanted capture-ptsz && check_capture_ptsz
wanted green && check_green
wanted primary-unseen && check_primary_unseen
wanted inherit && check_inherit
wanted libs && check_libs
wanted quiet && check_quiet
wanted sticky && check_sticky
wanted contexts && check_contexts
wanted hazards && check_hazard_control

{
    cat "$OUT_DIR/env.tmp"
    say "elapsed: $(elapsed) s"
    python3 "$ROOT/tests/gpu/report.py" "$RESULTS"
    say "report_status=$?"
} >"$SUMMARY.tmp" 2>&1
rm -f "$OUT_DIR/env.tmp"
status=$(sed -n 's/^report_status=//p' "$SUMMARY.tmp")
grep -v '^report_status=' "$SUMMARY.tmp" >"$SUMMARY"
rm -f "$SUMMARY.tmp"

say ""
cat "$SUMMARY"
if [ "$status" != 0 ] && [ "$status" != 1 ]; then
    say ""
    say "report.py failed (status $status); runs that did not exit 0:"
    grep '^RUN' "$RESULTS" | grep -v ' rc=0 ' || true
    exit 1
fi
say ""
say "full logs: $OUT_DIR"
exit "$status"
