# shellcheck shell=bash disable=SC2034 # GL_* are set for the sourcing script
# gpu-lib.sh - what the scripts that run on a GPU machine share:
# gpu-check.sh, bench-gpu.sh, gpu-multi.sh and gpu-all.sh source it. Not a
# program of its own.
#
# The sourcing script sets ROOT (the repository root) and CUDA (the toolkit,
# ${CUDA_PATH:-/usr/local/cuda}) first. Nothing here writes outside the
# folders and files it is given.
#
#   say TEXT...                 one line on stdout
#   gl_left_s BUDGET_S          seconds of the budget left (since the script
#                               started), at least 0
#   gl_use_test_driver DIR      smoke runs without a GPU only: DIR (the
#                               project's test libcuda.so.1) goes first in
#                               LD_LIBRARY_PATH, exported
#   gl_clean_env                sets GL_CLEAN, env(1) arguments that remove
#                               LD_PRELOAD, CUDEFER_SHIM and every CUDEFER_*
#                               variable from a run's environment
#   gl_run LIMIT_S OUT ERR [VAR=value ...] COMMAND...
#                               runs COMMAND in the cleaned environment plus
#                               the VAR=value pairs, with timeout -k 5
#                               LIMIT_S, stdout to OUT and stderr to ERR;
#                               sets GL_RC (its exit status; 124 or 137 when
#                               it timed out) and GL_NS (nanoseconds it took)
#   gl_secs DECIMALS            GL_NS of the last gl_run in seconds
#   gl_build_shim BUILD LOG     builds BUILD/shim/libcudefer.so (see there);
#                               sets GL_SHIM_HOW
#   gl_cc SOURCE OUTPUT LOG     compiles one driver-API program of tests/gpu
#                               (gcc, -I bench, linked with the driver stub)
#   gl_nvcc LOG OUTPUT NVCC_ARGS...  nvcc for sm_90, warnings on
#   gl_shim_hash                the hash of shim/ and include/ (file names and
#                               contents), 12 hex digits: which code ran
#   gl_gpu_line, gl_commit_line, gl_host_line, gl_tools_line
#                               one line each for a run's header: the GPUs and
#                               driver, the commit and the shim's hash, the
#                               host, the tool versions

say() { printf '%s\n' "$*"; }

gl_left_s() {
    local left=$(($1 - SECONDS))
    [ "$left" -lt 0 ] && left=0
    echo "$left"
}

gl_use_test_driver() {
    export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

gl_clean_env() {
    GL_CLEAN=(-u LD_PRELOAD -u CUDEFER_SHIM)
    local v
    for v in $(env | sed -n 's/^\(CUDEFER_[A-Za-z0-9_]*\)=.*/\1/p'); do
        GL_CLEAN+=(-u "$v")
    done
}

gl_run() {
    local limit=$1 out=$2 err=$3
    shift 3
    gl_clean_env
    local t0
    t0=$(date +%s%N)
    timeout -k 5 "$limit" env "${GL_CLEAN[@]}" "$@" >"$out" 2>"$err"
    GL_RC=$?
    GL_NS=$(($(date +%s%N) - t0))
}

gl_secs() {
    awk -v ns="$GL_NS" -v d="$1" 'BEGIN { printf "%.*f", d, ns / 1e9 }'
}

# gl_build_shim BUILD LOG: the shim, with meson into BUILD (set up with
# -Dtests=false when BUILD has no build.ninja yet; everything meson builds
# there, cudefer-loops included); when that fails, the library target alone;
# when meson cannot, gcc directly. GL_SHIM_HOW says which: meson,
# meson_library_target_only, gcc_fallback or none. Status 0 when meson
# built everything.
gl_build_shim() {
    local build=$1 log=$2 shim=$1/shim/libcudefer.so
    if { [ -f "$build/build.ninja" ] || meson setup "$build" -Dtests=false; } >>"$log" 2>&1 &&
        ninja -C "$build" >>"$log" 2>&1 && [ -f "$shim" ]; then
        GL_SHIM_HOW=meson
        return 0
    fi
    if [ -f "$build/build.ninja" ] && ninja -C "$build" libcudefer >>"$log" 2>&1 &&
        [ -f "$shim" ]; then
        GL_SHIM_HOW=meson_library_target_only
        return 1
    fi
    say "== build: meson failed; building the shim with gcc directly" >>"$log"
    mkdir -p "$build/shim"
    if gcc -std=c11 -O2 -g -fPIC -shared -D_GNU_SOURCE -fvisibility=hidden \
        -I"$ROOT/include" -I"$ROOT/shim/base" -I"$ROOT/shim/engine" -I"$ROOT/shim/doors" \
        -I"$CUDA/include" "$ROOT"/shim/*/*.c \
        -Wl,--version-script="$ROOT/shim/doors/libcudefer.map" -o "$shim" -lpthread -ldl \
        >>"$log" 2>&1; then
        GL_SHIM_HOW=gcc_fallback
    else
        GL_SHIM_HOW=none
    fi
    return 1
}

gl_cc() {
    gcc -std=gnu11 -O2 -g -Wall -Wextra -I"$ROOT/bench" -I"$CUDA/include" "$1" -o "$2" \
        -L"$CUDA/lib64/stubs" -lcuda -lpthread -ldl >>"$3" 2>&1
}

gl_nvcc() {
    local log=$1 out=$2
    shift 2
    # shellcheck disable=SC2054 # the commas belong to nvcc's -gencode values
    local -a flags=(-O2 -gencode arch=compute_90,code=sm_90
        -gencode arch=compute_90,code=compute_90 -Xcompiler -Wall,-Wextra)
    say "$CUDA/bin/nvcc ${flags[*]} $* -o $out" >>"$log"
    timeout 180 "$CUDA/bin/nvcc" "${flags[@]}" "$@" -o "$out" >>"$log" 2>&1
}

gl_shim_hash() {
    (cd "$ROOT" && find shim include -type f | LC_ALL=C sort | xargs sha256sum) |
        sha256sum | cut -c1-12
}

gl_gpu_line() {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 4 |
        paste -sd ';'
}

# A copied tree may carry stale git metadata: the hash of the shim's sources
# says which code ran (compare: scripts/gpu-all.sh --shim-hash). A tree
# that is not the top of a git work tree of its own (a `git archive` copy
# inside another checkout) names no commit: the enclosing repository's
# would not be this tree's.
gl_commit_line() {
    local commit top changed=''
    top=$(git -C "$ROOT" rev-parse --show-toplevel 2>/dev/null || true)
    if [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$(cd "$ROOT" && pwd -P)" ]; then
        commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
        git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . &&
            changed=' (with uncommitted changes)'
    else
        commit='none (not a git checkout of its own)'
    fi
    printf '%s%s; shim sources %s\n' "$commit" "$changed" "$(gl_shim_hash)"
}

gl_host_line() {
    printf '%s; %s\n' "$(uname -srm)" \
        "$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')"
}

gl_tools_line() {
    printf '%s; gcc %s; meson %s; %s\n' "$("$CUDA/bin/nvcc" --version 2>/dev/null | tail -n 1)" \
        "$(gcc -dumpfullversion 2>/dev/null)" "$(meson --version 2>/dev/null)" \
        "$(python3 --version 2>&1)"
}
