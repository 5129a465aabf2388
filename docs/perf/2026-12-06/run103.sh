#!/usr/bin/env bash
# Run 103 (sixteenth session): the gathered up GEMM on specs with a shared expert (its slots' rows: every token
# once more per slot, src_of[row] = t), never GPU-tested before: test_gpu MOEGEN_GATHER=on on deepseek-v2-lite (two
# shared slots), qwen2-moe-57b-a14b (eight, sigmoid-gated) and nemotron-3-nano (two, sigmoid routing), main 4d16cb0.
# carry ["build/r101"]
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/r101/moegen build/moegen
MOEGEN_GATHER=on timeout 150 stdbuf -oL -eL build/r101/test_gpu deepseek-v2-lite qwen2-moe-57b-a14b nemotron-3-nano \
    > "$OUT/test_gpu_shared_on.log" 2>&1
echo "test_gpu shared on: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_shared_on.log") gathering calls" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
tail -n 1 "$OUT/test_gpu_shared_on.log"; grep -o 'so far [0-9]* passed, [0-9]* failed' "$OUT/test_gpu_shared_on.log" | tail -1
grep -m5 FAIL "$OUT/test_gpu_shared_on.log"
grep -m6 'gathers x' "$OUT/test_gpu_shared_on.log"
gzip -9 "$OUT"/*.log
# Then, in a second call on the same warm machine (its command inline, not this script): MOEGEN_GATHER=on test_gpu
# glm-4.5-air deepseek-v3 kimi-k2 qwen3-235b-a22b with a 100 s timeout (test_gpu_shared_on2.log.gz): 847 passed,
# 0 failed when the timeout cut it in glm-4.5-air; 12 gathering calls (DeepSeek-V3 with its shared slot 4, the EP8
# rank 6 — its name matched "deepseek-v3" —, Qwen3-235B 2).
