#!/usr/bin/env bash
# Run 47 (2026-12-05, sixth session): the part of run 41 that decides #20's table, ~480 s:
#   - test_quant_gpu on the shipped table (fp8 entries at 1 and 4096 tokens for the three fp8 example specs; its
#     example cases also run the plan's largest bucket, graph-replayed)
#   - compare_torch of the fp8 specs at 4096 and 16384 tokens (the peer: torch._scaled_grouped_mm, same process)
#   - moe_bench of the fp8 specs at 128 .. 4096 tokens on the shipped table (where the 4096 bucket should start)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 200 build/tests/test_quant_gpu > "$OUT/test_quant_gpu.log" 2>&1; echo "test_quant_gpu: exit $?" >> "$OUT/rc.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    echo "== $s" >> "$OUT/fp8_compare.log"
    timeout 80 python3 bench/compare_torch.py examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 \
        >> "$OUT/fp8_compare.log" 2>&1; echo "compare $s: exit $?" >> "$OUT/rc.txt"
done
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    echo "== $s" >> "$OUT/fp8_buckets.log"
    timeout 30 build/moe_bench examples/specs/fp8/$s.moe --tokens 128 --tokens 512 --tokens 1024 --tokens 2048 \
        --tokens 4096 --iters 10 >> "$OUT/fp8_buckets.log" 2>&1; echo "buckets $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
tail -1 "$OUT/test_quant_gpu.log"; grep FAIL "$OUT/test_quant_gpu.log" | head
grep -vE '^plan' "$OUT/fp8_compare.log" | head -70
grep -E '^== |LAYER' "$OUT/fp8_buckets.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
