#!/usr/bin/env bash
# Run 142 (twenty-fifth session): "+ef" (the up GEMM's weight boxes loaded with an L2 evict_first policy, a tuning
# entry's choice) on Mixtral's 512-token bucket (192 x 128 persist): run 136 measured the up GEMM 0.728 -> 0.697 ms
# there with the hint, the down GEMM slower with it (0.345 -> 0.384), so only the up GEMM takes it.
# r142 = this commit's tree; r141 as run141.sh (the same table without the +ef). Carry ["build/r141", "build/r142"].
# (1) test_gpu gemm and layer families at 500-767 tokens on Mixtral (the bucket's calls against the reference);
# (2) moe_bench --graph r141 / r142 on Mixtral at 128 / 512 / 640 / 1024 tokens, interleaved, twice.
set -u
BUDGET=${1:-200}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r142
timeout 80 stdbuf -oL -eL build/r142/test_gpu --family gemm,layer --tokens-min 500 --tokens-max 767 mixtral \
    > "$OUT/w/test_gpu_r142.log" 2>&1
echo "test_gpu r142 gemm,layer 500-767 mixtral: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for r in r141 r142; do
        [ $((SECONDS + 20)) -le $BUDGET ] || break 2
        use $r
        echo "== mixtral-8x7b $r rep=$rep" >> "$OUT/w/ab.log"
        timeout 20 build/$r/moe_bench examples/specs/mixtral-8x7b.moe --graph --tokens 128 --tokens 512 --tokens 640 \
            --tokens 1024 --iters 20 >> "$OUT/w/ab.log" 2>&1
        echo "ab $r rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
cat "$OUT/w/rc.txt"
tail -1 "$OUT/w/test_gpu_r142.log"; grep -m5 FAIL "$OUT/w/test_gpu_r142.log"
grep -E "^== |^(128|512|640|1024) +(gemm|LAYER graph)" "$OUT/w/ab.log"
