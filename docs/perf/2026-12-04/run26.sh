#!/usr/bin/env bash
# Run 26: the shipped table with the gemv entries: test_gpu's example cases of the four specs that now take the
# gemv grid at decode sizes, calls of at most 48 tokens (eager and graph replays), correctness only; the fp8
# vendored launcher beside it (an fp8 spec now takes no tuning entry).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 60 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe > "$OUT/test_vendored_fp8.log" 2>&1 &
timeout ${T_LIMIT:-100} build/tests/test_gpu --tokens-max 48 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 \
    > "$OUT/test_gpu_shipped_small.log" 2>&1
echo "test_gpu: exit $?" >> "$OUT/rc.txt"
wait
grep -E "^test_vendored: " "$OUT/test_vendored_fp8.log"
grep -E "gemv|^test_gpu: [0-9]+ passed|FAIL" "$OUT/test_gpu_shipped_small.log" | head -30
cat "$OUT/rc.txt"
