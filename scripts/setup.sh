#!/usr/bin/env bash
# setup.sh - installs what building cudefer needs, then builds it into build/.
#
#   scripts/setup.sh [--tests | --test-driver]
#   or from a bash script:  source scripts/setup.sh && cudefer_setup [--tests | --test-driver]
#   scripts/setup.sh --help     this text
#
#   (nothing)       the shim (build/shim/libcudefer.so*), the cudefer command
#                   (build/scripts/cudefer) and the demonstration
#                   (build/bench/cudefer-demo).
#   --test-driver   those and the test driver (build/tests/driver), which is
#                   built only in a build with tests; installs Criterion if it
#                   is missing.
#   --tests         everything, test suites included; installs Criterion if
#                   it is missing. A test program that fails to compile does
#                   not stop the others from being built.
#
# Missing tools (meson, ninja, pkg-config, gcc, python3) are installed with
# apt-get when run as root; otherwise the exact command to run is printed and
# setup fails. The build folder is configured once and then rebuilt
# incrementally; a build that has tests keeps them. Nothing is printed when
# there is nothing to do. Messages go to stderr.
#
# Several copies may run at once (mpirun or srun starting scripts/cudefer on
# every rank): each takes the lock build/.setup.lock (flock) for its
# installing, configuring and building, so one builds and the others wait and
# then find nothing to do.
#
# Environment: CUDA_PATH, the CUDA toolkit root (default /usr/local/cuda),
# which must hold include/cuda.h; CUDEFER_BUILD_DIR, the build folder
# (default build/ in the repository).

