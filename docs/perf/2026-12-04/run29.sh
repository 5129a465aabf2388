#!/usr/bin/env bash
# Run 29 (the next session's third device call, if runs 27 and 28 leave time): moegen tune over the gemv grid alone
# (--grid gemv: its 9 candidates, bn 8 and 16 among them) at 1, 8 and 32 tokens for the four specs that ship gemv
# entries, the entries printed (not merged); decide new shipped entries from moe_bench --graph, as runs 24-25 did,
# not from tune's GEMM-only times alone. ~100 s a spec.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s" >> "$OUT/gemv_tune.log"
    timeout 130 build/moegen tune examples/specs/$s.moe --grid gemv --tokens 1,8,32 --iters 10 >> "$OUT/gemv_tune.log" 2>&1
    echo "tune $s: exit $?" | tee -a "$OUT/gemv_tune.log"
done
grep -E '^== |^[0-9]+ [0-9]+ [0-9]+ [0-9]+ bf16|exit' "$OUT/gemv_tune.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
