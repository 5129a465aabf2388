#!/usr/bin/env bash
# Run 11: moegen tune at 128, 512 and 2048 tokens for the three decode specs, merged into a copy of the shipped
# table ($OUT/h200.tune). Run 10 showed a call of 512 tokens on Mixtral and the DeepSeek-V3 EP8 rank slower with the
# variants (1.18 vs 1.01 ms, 1.17 vs 1.06 ms: it runs the 128-token bucket's tile-grid GEMMs where main ran the
# capacity's ping-pong ones); a 512 bucket lets the table say which wins there.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
cp tuning/h200.tune "$OUT/h200.tune"
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    echo "== $s" >> "$OUT/tune.log"
    timeout 150 build/moegen tune examples/specs/$s.moe --tokens 128,512,2048 --iters 10 -o "$OUT/h200.tune" >> "$OUT/tune.log" 2>&1
    echo "tune $s: exit $?" >> "$OUT/rc.txt"
    grep -E "^==|tokens:" "$OUT/tune.log" | tail -4
done
cat "$OUT/rc.txt"