cudefer_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cudefer_build="${CUDEFER_BUILD_DIR:-$cudefer_root/build}"
[[ $cudefer_build == /* ]] || cudefer_build="$PWD/$cudefer_build"

# The build folder as messages name it: relative to the repository when it
# is inside it.
_cudefer_build_name() {
    local name=${cudefer_build#"$cudefer_root"/}
    printf '%s/\n' "${name%/}"
}

_cudefer_say() {
    printf 'cudefer: %s\n' "$*" >&2
}

# Prints the Debian packages that are missing, one a line.
_cudefer_missing_packages() {
    local want_criterion=$1
    command -v meson >/dev/null 2>&1 || echo meson
    command -v ninja >/dev/null 2>&1 || echo ninja-build
    command -v pkg-config >/dev/null 2>&1 || echo pkg-config
    command -v gcc >/dev/null 2>&1 || echo gcc
    command -v python3 >/dev/null 2>&1 || echo python3
    if [[ $want_criterion == yes ]] && ! _cudefer_have_criterion; then
        echo libcriterion-dev
    fi
}

_cudefer_have_criterion() {
    command -v pkg-config >/dev/null 2>&1 && pkg-config --exists criterion
}

_cudefer_install() {
    local packages=("$@")
    if [[ $(id -u) -ne 0 ]]; then
        _cudefer_say "missing: ${packages[*]}; to install:"
        printf '  sudo apt-get install -y %s\n' "${packages[*]}" >&2
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        _cudefer_say "missing: ${packages[*]}; install them with your system's package manager"
        return 1
    fi
    _cudefer_say "installing ${packages[*]} (apt-get)"
    local log
    log=$(mktemp)
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}"; } \
        >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        _cudefer_say "apt-get could not install ${packages[*]}"
        return 1
    fi
    rm -f "$log"
}

_cudefer_check_meson_version() {
    local version
    version=$(meson --version 2>/dev/null) || version=0
    if ! printf '%s\n' 0.63 "$version" | sort -V -C; then
        _cudefer_say "meson $version is too old: cudefer needs 0.63 or newer" \
            "(for example: python3 -m pip install --user meson)"
        return 1
    fi
}

_cudefer_check_toolkit() {
    local cuda="${CUDA_PATH:-/usr/local/cuda}"
    [[ -f $cuda/include/cuda.h ]] && return 0
    _cudefer_say "the CUDA toolkit headers are missing: there is no $cuda/include/cuda.h."
    cat >&2 <<EOF
  cudefer is built against the CUDA driver API headers (cuda.h) of a CUDA
  toolkit, 12.5 or newer. Install the toolkit (https://developer.nvidia.com/cuda-downloads;
  with NVIDIA's apt repository: apt-get install cuda-toolkit), or, if it is
  installed somewhere else, set CUDA_PATH to the folder that holds include/cuda.h.
EOF
    return 1
}

# The value of a build option of the configured build/, as Python prints it
# (True/False for booleans).
_cudefer_build_option() {
    python3 - "$cudefer_build/meson-info/intro-buildoptions.json" "$1" <<'EOF'
import json, sys
for option in json.load(open(sys.argv[1])):
    if option["name"] == sys.argv[2]:
        print(option["value"])
EOF
}

_cudefer_quietly() {
    local log
    log=$(mktemp)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

# Configures build/ once; later calls only turn tests on when asked to, or
# follow a changed CUDA_PATH.
_cudefer_configure() {
    local tests=$1
    local toolkit="${CUDA_PATH:-/usr/local/cuda}"
    if [[ ! -f $cudefer_build/meson-private/coredata.dat ]]; then
        _cudefer_say "configuring $(_cudefer_build_name) (tests: $tests, CUDA toolkit: $toolkit)"
        _cudefer_quietly meson setup "$cudefer_build" "$cudefer_root" \
            -Dtests="$tests" -Dtoolkit="$toolkit" || return 1
        return 0
    fi
    local args=()
    if [[ $tests == true && $(_cudefer_build_option tests) != True ]]; then
        args+=(-Dtests=true)
    fi
    if [[ -n ${CUDA_PATH:-} && $(_cudefer_build_option toolkit) != "$CUDA_PATH" ]]; then
        args+=(-Dtoolkit="$CUDA_PATH")
    fi
    ((${#args[@]})) || return 0
    _cudefer_say "reconfiguring $(_cudefer_build_name): ${args[*]}"
    _cudefer_quietly meson configure "$cudefer_build" "${args[@]}"
}

# The build's output paths (relative to build/) that match an extended regular
# expression.
_cudefer_targets_matching() {
    ninja -C "$cudefer_build" -t targets all 2>/dev/null |
        sed -n 's/^\([^ :]*\): .*/\1/p' | grep -E "$1" || true
}

# Prints the path (absolute) of the shim the build makes: its one file,
# shim/libcudefer.so.<version> (shim/libcudefer.so when it has no version).
cudefer_shim_path() {
    local targets
    mapfile -t targets < <(_cudefer_targets_matching '^shim/libcudefer\.so[.0-9]*$')
    ((${#targets[@]})) || return 1
    printf '%s\n' "$cudefer_build/${targets[0]}"
}

# Prints the test driver's folder (absolute) when the build has one.
cudefer_test_driver_dir() {
    local targets
    mapfile -t targets < <(_cudefer_targets_matching '^tests/driver/libcuda\.so[.0-9]*$')
    ((${#targets[@]})) || return 1
    dirname "$cudefer_build/${targets[0]}"
}

# Runs ninja in build/ with these arguments (targets, -k 0), quietly when it
# has nothing to do, showing its output when it fails.
_cudefer_build() {
    local plan
    plan=$(ninja -C "$cudefer_build" -n "$@" 2>&1) || {
        printf '%s\n' "$plan" >&2
        return 1
    }
    grep -q 'no work to do' <<<"$plan" && return 0
    _cudefer_say "building in $(_cudefer_build_name)"
    if ! _cudefer_quietly ninja -C "$cudefer_build" "$@"; then
        _cudefer_say "the build failed (see above)"
        return 1
    fi
}

# Installs, configures and builds for a mode (main, driver or tests); the
# caller holds the build folder's lock.
_cudefer_setup_locked() {
    local mode=$1
    local want_criterion=yes
    [[ $mode == main ]] && want_criterion=no
    local missing
    missing=$(_cudefer_missing_packages "$want_criterion" | tr '\n' ' ')
    if [[ -n ${missing// /} ]]; then
        # shellcheck disable=SC2086 # one word a package
        _cudefer_install $missing || return 1
    fi
    _cudefer_check_meson_version || return 1
    _cudefer_check_toolkit || return 1

    # The shim, the command and the demo need no tests; a build that has
    # them keeps them.
    local tests=true
    [[ $mode == main ]] && tests=false
    _cudefer_configure "$tests" || return 1
    # A build configured before the build files changed learns its new
    # targets here (the target lists below read build.ninja).
    _cudefer_quietly ninja -C "$cudefer_build" build.ninja || return 1

    if [[ $mode == tests ]]; then
        # Every test program that can be built is, so that one that fails to
        # compile does not keep the others from running.
        _cudefer_build -k 0 all
        return
    fi
    local wanted='^bench/cudefer-demo$|^scripts/cudefer$'
    [[ $mode == driver ]] && wanted+='|^tests/driver/libcuda\.so[.0-9]*$'
    local targets
    mapfile -t targets < <(_cudefer_targets_matching "$wanted")
    # libcudefer: the shim, whatever its file name (it carries the version).
    _cudefer_build libcudefer "${targets[@]}"
}

# Takes the lock of the build folder (creating the folder), waiting while
# another copy holds it; the lock is held on the descriptor $cudefer_lock_fd
# until _cudefer_unlock. Without flock (util-linux) there is no lock.
_cudefer_lock() {
    mkdir -p "$cudefer_build" || return 1
    command -v flock >/dev/null 2>&1 || return 0
    exec {cudefer_lock_fd}>>"$cudefer_build/.setup.lock" || return 1
    flock "$cudefer_lock_fd"
}

_cudefer_unlock() {
    [[ -n ${cudefer_lock_fd:-} ]] || return 0
    exec {cudefer_lock_fd}>&-
    cudefer_lock_fd=
}

cudefer_setup() {
    local mode=main
    case ${1:-} in
    '') ;;
    --tests) mode=tests ;;
    --test-driver) mode=driver ;;
    *)
        _cudefer_say "setup: unknown option $1 (use --tests or --test-driver; --help)"
        return 2
        ;;
    esac
    _cudefer_lock || return 1
    local status=0
    _cudefer_setup_locked "$mode" || status=$?
    _cudefer_unlock
    return "$status"
}

# Run, not sourced: set up and build.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    if [[ ${1:-} == -h || ${1:-} == --help ]]; then
        sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"
        exit 0
    fi
    cudefer_setup "$@"
fi
