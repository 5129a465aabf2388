#!/usr/bin/env bash
# Run 159 (twenty-eighth session, after run 158 on the same warm machine): r158 (main 11c4a31, weight_grads).
#   test_bwd_gpu ep (every EP mesh, the dtype weight gradients' last; cut at 170 s);
#   moe_bench --backward at 4096 and 16384 tokens, Qwen3, Mixtral, the EP8 rank, weight_grads fp32 / dtype;
#   compare_torch.py --backward (torch autograd of the eager layer; its weight gradients bf16) for what is left
#   of ~440 s. Carry ["build/r158"].
set -u
mkdir -p "$OUT/w"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r158/moegen build/r158/libmoegen.so build/r158/libmoegen_ref.so build/r158/liblua5.4.so.0 \
    build/r158/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r158${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
timeout 170 stdbuf -oL -eL build/r158/test_bwd_gpu ep > "$OUT/w/test_bwd_gpu_ep.log" 2>&1
echo "test_bwd_gpu ep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
done
for s in qwen3-30b-a3b deepseek-v3-ep8 mixtral-8x7b; do
    for v in train trainh; do
        [ $SECONDS -le 330 ] || break 2
        echo "== $v $s" >> "$OUT/w/backward.log"
        timeout 60 build/r158/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/w/backward.log" 2>&1
        echo "backward $v $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
for s in qwen3-30b-a3b deepseek-v3-ep8 mixtral-8x7b; do
    [ $SECONDS -le 370 ] || break
    echo "== torch $s" >> "$OUT/w/backward.log"
    timeout 70 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/w/backward.log" 2>&1
    echo "compare backward $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"; tail -1 "$OUT/w/test_bwd_gpu_ep.log"; grep -m5 FAIL "$OUT/w/test_bwd_gpu_ep.log"
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/w/backward.log"
cd "$OUT" && tar czf run159.tgz --remove-files w
