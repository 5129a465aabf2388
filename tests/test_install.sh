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
# The CMake package: find_package(moegen) from the installed prefix gives
# moegen::moegen (shared) and moegen::moegen_static; the same program built
# against each runs. Skipped where cmake is absent.
check "the CMake package" test -f "$p/lib/cmake/moegen/moegenConfig.cmake" -a -f "$p/lib/cmake/moegen/moegenConfigVersion.cmake"
check "share/moegen: templates, example specs and programs" sh -c "test -f '$p/share/moegen/templates/route.lua' && test -f '$p/share/moegen/examples/specs/mixtral-8x7b.moe' && test -f '$p/share/moegen/examples/moe_example.c'"
check "share/moegen/templates is the templates folder" sh -c "cd templates && for f in *.lua; do cmp -s \$f '$p/share/moegen/templates/'\$f || exit 1; done"
skipped=0
if command -v cmake >/dev/null; then
    mkdir -p "$d/cm"
    cp "$d/use.c" "$d/cm/use.c"
    cat > "$d/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.13)
project(use_moegen C)
find_package(moegen 0.1 REQUIRED)
add_executable(use_shared use.c)
target_link_libraries(use_shared PRIVATE moegen::moegen)
add_executable(use_static use.c)
target_link_libraries(use_static PRIVATE moegen::moegen_static)
CM
    check "cmake configures against the installed package" cmake -S "$d/cm" -B "$d/cm/build" -DCMAKE_PREFIX_PATH="$p" -DCMAKE_BUILD_TYPE=Release
    check "cmake builds the shared and static consumers" cmake --build "$d/cm/build"
    check "the CMake-built shared consumer runs" env LD_LIBRARY_PATH="$p/lib" "$d/cm/build/use_shared"
    check "the CMake-built shared consumer loads the installed library" sh -c "LD_LIBRARY_PATH='$p/lib' ldd '$d/cm/build/use_shared' | grep -q '$p/lib/libmoegen.so.0'"
    check "the CMake-built static consumer runs, without libmoegen.so" sh -c "'$d/cm/build/use_static' && ! ldd '$d/cm/build/use_static' | grep -q libmoegen"
    mkdir -p "$d/cm9"
    printf 'cmake_minimum_required(VERSION 3.13)\nproject(later C)\nfind_package(moegen 9.0 REQUIRED)\n' > "$d/cm9/CMakeLists.txt"
    check "find_package(moegen 9.0) is refused by the version file" sh -c "! cmake -S '$d/cm9' -B '$d/cm9/build' -DCMAKE_PREFIX_PATH='$p' >'$d/cm9/log' 2>&1 && grep -q 'version: 0.1.0' '$d/cm9/log'"
else
    echo "skip [cmake consumer]: no cmake" >&2
    skipped=1
fi
# The examples users copy build with moe.h and the documented flags alone:
# the installed pkg-config file (the shared library), and the build tree's
# build/moegen.pc (the static library), as README says.
for ex in moe_example moe_ep_example; do
    if command -v pkg-config >/dev/null; then
        check "examples/$ex.c builds with pkg-config --cflags --libs moegen" sh -c \
            "cc -std=c11 -Wall -Wextra -Werror \$(pkg-config --cflags moegen) examples/$ex.c \$(pkg-config --libs moegen) -o '$d/$ex'"
        check "examples/$ex.c builds with build/moegen.pc (static)" sh -c \
            "unset PKG_CONFIG_SYSROOT_DIR; cc -std=c11 -Wall -Wextra -Werror examples/$ex.c \$(pkg-config --cflags --libs build/moegen.pc) -o '$d/$ex.static'"
    fi
    check "examples/$ex.c includes only <moe.h> of moegen" sh -c "! grep -E '#include \"|#include <(cuda|nccl|nvrtc)' examples/$ex.c"
done
# NVRTC is loaded when a JIT plan or moegen compile first needs it: neither
# the shared library nor the command needs it to start, a program that only
# loads compiled folders runs without it, and a JIT plan without it gets
# MOE_ERR_UNSUPPORTED naming the library (MOEGEN_NVRTC_PATH points at a
# missing file: NVRTC made unloadable).
check "libmoegen.so does not need NVRTC to load" sh -c "! readelf -d '$p/lib/libmoegen.so.0' | grep -q 'NEEDED.*nvrtc'"
check "the command does not need NVRTC to start" sh -c "! readelf -d '$p/bin/moegen' | grep -q 'NEEDED.*nvrtc'"
nonv="$d/no/libnvrtc.so.13"
check "moegen check and emit run without NVRTC" sh -c "MOEGEN_NVRTC_PATH='$nonv' '$p/bin/moegen' check tests/specs/small.moe && MOEGEN_NVRTC_PATH='$nonv' '$p/bin/moegen' emit tests/specs/small.moe -o '$d/emitted'"
check "moegen compile without NVRTC fails, naming the library" sh -c "MOEGEN_NVRTC_PATH='$nonv' '$p/bin/moegen' compile tests/specs/small.moe -o '$d/nocomp' 2>'$d/err'; rc=\$?; cat '$d/err'; [ \$rc = 1 ] && grep -q 'NVRTC ($nonv, from MOEGEN_NVRTC_PATH) did not load' '$d/err' && [ ! -e '$d/nocomp' ]"
check "moegen --version without NVRTC says so" sh -c "MOEGEN_NVRTC_PATH='$nonv' '$p/bin/moegen' --version | grep -q 'did not load'"
cat > "$d/fromdir.c" <<'C'
#include <moe.h>
#include <stdio.h>
#include <string.h>
/* A program that loads a compiled folder, then asks for a JIT plan. */
int main(int argc, char **argv) {
    moe_plan *plan = NULL;
    moe_status s = moe_plan_create_from_dir(&plan, argv[1], NULL);
    printf("from_dir: %s: %s\n", moe_status_string(s), moe_last_error());
    if (s != MOE_OK && s != MOE_ERR_NO_DRIVER && s != MOE_ERR_NO_GPU)
        return 1;
    moe_plan_destroy(plan);
    s = moe_plan_create(&plan, argv[2], NULL);
    printf("create: %s: %s\n", moe_status_string(s), moe_last_error());
    return !(s == MOE_ERR_UNSUPPORTED && plan == NULL && strstr(moe_last_error(), argc > 3 ? argv[3] : "?"));
}
C
check "moegen compile into a folder" "$p/bin/moegen" compile tests/specs/small.moe -o "$d/compiled"
check "build the compiled-folder program" cc -std=c11 -Wall -Werror -I"$p/include/moegen" "$d/fromdir.c" -L"$p/lib" -lmoegen -o "$d/fromdir"
check "a compiled-folder program runs without NVRTC; a JIT plan is refused naming it" env LD_LIBRARY_PATH="$p/lib" \
    MOEGEN_NVRTC_PATH="$nonv" "$d/fromdir" "$d/compiled" tests/specs/small.moe "NVRTC ($nonv, from MOEGEN_NVRTC_PATH) did not load"
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
if [ "$skipped" = 0 ]; then echo "test_install: $pass passed, $fail failed"; else echo "test_install: $pass passed, $fail failed, $skipped skipped"; fi
[ "$fail" = 0 ]
