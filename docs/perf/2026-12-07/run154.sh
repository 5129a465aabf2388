#!/usr/bin/env bash
# Run 154 (twenty-seventh session): run152.sh's bwd/ part alone (the device time left after refused starts): the
# backward's weight gradients on a second stream (r153 = main, MOEGEN_WGRAD_SMS), moe_bench --backward on Qwen3 and
# Mixtral at 4096 tokens with it off, 33, 66 SMs, then test_bwd_gpu's train cases and examples with 44 for what is
# left of ~150 s. Carry ["build/r153"].
set -u
mkdir -p "$OUT/bwd"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r153/moegen build/r153/libmoegen.so build/r153/libmoegen_ref.so build/r153/liblua5.4.so.0 \
    build/r153/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build/r153${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/bwd/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    for k in off 33 66; do
        [ $SECONDS -le 70 ] || break 2
        echo "== $s MOEGEN_WGRAD_SMS=$k" >> "$OUT/bwd/backward.log"
        MOEGEN_WGRAD_SMS=$k timeout 30 build/r153/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 \
            >> "$OUT/bwd/backward.log" 2>&1
        echo "backward $s $k: exit $? ($SECONDS s)" >> "$OUT/bwd/rc.txt"
    done
done
grep -E "^== |^4096 +0 " "$OUT/bwd/backward.log"
left=$((145 - SECONDS))
[ $left -ge 20 ] && MOEGEN_WGRAD_SMS=44 MOEGEN_TEST_PROGRESS=1 timeout $left stdbuf -oL -eL \
    build/r153/test_bwd_gpu train examples > "$OUT/bwd/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu (MOEGEN_WGRAD_SMS=44): exit $? ($SECONDS s)" >> "$OUT/bwd/rc.txt"
cat "$OUT/bwd/rc.txt"; tail -1 "$OUT/bwd/test_bwd_gpu.log"
grep -m5 FAIL "$OUT/bwd/test_bwd_gpu.log"
cd "$OUT" && tar czf run154.tgz --remove-files bwd
