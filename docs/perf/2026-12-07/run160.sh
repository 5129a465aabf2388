#!/usr/bin/env bash
# Run 160 (twenty-eighth session): r160 = main e86a688 (land-route merged, weight_grads with the bindings).
#   py/   the torch op built here (python/build_torch.py), test_torch_gpu.py (train_hgrad: dw1p, dw2 in bf16);
#   w/    test_bwd_gpu ep (every EP mesh; the dtype weight gradients' last), cut at 150 s; test_quant_gpu (the
#         merged fp8 one-token route) cut at 60 s; moe_bench --backward at 4096 / 16384 tokens for the EP8 rank and
#         Qwen3, weight_grads fp32 / dtype; compare_torch.py --backward (torch autograd, bf16 gradients) for what is
#         left of ~520 s. Carry ["build/r160"].
set -u
mkdir -p "$OUT/w" "$OUT/py"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r160/moegen build/r160/libmoegen.so build/r160/libmoegen_ref.so build/r160/liblua5.4.so.0 \
    build/r160/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r160${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
{ mkdir -p /tmp/top
  timeout 200 python3 python/build_torch.py --out /tmp/top/libmoegen_torch.so > "$OUT/py/build_torch.log" 2>&1
  echo "build_torch: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"
  MOEGEN_TORCH_LIBRARY=/tmp/top/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so timeout 200 \
      python3 python/tests/test_torch_gpu.py > "$OUT/py/test_torch_gpu.log" 2>&1
  echo "test_torch_gpu: exit $? ($SECONDS s)" >> "$OUT/py/rc.txt"; } &
timeout 150 stdbuf -oL -eL build/r160/test_bwd_gpu ep > "$OUT/w/test_bwd_gpu_ep.log" 2>&1
echo "test_bwd_gpu ep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 60 stdbuf -oL -eL build/r160/test_quant_gpu > "$OUT/w/test_quant_gpu.log" 2>&1
echo "test_quant_gpu: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
wait
for s in deepseek-v3-ep8 qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
done
# the forward GEMMs' TFLOP/s beside the wgrads' (#19: wgrads >= 85 % of them), Mixtral at 4096
timeout 40 build/r160/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 10 > "$OUT/w/fwd_mixtral.log" 2>&1
{ cat examples/specs/mixtral-8x7b.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_mx.moe
timeout 40 build/r160/moe_bench /tmp/trainh_mx.moe --backward --tokens 4096 --iters 10 >> "$OUT/w/fwd_mixtral.log" 2>&1
echo "mixtral fwd + bwd: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in deepseek-v3-ep8 qwen3-30b-a3b; do
    for v in train trainh; do
        [ $SECONDS -le 380 ] || break 2
        echo "== $v $s" >> "$OUT/w/backward.log"
        timeout 60 build/r160/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/w/backward.log" 2>&1
        echo "backward $v $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
for s in qwen3-30b-a3b deepseek-v3-ep8; do
    [ $SECONDS -le 440 ] || break
    echo "== torch $s" >> "$OUT/w/backward.log"
    timeout 65 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/w/backward.log" 2>&1
    echo "compare backward $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt" "$OUT/py/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
tail -3 "$OUT/py/test_torch_gpu.log"; grep -E "FAIL|hgrad" "$OUT/py/test_torch_gpu.log" | head -20
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/w/backward.log"
grep -E "^4096 +(gemm_up|gemm_down|LAYER|wgrad|dgrad)|^4096 +0 " "$OUT/w/fwd_mixtral.log"
cd "$OUT" && tar czf run160.tgz --remove-files w py
