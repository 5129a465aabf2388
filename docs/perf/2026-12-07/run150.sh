#!/usr/bin/env bash
# Run 150 (twenty-seventh session): the weight gradients with 128 x 128 tiles, 4 stages, the fp32 tile staged whole
# and stored by TMA in one pass under the next tile's main loop (branch wgrad-bn128, r150), against 128 x 256 tiles,
# 3 stages, staged in two passes (the second waits for the first's read-out; r148, whose backward is main's).
# Qwen3's wgrad_up at 4096 tokens took 0.702 of the backward's 2.02 ms on the H200 (run 75) writing 1.6 GB of fp32.
# (1) moe_bench --backward, r148 then r150, twice: Qwen3 4096 + 16384, Mixtral 4096, the EP8 rank 4096;
# (2) test_bgemm_gpu (every backward GEMM against the CPU, poisoned, ragged) and test_bwd_gpu's cases + examples on
# r150. Carry ["build/r148", "build/r150"]. $1: budget in seconds (default 420).
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
cp build/r150/liblua5.4.so.0 build/r150/libjansson.so.4 build/
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
done
for rep in 1 2; do
    for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
        toks="--tokens 4096"; [ $s = qwen3-30b-a3b ] && toks="--tokens 4096 --tokens 16384"
        for b in ${BASE:-r148} r150; do
            [ $((SECONDS + 40)) -le $((BUDGET * 55 / 100)) ] || break 3
            echo "== $s $b rep=$rep" >> "$OUT/w/backward.log"
            LD_LIBRARY_PATH=$PWD/build/$b timeout 45 build/$b/moe_bench /tmp/train_$s.moe --backward $toks --iters 10 \
                >> "$OUT/w/backward.log" 2>&1
            echo "bench backward $s $b $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
export LD_LIBRARY_PATH=$PWD/build/r150
cp build/r150/moegen build/r150/libmoegen.so build/r150/libmoegen_ref.so build/
timeout 90 stdbuf -oL -eL build/r150/test_bgemm_gpu > "$OUT/w/test_bgemm_gpu.log" 2>&1
echo "test_bgemm_gpu: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
left=$((BUDGET - SECONDS - 5))
[ $left -ge 20 ] && MOEGEN_TEST_PROGRESS=1 timeout $left stdbuf -oL -eL build/r150/test_bwd_gpu train examples \
    > "$OUT/w/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |^(4096|16384) +(0|wgrad_up|wgrad_down) " "$OUT/w/backward.log"
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
