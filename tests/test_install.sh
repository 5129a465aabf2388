#!/bin/sh
# test_install: `make install` into a temporary DESTDIR (PREFIX=/opt/moegen),
# then used as a program outside the tree would use it: the installed
# command checks a spec, the library has its SONAME and links, and a C file
# built with pkg-config's flags against the installed header and shared
# library runs (calls the API without a GPU: a missing spec is an error, not
# a crash). Run from the repository root (tests/run.sh does).
pass=0 fail=0
check() { # check LABEL COMMAND...
    label=$1; shift
    if "$@" >"$d/out" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL [$label]: $*" >&2; sed 's/^/    /' "$d/out" >&2; fi
}
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
p=$d/opt/moegen
check "make install" make -s install DESTDIR="$d" PREFIX=/opt/moegen
check "the command" "$p/bin/moegen" check examples/specs/mixtral-8x7b.moe
check "the header" test -f "$p/include/moegen/moe.h"
check "the static library" test -f "$p/lib/libmoegen.a"
check "libmoegen.so links to libmoegen.so.0" test "$(readlink "$p/lib/libmoegen.so")" = libmoegen.so.0
check "the SONAME" sh -c "readelf -d '$p/lib/libmoegen.so.0' | grep -q 'SONAME.*\[libmoegen.so.0\]'"
cat > "$d/use.c" <<'C'
#include <moe.h>
#include <stdio.h>
int main(void) {
    moe_plan *plan = NULL;
    moe_status s = moe_plan_create(&plan, "/nonexistent/spec.moe", NULL);
    printf("moegen %s: %s\n", moe_version(), moe_status_string(s));
    return s == MOE_OK || plan != NULL;
}
C
if command -v pkg-config >/dev/null; then
    export PKG_CONFIG_PATH="$p/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$d"
    check "pkg-config knows moegen" pkg-config --exists moegen
    check "build against the installed files" sh -c "cc -std=c11 -Wall -Werror \$(pkg-config --cflags moegen) '$d/use.c' \$(pkg-config --libs moegen) -o '$d/use'"
else
    echo "test_install: no pkg-config; the flags written by hand" >&2
    check "build against the installed files" cc -std=c11 -Wall -Werror -I"$p/include/moegen" "$d/use.c" -L"$p/lib" -lmoegen -o "$d/use"
fi
check "it runs" env LD_LIBRARY_PATH="$p/lib" "$d/use"
check "it loaded the installed library" sh -c "LD_LIBRARY_PATH='$p/lib' ldd '$d/use' | grep -q '$p/lib/libmoegen.so.0'"
# The shared library exports moe.h's functions (plus the tools' hook
# moe_forward_timed) and nothing else: every function moe.h declares (a
# line at column 0 that is not a comment or directive and names moe_X( ),
# found here by a looser pattern than the Makefile's) is exported, and no
# internal (moe_spec_load, the Lua glue, the family table) is.
grep -oE '^[^ /*#}].*\bmoe_[a-z0-9_]+\(' runtime/moe.h | grep -oE 'moe_[a-z0-9_]+\($' | tr -d '(' | sort -u > "$d/declared"
{ cat "$d/declared"; echo moe_forward_timed; } | sort -u > "$d/want"
nm -D --defined-only "$p/lib/libmoegen.so.0" | awk '{print $3}' | sort -u > "$d/exported"
check "moe.h declares the API" test "$(wc -l < "$d/declared")" -ge 20
check "libmoegen.so exports exactly moe.h's functions" diff "$d/want" "$d/exported"
echo "test_install: $pass passed, $fail failed"
[ "$fail" = 0 ]
