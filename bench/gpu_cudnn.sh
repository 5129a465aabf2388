#!/usr/bin/env bash
# One device call for the cuDNN path (README, "cuDNN"): the GPU tests' cuDNN
# cases under every cuDNN the GPU machine offers — the one inside PyTorch
# (9.19 there), the default search (9.14 there), none, and switched off —
# then moegen plan's stage paths and moe_bench --cudnn both.
# Run from the repository root on the GPU machine with build/ carried.
# usage: bench/gpu_cudnn.sh [tests|bench|all]   (logs under $OUT)
set -u
OUT=${OUT:-/tmp/moegen_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. "$(dirname "$0")/gpu_env.sh"
torch_cudnn=${NVIDIA_PY_LIB:+$NVIDIA_PY_LIB/cudnn/lib}
what=${1:-all}
{ nvidia-smi --query-gpu=name,driver_version --format=csv; echo "torch cudnn: $torch_cudnn"; ls "$torch_cudnn" 2>&1 | head -3;
  ldconfig -p | grep -E 'libcudnn(_graph)?\.so\.9 ' ; } | tee "$OUT/cudnn_env.txt"
if [ "$what" != bench ]; then
    for cfg in "torch:MOEGEN_CUDNN_PATH=$torch_cudnn" "default:" "none:MOEGEN_CUDNN_PATH=/nonexistent/cudnn" "off:MOEGEN_CUDNN=off"; do
        name=${cfg%%:*}; envs=${cfg#*:}
        echo "== test_gpu --cudnn ($name: $envs)"
        env $envs timeout 240 build/tests/test_gpu --cudnn > "$OUT/cudnn_$name.log" 2>&1
        grep -E '^test_gpu|cuDNN|FAIL|refused' "$OUT/cudnn_$name.log" | cut -c1-400 | head -40
    done
    echo "== moegen plan (torch cuDNN, on)"
    MOEGEN_CUDNN=on MOEGEN_CUDNN_PATH=$torch_cudnn timeout 120 build/moegen plan examples/specs/mixtral-8x7b.moe 2>&1 | grep -A3 'ffn stage'
    echo "== moegen plan (default cuDNN, auto)"
    timeout 120 build/moegen plan examples/specs/qwen3-30b-a3b.moe 2>&1 | grep -A3 'ffn stage'
fi
if [ "$what" != tests ]; then
    for s in mixtral-8x7b qwen3-30b-a3b deepseek-v3-ep8; do
        MOEGEN_CUDNN_PATH=$torch_cudnn timeout 200 build/moe_bench examples/specs/$s.moe --cudnn both --tokens 128 \
            --tokens 4096 --tokens 16384 --iters 10 2>&1 | tee -a "$OUT/cudnn_bench.log" | grep -E 'plan|gemm|LAYER|moe_bench'
    done
fi
