#!/usr/bin/env bash
# Run 141 (twenty-fifth session): r141 = main e40c529 (the fp8 +pdl marks of run 140 on the Qwen3 and EP8-rank 1-token
# fp8 entries); r139 as run139.sh. Carry ["build/r139", "build/r141"].
# (1) test_quant_gpu on r141 (its bucket-1 layer calls launch with overlap under MOEGEN_PDL's default auto);
# (2) moe_bench --graph r139 / r141 on the fp8 Qwen3 and EP8 rank at 1 / 2 / 8 tokens (the mark's effect as shipped);
# (3) compare_torch --graph (torch._grouped_mm, the eager layer) on r141 for the bf16 Mixtral, EP8 rank and
# gpt-oss-20b at 1 / 8 / 64 / 512 / 1024 tokens (the peers as served, run135.sh's part never run).
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r141
timeout 220 stdbuf -oL -eL build/r141/test_quant_gpu > "$OUT/w/test_quant_gpu_r141.log" 2>&1
echo "test_quant_gpu r141: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b-fp8 deepseek-v3-ep8-fp8; do
    for r in r139 r141; do
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 20 build/$r/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 2 --tokens 8 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
        echo "ab $s $r: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
use r141
export LD_LIBRARY_PATH=$PWD/build/r141${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b; do
    left=$((BUDGET - SECONDS - 5)); [ $left -ge 40 ] || break
    [ $left -le 60 ] || left=60
    echo "== $s" >> "$OUT/w/compare.log"
    timeout $left python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
tail -1 "$OUT/w/test_quant_gpu_r141.log"; grep -m5 FAIL "$OUT/w/test_quant_gpu_r141.log"
grep -E "^== |launch overlap|^(1|2|8) +LAYER graph" "$OUT/w/ab.log"
grep -E "^== |^compare_torch|ceilings|layer" "$OUT/w/compare.log" | head -60
