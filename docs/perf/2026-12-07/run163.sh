#!/usr/bin/env bash
# Run 163 (twenty-eighth session, right after run 162 on the warm machine): the C++ torch op built here and
# test_torch_gpu's train_hgrad check on it, then test_core.py (plan.info's later fields read for real now), on r160's
# library. Carry ["build/r160"].
set -u
mkdir -p "$OUT/py"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r160/moegen build/r160/libmoegen.so build/r160/libmoegen_ref.so build/r160/liblua5.4.so.0 \
    build/r160/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r160${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/top
timeout 60 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 50 \
    python3 python/tests/test_torch_gpu.py --training train_hgrad > "$OUT/py/test_torch_gpu_hgrad_cpp.log" 2>&1
echo "test_torch_gpu --training train_hgrad (C++ ops): exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 40 python3 python/tests/test_core.py > "$OUT/py/test_core.log" 2>&1
echo "test_core: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
cat "$OUT/py/rc.txt"; tail -4 "$OUT/py/test_torch_gpu_hgrad_cpp.log"; grep FAIL "$OUT/py/test_torch_gpu_hgrad_cpp.log"
tail -4 "$OUT/py/test_core.log"
