#!/usr/bin/env bash
# Run 130 (twenty-fourth session): the early x copy of one token (r130 = main 5c805d2: phase 2's idle warps copy
# x[0] to rows r * align, the fused scatter writes the row map only) and the slot_of cp.async (r129 = b3be681 +
# patches/route_slot_cpasync.diff, run128.sh's build) on a GPU, against r124 (main 0755cb7, run 127's baseline).
# (1) test_gpu, every family, <= 8 tokens, on r130 (the scatter's rows are checked against the reference);
# (2) test_gpu --family route <= 1000 on r129; (3) the stamped timelines h_124 / h_129 / h_130 (stamps/instrument.py
# on each tree's Qwen3 source, harness.cu); (4) moe_bench --graph r124 / r129 / r130 interleaved, twice, Qwen3 and
# Mixtral at 1 / 8 / 64 tokens; (5) with what is left of $1 (seconds, default 330), PDL off / on per spec and size.
# Carry ["build/r124", "build/r129", "build/r130", "build/sb"].
set -u
BUDGET=${1:-330}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r130
timeout 150 stdbuf -oL -eL build/r130/test_gpu --tokens-max 8 qwen3-30b mixtral gpt-oss-20b zero_experts softcap \
    router_own_input shared_unclamped > "$OUT/w/test_gpu_r130_8.log" 2>&1
echo "test_gpu r130 all families <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
use r129
timeout 90 stdbuf -oL -eL build/r129/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b > "$OUT/w/test_gpu_r129_route1000.log" 2>&1
echo "test_gpu r129 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_124 h_129 h_130 h_124 h_129 h_130; do echo "=== $b"; timeout 30 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b; do
    for r in r124 r129 r130 r124 r129 r130; do
        [ $((SECONDS + 15)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 25 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
use r130
for rep in 1 2; do
    for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 olmoe-1b-7b; do
        for pdl in off on; do
            [ $((SECONDS + 12)) -le $BUDGET ] || break 3
            echo "== $s pdl=$pdl rep=$rep" >> "$OUT/w/pdl.log"
            MOEGEN_PDL=$pdl timeout 20 build/r130/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
                --tokens 64 --tokens 512 --iters 20 >> "$OUT/w/pdl.log" 2>&1
        done
    done
    echo "pdl rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens|layer|phase1|ticket|partsum|plan|scatter" "$OUT/w/stamps.log" | head -80
grep -E "^== |^1 .*route|^8 .*route|^64 .*route|LAYER graph" "$OUT/w/ab.log" | head -80
grep -E "^== |LAYER graph" "$OUT/w/pdl.log" | head -120
