#!/usr/bin/env bash
# Run 165 (twenty-ninth session): run164.sh on a fresh build of main, ~420 s.
# r165 = main 30cdd96 (= run164's a30bcc0 plus the review commit; same behaviour).
#   py/  the C++ torch op built here and test_torch_gpu.py whole (train_hgrad among its training specs), the JAX
#        handler built (python/build_jax.py) and test_jax_gpu.py (its train_hgrad too), beside
#   t/   test_bwd_gpu whole (cases, examples, fsdp, ep), cut at 170 s; then the sm_80 kernel set on this GPU
#        (MOEGEN_ARCH=sm_80, never run on a GPU before): test_gpu <= 64 tokens and test_bwd_gpu's train_softmax and
#        hgrad cases, 60 s each (a failure there may be a test that assumes sm_90a's kernels: read it); then
#   b/   Mixtral's backward fp32 / dtype at 4096 and 16384 tokens and compare_torch.py --backward (torch autograd:
#        the peer run 160 did not reach), and on an H200 the same for Qwen3 (the issues' card).
# Carry ["build/r165"].
set -u
mkdir -p "$OUT/py" "$OUT/t" "$OUT/b"
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
timeout 170 stdbuf -oL -eL build/r165/test_bwd_gpu > "$OUT/t/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
# the sm_80 kernel set on this 9.0 GPU (MOEGEN_ARCH=sm_80: compute_80 PTX the driver compiles), never run before
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 60 stdbuf -oL -eL build/r165/test_gpu --tokens-max 64 qwen3-30b mixtral \
    gpt-oss-20b > "$OUT/t/test_gpu_sm80.log" 2>&1
echo "test_gpu sm_80 (<= 64 tokens): exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 60 stdbuf -oL -eL build/r165/test_bwd_gpu train_softmax.moe hgrad \
    > "$OUT/t/test_bwd_gpu_sm80.log" 2>&1
echo "test_bwd_gpu sm_80: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
wait
specs=mixtral-8x7b
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && specs="mixtral-8x7b qwen3-30b-a3b"
for s in $specs; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
    for v in train trainh; do
        [ $SECONDS -le 380 ] || break 2
        echo "== $v $s" >> "$OUT/b/backward.log"
        timeout 60 build/r165/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/b/backward.log" 2>&1
    done
    [ $SECONDS -le 420 ] || break
    echo "== torch $s" >> "$OUT/b/backward.log"
    timeout 70 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/b/backward.log" 2>&1
done
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/py/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
tail -1 "$OUT/py/test_torch_gpu.log"; grep -m8 FAIL "$OUT/py/test_torch_gpu.log"
tail -1 "$OUT/py/test_jax_gpu.log"; grep -m8 -E "FAIL|hgrad" "$OUT/py/test_jax_gpu.log"
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/b/backward.log"
cd "$OUT" && tar czf run165.tgz --remove-files py t b
