#!/usr/bin/env bash
# Run 167 (twenty-ninth session): run165.sh and run166.sh cut to one call of BUDGET s ($1, default 540) (the session's device time went
# to refused starts; carry ["build/r167"], r167 = main 5c08b077: the runtime of 30cdd96, moe_bench with the backward GEMMs' floors).
#   py/  the C++ torch op and test_torch_gpu.py whole, the JAX handler and test_jax_gpu.py (train_hgrad), beside
#   t/   test_bwd_gpu whole (BUDGET / 3), the sm_80 kernel set on this 9.0 GPU (MOEGEN_ARCH=sm_80; never run on a GPU
#        before): test_gpu <= 64 tokens and test_bwd_gpu train_softmax + hgrad, 45 s each; then
#   s/   the backward with dtype gradients (moe_bench --backward) and torch autograd (compare_torch --backward) at
#        4096 / 16384 tokens for Qwen3, Mixtral, the EP8 rank; moe_bench --graph at 1 .. 512 tokens for Qwen3 and
#        Mixtral; compare_torch at 4096 / 16384 for Qwen3 and Mixtral.
set -u
BUDGET=${1:-540}   # seconds this call may take; the gates below scale with it
P=$((BUDGET / 3)); T=$((BUDGET / 3))
mkdir -p "$OUT/py" "$OUT/t" "$OUT/s"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r167/moegen build/r167/libmoegen.so build/r167/libmoegen_ref.so build/r167/liblua5.4.so.0 \
    build/r167/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r167${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
{ mkdir -p /tmp/top
  timeout 120 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
  echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout $P \
      python3 python/tests/test_torch_gpu.py > "$OUT/py/test_torch_gpu.log" 2>&1
  echo "test_torch_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
{ timeout 90 python3 python/build_jax.py > "$OUT/py/build_jax.log" 2>&1
  echo "build_jax: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout $P python3 python/tests/test_jax_gpu.py \
      > "$OUT/py/test_jax_gpu.log" 2>&1
  echo "test_jax_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
timeout $T stdbuf -oL -eL build/r167/test_bwd_gpu > "$OUT/t/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
# the sm_80 kernel set on this 9.0 GPU (MOEGEN_ARCH=sm_80: compute_80 PTX the driver compiles), never run before
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 45 stdbuf -oL -eL build/r167/test_gpu --tokens-max 64 qwen3-30b mixtral \
    gpt-oss-20b > "$OUT/t/test_gpu_sm80.log" 2>&1
echo "test_gpu sm_80 (<= 64 tokens): exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 45 stdbuf -oL -eL build/r167/test_bwd_gpu train_softmax.moe hgrad \
    > "$OUT/t/test_bwd_gpu_sm80.log" 2>&1
echo "test_bwd_gpu sm_80: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
wait
B=build/r167
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat /tmp/train_$s.moe; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
    vs=trainh; [ $s = qwen3-30b-a3b ] && vs="train trainh"   # Qwen3's fp32 gradients: the write-bound case
    for v in $vs; do
        [ $SECONDS -le $((BUDGET - 110)) ] || break 2
        echo "== $v $s" >> "$OUT/s/backward.log"
        timeout 40 $B/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/s/backward.log" 2>&1
        echo "backward $v $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
    done
    echo "== torch $s" >> "$OUT/s/backward.log"
    timeout 40 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/s/backward.log" 2>&1
    echo "compare backward $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    [ $SECONDS -le $((BUDGET - 60)) ] || break
    echo "== $s" >> "$OUT/s/small.log"
    timeout 30 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --iters 20 >> "$OUT/s/small.log" 2>&1
    echo "small $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    [ $SECONDS -le $((BUDGET - 30)) ] || break
    echo "== $s" >> "$OUT/s/large.log"
    timeout 30 python3 bench/compare_torch.py examples/specs/$s.moe --tokens 4096 --tokens 16384 --iters 10 \
        >> "$OUT/s/large.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/py/rc.txt" "$OUT/s/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
tail -1 "$OUT/py/test_torch_gpu.log"; grep -m8 FAIL "$OUT/py/test_torch_gpu.log"
tail -1 "$OUT/py/test_jax_gpu.log"; grep -m8 -E "FAIL|hgrad" "$OUT/py/test_jax_gpu.log"
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/s/backward.log"
grep -E "^== |LAYER graph" "$OUT/s/small.log"
cd "$OUT" && tar czf run167.tgz --remove-files py t s
