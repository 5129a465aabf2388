#!/usr/bin/env bash
# Run 162 (twenty-eighth session; the device time left after refused starts): test_torch_gpu's train_hgrad check
# alone on the Python ops (--python-ops: moegen.torch's own op, which allocates dw1p and dw2 from plan.info), on
# r160's library with the Python package's struct_size fix. Carry ["build/r160"].
set -u
mkdir -p "$OUT/py"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r160/moegen build/r160/libmoegen.so build/r160/libmoegen_ref.so build/r160/liblua5.4.so.0 \
    build/r160/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r160${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/py/gpu.txt"
MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 75 python3 python/tests/test_torch_gpu.py --python-ops \
    --training train_hgrad > "$OUT/py/test_torch_gpu_hgrad.log" 2>&1
echo "test_torch_gpu --training train_hgrad (Python ops): exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
cat "$OUT/py/gpu.txt" "$OUT/py/rc.txt"; cat "$OUT/py/test_torch_gpu_hgrad.log" | tail -25
