#!/usr/bin/env bash
# One device call: GPU tests, the vendored build, and the benchmark table.
# Run from the repository root on the GPU machine with build/ carried.
# usage: bench/gpu_session.sh [tests|bench|all]   (logs under $OUT)
set -u
OUT=${OUT:-/tmp/moegen_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. "$(dirname "$0")/gpu_env.sh"
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/gpu.txt"
if [ "$what" != bench ]; then
    timeout 300 build/tests/test_gpu "${@:2}" 2>&1 | tee "$OUT/test_gpu.log" | grep -vE '^  ' | tail -40
    grep -E '^  ' "$OUT/test_gpu.log" | tail -60
    timeout 60 build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe 2>&1 | tee "$OUT/test_vendored.log"
    timeout 200 build/tests/test_ep_gpu 2>&1 | tee "$OUT/test_ep_gpu.log" | tail -12
    timeout 120 build/tests/test_mgpu --bench 2>&1 | tee "$OUT/test_mgpu.log" | tail -12
    timeout 120 build/tests/test_mgpu --bench --no-check --mesh world1 --tokens 4096 2>&1 | tee -a "$OUT/test_mgpu.log" | tail -6
fi
if [ "$what" != tests ]; then
    for s in mixtral-8x7b qwen3-30b-a3b deepseek-v3-ep8 gpt-oss-120b deepseek-v3; do
        timeout 120 build/moe_bench examples/specs/$s.moe --tokens 128 --tokens 4096 --tokens 16384 --iters 20 2>&1 | tee -a "$OUT/bench.log"
    done
fi
