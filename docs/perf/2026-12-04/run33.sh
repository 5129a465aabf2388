#!/usr/bin/env bash
# Run 33 (written in the seventh 2026-12-04 session, which had no GPU): the fp8 GEMMs' new grids, ~350 s:
#   - test_quant_gpu under tests/tune/fp8p.tune (the persistent grid, one and two consumer warpgroups)
#   - moe_bench of the fp8 Mixtral, EP8 and Qwen3 specs under the default tile, tests/tune/fp8.tune (two consumer
#     warpgroups, the sixth session's) and tests/tune/fp8p.tune, at 128, 4096 and 16384 tokens
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
MOEGEN_TUNING=tests/tune/fp8p.tune timeout 200 build/tests/test_quant_gpu > "$OUT/test_quant_gpu_fp8p.log" 2>&1
echo "test_quant_gpu fp8p: exit $?" >> "$OUT/rc.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for tab in tuning/h200.tune tests/tune/fp8.tune tests/tune/fp8p.tune; do
        echo "== $tab $s" >> "$OUT/fp8_grids.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/fp8/$s.moe --tokens 128 --tokens 4096 \
            --tokens 16384 --iters 10 >> "$OUT/fp8_grids.log" 2>&1
    done
done
cat "$OUT/rc.txt"
tail -2 "$OUT/test_quant_gpu_fp8p.log"
grep -E '^== |gemm_up|gemm_down|LAYER' "$OUT/fp8_grids.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
