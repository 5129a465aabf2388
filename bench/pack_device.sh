#!/usr/bin/env bash
# bench/pack_device.sh [--only PROGRAMS] [BUILD] NAME — copy a built tree's device programs into build/NAME,
# stripped (~28 MB), to carry to the GPU machine (the device tool's `carry: ["build/NAME"]`): moegen, libmoegen.so,
# libmoegen_ref.so, moe_bench, the GPU test programs and the vendored tests, and this machine's Debian
# liblua5.4.so.0 and libjansson.so.4 (the GPU machine has neither). --only "moe_bench test_quant_gpu" keeps just
# those programs (and the two libraries): several builds in one call must stay under the 64 MiB a call carries.
# Build first: make gpu-build build/libmoegen_ref.so.
set -eu
only=
[ "${1-}" = --only ] && [ $# -ge 2 ] && { only=" $2 "; shift 2; }
[ $# -eq 1 ] && set -- build "$1"
[ $# -eq 2 ] || { echo "usage: bench/pack_device.sh [--only PROGRAMS] [BUILD] NAME" >&2; exit 2; }
src=$1; dst=build/$2
case $2 in */*|.*|'') echo "pack_device.sh: NAME must be a plain folder name" >&2; exit 2 ;; esac
rm -rf "$dst"; mkdir -p "$dst"
for p in moegen libmoegen.so libmoegen_ref.so moe_bench; do
    [ -z "$only" ] || [ "${only#* $p }" != "$only" ] && cp "$src/$p" "$dst"/
done
for t in test_gpu test_ep_gpu test_bgemm_gpu test_bwd_gpu test_quant_gpu test_runtime test_mgpu test_vendored \
         test_vendored_splitk test_vendored_gemv test_vendored_fp8 test_vendored_fp8_gemv test_vendored_given \
         test_vendored_own test_vendored_chain test_vendored_pairs; do
    [ -z "$only" ] || [ "${only#* $t }" != "$only" ] || continue
    [ -f "$src/tests/$t" ] && cp "$src/tests/$t" "$dst/"
done
cp -L /usr/lib/x86_64-linux-gnu/liblua5.4.so.0 /usr/lib/x86_64-linux-gnu/libjansson.so.4 "$dst"/
strip --strip-debug "$dst"/* 2>/dev/null || true
du -sh "$dst"
