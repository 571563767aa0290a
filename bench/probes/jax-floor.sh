#!/bin/bash
# jax-floor.sh - a probe, run by hand on a GPU machine: how far JAX's
# platform allocator could come towards its default allocator if every
# call a buffer makes besides the kernels cost nothing. jax_mlp.py runs
# under symtrace.so (bench/probes/symtrace.c) with each allocator at two
# step counts, the same warm-up; the difference between the two runs'
# counts and times, over the difference of steps, is what one step makes
# of each call, start-up and compilation left out. Prints, per allocator,
# one line a call (calls and us a step) and the median step; then the
# platform step less its virtual memory calls (the most a cache of mapped
# blocks behind them could take away) and less its synchronisations too,
# each beside 1.25 times the default allocator's step.
#
#   OUT=/some/folder bench/probes/jax-floor.sh [STEPS_SHORT] [STEPS_LONG]
#
# Writes $OUT/floor.md (the tables) and $OUT/floor.log (the runs).
set -u
cd "$(dirname "$0")/../.." || exit 2
O=${OUT:-/tmp/jax-floor}
mkdir -p "$O"
A=${1:-40}
B=${2:-200}
gcc -shared -fPIC -O1 -o "$O/symtrace.so" bench/probes/symtrace.c -ldl || exit 3
run() { # allocator steps
    local env=()
    [ "$1" = platform ] && env=(XLA_PYTHON_CLIENT_ALLOCATOR=platform)
    env ${env[@]+"${env[@]}"} LD_PRELOAD="$O/symtrace.so" timeout 120 python3 \
        bench/programs/jax_mlp.py --steps "$2" --warmup 10 >"$O/$1.$2.out" 2>"$O/$1.$2.err"
    echo "$1 $2 rc=$? $(grep '^RESULT' "$O/$1.$2.out")" >>"$O/floor.log"
}
: >"$O/floor.log"
for a in platform default; do
    run "$a" "$A"
    run "$a" "$B"
done
median() { grep '^RESULT' "$O/$1.$B.out" | grep -o 'us_per_step=[0-9.]*' | cut -d= -f2; }
# steps ALLOCATOR: a line per call, its calls and us a step between the runs.
steps() {
    join -a 2 -e 0 -o 0,1.2,1.3,2.2,2.3 \
        <(awk '/^SYMTRACE/ {print $2, $3, $5}' "$O/$1.$A.err" | sort) \
        <(awk '/^SYMTRACE/ {print $2, $3, $5}' "$O/$1.$B.err" | sort) |
        awk -v d="$((B - A))" '{print $1, ($4 - $2) / d, ($5 - $3) / d}'
}
table() { # allocator
    echo "### $1: a step, from $A and $B steps"
    echo
    echo "| call | calls | us |"
    echo "|---|---|---|"
    steps "$1" | awk '$2 > 0 {printf "| %s | %.2f | %.1f |\n", $1, $2, $3}'
    echo
    echo "median step: $(median "$1") us"
    echo
}
{
    table platform
    table default
    per() { # allocator pattern: us a step in the calls whose names match
        steps "$1" | awk -v p="$2" '$1 ~ p {t += $3} END {printf "%.1f", t}'
    }
    P=$(median platform)
    D=$(median default)
    V=$(per platform '^cuMem(AddressReserve|Create|Map|SetAccess|Unmap|Release|AddressFree)$')
    S=$(per platform 'Synchronize$')
    awk -v p="$P" -v d="$D" -v v="$V" -v s="$S" 'BEGIN {
        printf "platform %.0f us a step, default %.0f (goal: platform at most %.0f)\n", p, d, 1.25 * d
        printf "virtual memory calls %.0f us a step: without them %.0f (%.2fx the default)\n", v, p - v, (p - v) / d
        printf "synchronisations %.0f us a step: without both %.0f (%.2fx the default)\n", s, p - v - s, (p - v - s) / d
    }'
} >"$O/floor.md"
cat "$O/floor.md"
