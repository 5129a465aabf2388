#!/usr/bin/env bash
# Run 138 (twenty-fifth session): fp8 decode, continued. r138 = main 84409d6 + the fp8 entries of run 137 at 1, 8,
# 64, 128 tokens (tuning/h200.tune) + the fp8 permute scatter reworked (the row's blocks spread over the block's
# warps, each pair read and quantized once for the token's K rows, instead of one warp per token quantizing each
# of its K rows in turn: 18 / 13 / 54 us at 1 token in run 137) + test_quant_gpu checking a call at every bucket of
# the example specs. r135 = main 4db0ea5. Carry ["build/r135", "build/r138"].
# (1) test_quant_gpu (r138); (2) moe_bench --graph r135 / r138 on the three fp8 example specs at 1 / 8 / 64 / 128 /
# 512 tokens, interleaved, twice; (3) moegen tune (r138) on them at 512, 1024, 2048 tokens, grids tile and persist;
# (4) compare_torch --graph (torch._scaled_grouped_mm) on r138 at 1 / 8 / 128 / 512 tokens while the budget lasts.
# $1: budget in seconds (default 540).
set -u
BUDGET=${1:-540}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r138
timeout 200 stdbuf -oL -eL build/r138/test_quant_gpu > "$OUT/w/test_quant_gpu_r138.log" 2>&1
echo "test_quant_gpu r138: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
        for r in r135 r138; do
            [ $((SECONDS + 25)) -le $BUDGET ] || break 3
            use $r
            echo "== $s $r rep=$rep" >> "$OUT/w/ab.log"
            timeout 25 build/$r/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
                --tokens 128 --tokens 512 --iters 20 >> "$OUT/w/ab.log" 2>&1
            echo "ab $s $r rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
use r138
export LD_LIBRARY_PATH=$PWD/build/r138${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    left=$((BUDGET - SECONDS - 60)); [ $left -ge 40 ] || break
    [ $left -le 80 ] || left=80
    echo "== $s" >> "$OUT/w/tune.log"
    timeout $left build/r138/moegen tune examples/specs/fp8/$s.moe --tokens 512,1024,2048 --grid tile,persist \
        --iters 10 -o "$OUT/w/fp8_512.tune" >> "$OUT/w/tune.log" 2>&1
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8; do
    left=$((BUDGET - SECONDS - 5)); [ $left -ge 30 ] || break
    [ $left -le 60 ] || left=60
    echo "== $s" >> "$OUT/w/compare.log"
    timeout $left python3 bench/compare_torch.py examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 \
        --tokens 128 --tokens 512 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
echo "$(tail -1 "$OUT/w/test_quant_gpu_r138.log")"; grep -m8 FAIL "$OUT/w/test_quant_gpu_r138.log"
grep -E "^== |^(1|8|64|128|512) +(permute_scatter|gemm|LAYER graph)" "$OUT/w/ab.log" | head -150
grep -v "^#" "$OUT/w/fp8_512.tune" 2>/dev/null
grep -E "^== |tokens:" "$OUT/w/tune.log"
tail -30 "$OUT/w/compare.log"
