#!/usr/bin/env bash
# Run 164 (written at the end of the twenty-eighth session; the call to make first next session, ~420 s):
# r164 = main 960bcb4 (weight_grads with the bindings and the Python info fix, the fp8 one-token route merged).
#   py/  the C++ torch op built here and test_torch_gpu.py whole (train_hgrad among its training specs), beside
#   t/   test_bwd_gpu whole (cases, examples, fsdp, ep), cut at 220 s; then
#   b/   Mixtral's backward fp32 / dtype at 4096 and 16384 tokens and compare_torch.py --backward (torch autograd:
#        the peer run 160 did not reach), and on an H200 the same for Qwen3 (the issues' card).
# Carry ["build/r164"].
set -u
mkdir -p "$OUT/py" "$OUT/t" "$OUT/b"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r164/moegen build/r164/libmoegen.so build/r164/libmoegen_ref.so build/r164/liblua5.4.so.0 \
    build/r164/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r164${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
{ mkdir -p /tmp/top
  timeout 120 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
  echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 200 \
      python3 python/tests/test_torch_gpu.py > "$OUT/py/test_torch_gpu.log" 2>&1
  echo "test_torch_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
timeout 220 stdbuf -oL -eL build/r164/test_bwd_gpu > "$OUT/t/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
wait
specs=mixtral-8x7b
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && specs="mixtral-8x7b qwen3-30b-a3b"
for s in $specs; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
    for v in train trainh; do
        [ $SECONDS -le 380 ] || break 2
        echo "== $v $s" >> "$OUT/b/backward.log"
        timeout 60 build/r164/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/b/backward.log" 2>&1
    done
    [ $SECONDS -le 420 ] || break
    echo "== torch $s" >> "$OUT/b/backward.log"
    timeout 70 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/b/backward.log" 2>&1
done
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/py/rc.txt"
tail -1 "$OUT/t/test_bwd_gpu.log"; grep -m5 FAIL "$OUT/t/test_bwd_gpu.log"
tail -1 "$OUT/py/test_torch_gpu.log"; grep -m8 FAIL "$OUT/py/test_torch_gpu.log"
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/b/backward.log"
cd "$OUT" && tar czf run164.tgz --remove-files py t b
