#!/usr/bin/env bash
# Run 10: decode-sized calls under CUDA graphs with the GEMM variants (main, this build) against main 73f0fff's
# moe_bench (build-old/: one GEMM configuration per plan, its capacity's), same process order, same GPU; the torch op
# built (CPU) while they run, then python/tests/test_torch_gpu.py on it (the C++ ops past their bad-call checks).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
mkdir -p /tmp/torch_op
( timeout 200 python3 python/build_torch.py --out /tmp/torch_op/libmoegen_torch.so > "$OUT/build_torch.log" 2>&1
  echo "build_torch: exit $?" >> "$OUT/rc.txt" ) &
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    for b in build build-old; do
        echo "== $b $s" >> "$OUT/decode.log"
        timeout 100 $b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
            --tokens 512 --iters 30 >> "$OUT/decode.log" 2>&1
    done
done
grep -E '^==|LAYER|ceilings|variant' "$OUT/decode.log" | head -80
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    timeout 100 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 64 --tokens 512 \
        --iters 20 >> "$OUT/decode_compare.log" 2>&1
    echo "compare_torch $s: exit $?" >> "$OUT/rc.txt"
done
grep -E 'graph|ceilings|^compare' "$OUT/decode_compare.log" | head -60
wait
MOEGEN_TORCH_LIBRARY=/tmp/torch_op/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 240 \
    python3 python/tests/test_torch_gpu.py > "$OUT/test_torch_gpu.log" 2>&1
echo "test_torch_gpu: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -3 "$OUT/build_torch.log"; grep -v '^ok' "$OUT/test_torch_gpu.log" | tail -30
