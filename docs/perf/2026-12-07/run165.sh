#!/usr/bin/env bash
# Run 165 (twenty-ninth session): run164.sh on a fresh build of main, ~420 s.
# r165 = main 30cdd96 (run164's a30bcc0 plus the review commit). Correctness only (~360 s; carry ["build/r165"]):
#   py/  the C++ torch op and test_torch_gpu.py whole, the JAX handler and test_jax_gpu.py (its train_hgrad), beside
#   t/   test_bwd_gpu whole (cases, examples, fsdp, ep; 240 s), then the sm_80 kernel set on this 9.0 GPU
#        (MOEGEN_ARCH=sm_80, never run on a GPU before): test_gpu <= 64 tokens, test_bwd_gpu train_softmax + hgrad.
#   The backward benchmark run164 had moved to run166.sh.
set -u
mkdir -p "$OUT/py" "$OUT/t"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r165/moegen build/r165/libmoegen.so build/r165/libmoegen_ref.so build/r165/liblua5.4.so.0 \
    build/r165/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r165${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
{ mkdir -p /tmp/top
  timeout 120 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
  echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 200 \
      python3 python/tests/test_torch_gpu.py > "$OUT/py/test_torch_gpu.log" 2>&1
  echo "test_torch_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
{ timeout 90 python3 python/build_jax.py > "$OUT/py/build_jax.log" 2>&1
  echo "build_jax: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 200 python3 python/tests/test_jax_gpu.py \
      > "$OUT/py/test_jax_gpu.log" 2>&1
  echo "test_jax_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
timeout 240 stdbuf -oL -eL build/r165/test_bwd_gpu > "$OUT/t/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
# the sm_80 kernel set on this 9.0 GPU (MOEGEN_ARCH=sm_80: compute_80 PTX the driver compiles), never run before
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 60 stdbuf -oL -eL build/r165/test_gpu --tokens-max 64 qwen3-30b mixtral \
    gpt-oss-20b > "$OUT/t/test_gpu_sm80.log" 2>&1
echo "test_gpu sm_80 (<= 64 tokens): exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 60 stdbuf -oL -eL build/r165/test_bwd_gpu train_softmax.moe hgrad \
    > "$OUT/t/test_bwd_gpu_sm80.log" 2>&1
echo "test_bwd_gpu sm_80: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
wait
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/py/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
tail -1 "$OUT/py/test_torch_gpu.log"; grep -m8 FAIL "$OUT/py/test_torch_gpu.log"
tail -1 "$OUT/py/test_jax_gpu.log"; grep -m8 -E "FAIL|hgrad" "$OUT/py/test_jax_gpu.log"
cd "$OUT" && tar czf run165.tgz --remove-files py t
