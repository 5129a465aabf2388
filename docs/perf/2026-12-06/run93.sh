#!/usr/bin/env bash
# Run 93 (fourteenth session): the GPU tests under the run-92 entries (main with them: Qwen3-30B-A3B on ping-pong
# m64n256 g16 from 4096 tokens, gpt-oss-120b on tile m128n128 at 4096 and ping-pong at 16384, DeepSeek-V3 on
# persist g16 at 16384): test_gpu's cases of those specs (gpt-oss-120b now at 4096 and 16384 tokens, DeepSeek-V3
# at 16384: the new buckets), then longcat-flash's (its new entries). carry ["build/vt"].
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
cp build/vt/moegen build/vt/moe_bench build/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 330 stdbuf -oL -eL build/vt/test_gpu qwen3-30b-a3b gpt-oss-120b deepseek-v3.moe longcat > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"
grep -oE "^case \[[a-z_]+: [^]]+" "$OUT/test_gpu.log" | awk '{print $3}' | sort -u | tr '\n' ' '
gzip -9 "$OUT/test_gpu.log"
