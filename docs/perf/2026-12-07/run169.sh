#!/usr/bin/env bash
# Run 169 (thirtieth session): HEAD's unrun GPU tests, then the backward GEMMs' tiles from the tuning table.
# carry ["build/r169"] (main with backward tuning entries; build/r169 = /work/mkr.sh build r169). BUDGET ($1, 540) s.
#   t/  test_bwd_gpu whole, as two processes (the cases, with bwd.tune / bwd2.tune's: the backward entries' tiles
#       against the CPU reference, EP and FSDP; the example specs), beside py/: test_torch_gpu.py whole on the C++ ops and test_jax_gpu.py (train_hgrad);
#       then the sm_80 kernel set on this 9.0 GPU (MOEGEN_ARCH=sm_80): test_gpu <= 64 tokens, test_bwd_gpu
#       train_softmax + hgrad
#   s/  moe_bench --backward at 4096 tokens, dtype gradients, Qwen3 / Mixtral / the EP8 rank, under the embedded
#       table and under it + bwd_S1..S5.lines (backward entries at the 16384 bucket); compare_torch --backward
set -u
BUDGET=${1:-540}
P=$((BUDGET / 3)); T=$((BUDGET / 3))
D=docs/perf/2026-12-07
mkdir -p "$OUT/py" "$OUT/t" "$OUT/s"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r169/moegen build/r169/libmoegen.so build/r169/libmoegen_ref.so build/r169/liblua5.4.so.0 \
    build/r169/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r169${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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
# test_bwd_gpu whole in two processes side by side: the cases (bwd.tune's too), EP and FSDP; the example specs
{ timeout $T stdbuf -oL -eL build/r169/test_bwd_gpu examples > "$OUT/t/test_bwd_gpu_examples.log" 2>&1
  echo "test_bwd_gpu examples: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"; } &
timeout $T stdbuf -oL -eL build/r169/test_bwd_gpu tests/specs ep fsdp > "$OUT/t/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu cases ep fsdp: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 40 stdbuf -oL -eL build/r169/test_gpu --tokens-max 64 qwen3-30b mixtral \
    gpt-oss-20b > "$OUT/t/test_gpu_sm80.log" 2>&1
echo "test_gpu sm_80 (<= 64 tokens): exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 40 stdbuf -oL -eL build/r169/test_bwd_gpu train_softmax.moe hgrad \
    > "$OUT/t/test_bwd_gpu_sm80.log" 2>&1
echo "test_bwd_gpu sm_80: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
wait
B=build/r169
for s in S1 S2 S3 S4 S5; do cat tuning/h200.tune $D/bwd_$s.lines > /tmp/$s.tune; done
for sp in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$sp.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/th_$sp.moe
done
# round-robin over the tables so a late stop still leaves every spec with the default and some candidates
for tab in default S1 S2 S3 S4 S5; do
    for sp in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
        [ $SECONDS -le $((BUDGET - 60)) ] || break 2
        echo "== $tab $sp" >> "$OUT/s/sweep.log"
        if [ $tab = default ]; then
            timeout 40 $B/moe_bench /tmp/th_$sp.moe --backward --tokens 4096 --iters 10 >> "$OUT/s/sweep.log" 2>&1
        else
            MOEGEN_TUNING=/tmp/$tab.tune timeout 40 $B/moe_bench /tmp/th_$sp.moe --backward --tokens 4096 \
                --iters 10 >> "$OUT/s/sweep.log" 2>&1
        fi
        echo "sweep $tab $sp: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
    done
done
for sp in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $SECONDS -le $((BUDGET - 35)) ] || break
    echo "== torch $sp" >> "$OUT/s/torch.log"
    timeout 35 python3 bench/compare_torch.py examples/specs/$sp.moe --backward --tokens 4096 --iters 10 \
        >> "$OUT/s/torch.log" 2>&1
    echo "compare backward $sp: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/py/rc.txt" "$OUT/s/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
tail -1 "$OUT/py/test_torch_gpu.log"; grep -m8 FAIL "$OUT/py/test_torch_gpu.log"
tail -1 "$OUT/py/test_jax_gpu.log"; grep -m8 -E "FAIL|hgrad" "$OUT/py/test_jax_gpu.log"
grep -E "^== |^4096 |dgrad|wgrad" "$OUT/s/sweep.log" | head -150
grep -E "^== |autograd" "$OUT/s/torch.log"
cd "$OUT" && tar czf run169.tgz --remove-files py t s
