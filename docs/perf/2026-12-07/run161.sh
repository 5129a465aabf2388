#!/usr/bin/env bash
# Run 161 (twenty-eighth session): test_torch_gpu again on r160's library with the Python package's fix (plan.info
# read with struct_size = sizeof, so its fields past moe.h's first layout, weight_grad_bytes among them, are the
# library's, not zeros). Carry ["build/r160"].
set -u
mkdir -p "$OUT/py"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r160/moegen build/r160/libmoegen.so build/r160/libmoegen_ref.so build/r160/liblua5.4.so.0 \
    build/r160/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r160${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/top
timeout 200 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 200 \
    python3 python/tests/test_torch_gpu.py > "$OUT/py/test_torch_gpu.log" 2>&1
echo "test_torch_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 60 python3 python/tests/test_core.py > "$OUT/py/test_core.log" 2>&1
echo "test_core: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
cat "$OUT/py/rc.txt"; tail -2 "$OUT/py/test_torch_gpu.log"; grep -E "FAIL|hgrad" "$OUT/py/test_torch_gpu.log" | head -30
tail -3 "$OUT/py/test_core.log"
