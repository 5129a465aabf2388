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
# on an H200 (the issues' card), the backward fp32 / dtype at 4096 tokens, Qwen3 and Mixtral, once each
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    for s in qwen3-30b-a3b mixtral-8x7b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
        for v in train trainh; do
            [ $SECONDS -le 230 ] || break 2
            echo "== $v $s" >> "$OUT/py/backward_h200.log"
            timeout 30 build/r160/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --iters 10 \
                >> "$OUT/py/backward_h200.log" 2>&1
        done
    done
    grep -E "^== |^4096 +0 " "$OUT/py/backward_h200.log"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/py/gpu.txt"
cat "$OUT/py/rc.txt"; tail -2 "$OUT/py/test_torch_gpu.log"; grep -E "FAIL|hgrad" "$OUT/py/test_torch_gpu.log" | head -30
tail -3 "$OUT/py/test_core.log"
