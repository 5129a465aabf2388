#!/usr/bin/env bash
# Run 90 (fourteenth session): three builds side by side, the layer under CUDA graphs at 1 .. 4096 tokens:
#   wk  main a5f9c4e's kernels (build/wk of run 89)
#   tn  + the gemv GEMMs load their tile entry with *num_tiles (moe_tile_now in the prelude: one L2 round trip at
#       each CTA's start instead of two)
#   fz  tn + the permute plan fused into route at every call size (MOE_ROUTE_FUSE_TOKENS 64 -> 1 << 30), so the
#       permute_plan kernel is never launched on one device
# then test_gpu under fz (its route/permute/layer checks at every case's sizes, the fused plan from 65 tokens on
# for the first time) on qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b and the gemv cases. carry ["build/wk","build/tn","build/fz"].
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8; do
    for b in wk tn fz; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/ab.log"
        timeout 60 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 8 --tokens 64 \
            --tokens 128 --tokens 512 --tokens 4096 --iters 20 >> "$OUT/ab.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/fz/moegen build/moegen
timeout $((560 - SECONDS)) stdbuf -oL -eL build/fz/test_gpu --tokens-max 600 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b \
    longcat deepseek-v4 gemv > "$OUT/test_gpu_fz.log" 2>&1
echo "test_gpu (fz): exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu_fz.log"; grep -m8 FAIL "$OUT/test_gpu_fz.log"; gzip -9 "$OUT/test_gpu_fz.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/ab.log" "LAYER graph" gemm_up_swiglu gemm_down route permute_plan
gzip -9 "$OUT/ab.log"
