#!/usr/bin/env bash
# The tests, the benchmark table and the PyTorch comparison in one device call.
set -u
OUT=${OUT:-/tmp/moegen_out}; mkdir -p "$OUT"
bash bench/gpu_session.sh all > "$OUT/session.log" 2>&1
grep -E 'test_gpu:|test_vendored:|FAIL|vendored ' "$OUT/session.log" | head -30
grep -E '^  ' "$OUT/test_gpu.log" | grep -E 'wide|mixtral|deepseek_v3/' | head -12
grep -E 'LAYER|gemm_|ceilings' "$OUT/bench.log" | head -60
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in mixtral-8x7b qwen3-30b-a3b deepseek-v3-ep8; do
    timeout 60 python3 bench/compare_torch.py examples/specs/$s.moe --tokens 512 --tokens 4096 --tokens 16384 --iters 10 2>&1 | tee -a "$OUT/compare.log"
done
