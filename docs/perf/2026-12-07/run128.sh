#!/usr/bin/env bash
# Run 128 (twenty-third session; NOT run): the route of main + patches/route_slot_cpasync.diff (184c9ab, reverted on
# main: the acq_rel tickets of abfaa67, slot_of by cp.async) on a GPU,
# in the whole layer, its timeline and speed against run 127's r124 (main 0755cb7), and PDL per spec and size.
# Builds: r129 = main with patches/route_slot_cpasync.diff applied (`git apply`, `make kernels`, build; then
# `git checkout -- .`), r124 as run124.sh (copy moegen, moe_bench, tests/test_gpu, libmoegen.so,
# libmoegen_ref.so, strip, Debian's liblua5.4.so.0 and libjansson.so.4 beside them); build/sb: h_124 / h_125 (run 127's)
# and h_129 (stamps/instrument.py on the patched tree's Qwen3 source, harness.cu). Carry ["build/r129", "build/r124",
# "build/sb"]. $1: the budget in seconds (default 330); every step after the route's tests and timeline waits for
# its share of it, so `run128.sh 130` is the short call the patch needs before it may land (its tests and timeline).
set -u
BUDGET=${1:-330}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r129
timeout 90 stdbuf -oL -eL build/r129/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b > "$OUT/w/test_gpu_route1000.log" 2>&1
echo "test_gpu r129 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_124 h_125 h_129 h_124 h_125 h_129; do echo "=== $b"; timeout 30 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b; do
    for r in r124 r129 r124 r129; do
        [ $((SECONDS + 15)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 25 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
use r129
[ $((SECONDS + 40)) -le $BUDGET ] && timeout $((BUDGET - SECONDS - 10)) stdbuf -oL -eL build/r129/test_gpu --tokens-max 64 qwen3-30b mixtral gpt-oss-20b deepseek-v3-ep8 \
    > "$OUT/w/test_gpu_layer64.log" 2>&1
echo "test_gpu r129 layers <= 64: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 olmoe-1b-7b; do
        for pdl in off on; do
            [ $((SECONDS + 12)) -le $BUDGET ] || break 3
            echo "== $s pdl=$pdl rep=$rep" >> "$OUT/w/pdl.log"
            MOEGEN_PDL=$pdl timeout 20 build/r129/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
                --tokens 64 --tokens 512 --iters 20 >> "$OUT/w/pdl.log" 2>&1
        done
    done
    echo "pdl rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens|layer|phase1|ticket|partsum|plan" "$OUT/w/stamps.log" | head -70
grep -E "^== |^1 .*route|^8 .*route|^64 .*route|LAYER graph" "$OUT/w/ab.log" | head -60
grep -E "^== |LAYER graph" "$OUT/w/pdl.log" | head -120
