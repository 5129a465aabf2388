#!/usr/bin/env bash
# Run 31 (written in the seventh 2026-12-04 session, which had no GPU): moegen tune of the fp8 specs (its 8 e4m3
# candidates since that session: 64 x 256 x 128 on one consumer warpgroup, 128 x 256 x 128 on two, 2-4 stages,
# the tile grid) at 128, 4096 and 16384 tokens; the entries printed, to be judged against moe_bench
# (docs/perf/2026-12-04/run28.sh's fp8c2 rows) before any is shipped. ~200 s a spec (8 JIT compiles).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    echo "== $s" >> "$OUT/fp8_tune.log"
    timeout 280 build/moegen tune examples/specs/fp8/$s.moe --tokens 128,4096,16384 --iters 10 >> "$OUT/fp8_tune.log" 2>&1
    echo "tune $s: exit $?" | tee -a "$OUT/fp8_tune.log"
done
grep -E '^== |e4m3 sm_90a|exit|tokens:' "$OUT/fp8_tune.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
