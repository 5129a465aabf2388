#!/usr/bin/env bash
# Run 137 (twenty-fifth session): fp8 decode. The fp8 example specs' calls of 1-512 tokens run the default fp8 tile
# (64 x 256 x 128, one CTA per tile; tuning/h200.tune has e4m3 entries at 1 and 4096 only, chosen from moe_bench,
# moegen tune never ran on them). (1) moe_bench --graph on the three fp8 example specs at 1 / 8 / 64 / 128 / 512
# tokens (the streaming rate against the copy: #20's "at <= 128 tokens, weights at >= 85 % of the copy bandwidth");
# (2) moegen tune on them at 1, 8, 64, 128 tokens, grids tile, persist and gemv (the fp8 gemv: bn 32..256, the up
# GEMM's CTAs in clusters sharing a quantization block); the entries into $OUT/w/fp8.tune.
# Build r135 = main 4db0ea5 (as run136.sh). Carry ["build/r135"]. $1: budget in seconds (default 540).
set -u
BUDGET=${1:-540}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
cp build/r135/moegen build/r135/libmoegen.so build/r135/libmoegen_ref.so build/r135/liblua5.4.so.0 build/r135/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build/r135${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    echo "== $s" >> "$OUT/w/bench.log"
    timeout 40 build/r135/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --iters 20 >> "$OUT/w/bench.log" 2>&1
    echo "bench $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    left=$((BUDGET - SECONDS - 5)); [ $left -ge 60 ] || break
    [ $left -le 170 ] || left=170
    echo "== $s" >> "$OUT/w/tune.log"
    timeout $left build/r135/moegen tune examples/specs/fp8/$s.moe --tokens 1,8,64,128 --grid tile,persist,gemv \
        --iters 20 -o "$OUT/w/fp8.tune" >> "$OUT/w/tune.log" 2>&1
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
grep -E "^== |ceilings|^(1|8|64|128|512) +(gemm|LAYER graph|weights)" "$OUT/w/bench.log"
grep -v "^#" "$OUT/w/fp8.tune" 2>/dev/null
tail -5 "$OUT/w/tune.log"
