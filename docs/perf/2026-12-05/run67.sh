#!/usr/bin/env bash
# Run 67 (2026-12-05, eighth session), ~140 s, the session's last device time. Branch fp8-quarters (f24536f; its
# moe_bench and test_quant_gpu at build/q/): the fp8 consumer in 64-column quarter groups with two partial sums,
# each promoted while the next runs. moe_bench at 4096 tokens, main's build (8d5c3fb) against the branch, Mixtral
# fp8 (channel, persistent) and the EP8 rank fp8 (block, tile grid); then the branch's test_quant_gpu.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    for b in build/moe_bench build/q/moe_bench; do
        echo "== $s $b" >> "$OUT/fp8_bench.log"
        timeout 25 $b examples/specs/fp8/$s.moe --tokens 4096 --iters 10 >> "$OUT/fp8_bench.log" 2>&1
        echo "bench $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
timeout 70 build/q/test_quant_gpu > "$OUT/q_test_quant_gpu.log" 2>&1; echo "q test_quant_gpu: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
echo "-- q_test_quant_gpu: $(tail -n 1 $OUT/q_test_quant_gpu.log)"; grep FAIL "$OUT/q_test_quant_gpu.log" | head -5
grep -E '^== |gemm_|LAYER' "$OUT/fp8_bench.log"
