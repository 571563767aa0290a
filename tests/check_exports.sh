#!/bin/sh
# The shim exports exactly the wrapped driver names (the CD_WRAP lines of
# shim/doors/wrapped.h), dlsym and its public API: nothing of its own
# internals.
set -eu
lib=$1
names=$2
expected=$(mktemp)
actual=$(mktemp)
trap 'rm -f "$expected" "$actual"' EXIT
{ sed -n 's/^CD_WRAP(\([A-Za-z0-9_]*\)).*/\1/p' "$names"; printf '%s\n' dlsym cudefer_flush cudefer_version; } | sort > "$expected"
nm -D --defined-only "$lib" | awk '{print $3}' | sort > "$actual"
if ! diff -u "$expected" "$actual"; then
    echo "FAIL: libcudefer.so exports differ from the wrapped names (- expected, + exported)"
    exit 1
fi
echo "ok: $(wc -l < "$actual") exported names, as expected"
