#!/usr/bin/env bash
# moegen's layer against the Hugging Face transformers MoE blocks, on the GPU
# (bench/check_models.py --backend gpu; docs/models.md). Run from the
# repository root on the GPU machine with build/ carried (libmoegen.so and
# the Lua library beside it); needs python3 with torch and transformers, no
# Lua and no network. Extra arguments go to check_models.py, e.g.
#   bench/gpu_check_models.sh --families deepseek-v3,qwen2-moe
# The log is $OUT/check_models.gpu.log; the exit status is check_models.py's
# (0 all within tolerance, 1 a family failed or could not run).
set -u
OUT=${OUT:-/tmp/moegen_out}; mkdir -p "$OUT"
export MOEGEN_CACHE_DIR=${MOEGEN_CACHE_DIR:-/tmp/moegen_cache}
. "$(dirname "$0")/gpu_env.sh"
PY=${PYTHON:-python3}
if ! $PY -c 'import torch, transformers' 2>/dev/null; then
    echo "gpu_check_models.sh: $PY cannot import torch and transformers" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/check_models.gpu.txt"
timeout 580 $PY bench/check_models.py --backend gpu --log "$OUT/check_models.gpu.log" "$@"
