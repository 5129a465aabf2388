#!/usr/bin/env bash
# Run 172 (for the next session that is lent an H200; not run yet): issue #19's done-when on the H200 in one call.
# carry ["build/r172"]: a build of main (make gpu-build build/libmoegen_ref.so && /work/mkr.sh build r172).
#   t/  test_bwd_gpu whole as four processes side by side (its cases, with bwd.tune / bwd2.tune's; the example
#       specs; the EP meshes one GPU hosts; the dp x fsdp meshes): run 169 needed more than 186 s for the cases +
#       FSDP in one process, so each gets BUDGET / 2 here
#   s/  moe_bench --backward (dtype and fp32 gradients) and compare_torch --backward at 4096 tokens for Qwen3,
#       Mixtral and the EP8 rank: #19's ratios on the GPU the issue names
set -u
BUDGET=${1:-560}
T=$((BUDGET / 2))
mkdir -p "$OUT/t" "$OUT/s"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r172/moegen build/r172/libmoegen.so build/r172/libmoegen_ref.so build/r172/liblua5.4.so.0 \
    build/r172/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/build/r172${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
for part in tests/specs examples ep fsdp; do
    n=${part//\//_}
    { timeout $T stdbuf -oL -eL build/r172/test_bwd_gpu $part > "$OUT/t/test_bwd_gpu_$n.log" 2>&1
      echo "test_bwd_gpu $part: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"; } &
done
wait
B=build/r172
for sp in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$sp.moe; echo "training = true"; } > /tmp/train_$sp.moe
    { cat /tmp/train_$sp.moe; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$sp.moe
    for v in trainh train; do
        [ $SECONDS -le $((BUDGET - 45)) ] || break 2
        echo "== $v $sp" >> "$OUT/s/backward.log"
        timeout 40 $B/moe_bench /tmp/${v}_$sp.moe --backward --tokens 4096 --iters 10 >> "$OUT/s/backward.log" 2>&1
        echo "backward $v $sp: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
    done
    [ $SECONDS -le $((BUDGET - 35)) ] || break
    echo "== torch $sp" >> "$OUT/s/backward.log"
    timeout 35 python3 bench/compare_torch.py examples/specs/$sp.moe --backward --tokens 4096 --iters 10 \
        >> "$OUT/s/backward.log" 2>&1
    echo "compare backward $sp: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
cat "$OUT/gpu.txt" "$OUT/t/rc.txt" "$OUT/s/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; done
grep -E "^== |^4096 +(0|1) |^4096 +[dw]grad|autograd (fwd|bwd)" "$OUT/s/backward.log"
cd "$OUT" && tar czf run172.tgz --remove-files t s
