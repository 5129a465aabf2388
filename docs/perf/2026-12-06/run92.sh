#!/usr/bin/env bash
# Run 92 (fourteenth session): issue #17 item 3, the large-batch entries chosen 2026-12-03, before the ping-pong
# grid was a candidate (Qwen3-30B-A3B persist, gpt-oss-120b and DeepSeek-V3 tile, at 4096 and 16384 tokens):
# moegen tune at 4096,16384 for those three (main 58a1a20, build/lc), merged into $OUT/h200.tune, then the layer
# under the shipped table and the new one at 2048, 4096 and 16384 tokens, side by side. carry ["build/lc"].
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
cp build/lc/moegen build/lc/moe_bench build/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp tuning/h200.tune "$OUT/h200.tune"
specs="qwen3-30b-a3b gpt-oss-120b deepseek-v3"
for s in $specs; do
    if [ $SECONDS -gt 330 ]; then echo "tune $s: not started ($SECONDS s)" >> "$OUT/rc.txt"; continue; fi
    echo "== $s" >> "$OUT/tune.log"
    timeout $((400 - SECONDS)) build/moegen tune examples/specs/$s.moe --tokens 4096,16384 --iters 10 \
        -o "$OUT/h200.tune" >> "$OUT/tune.log" 2>&1
    echo "tune $s: exit $? at $SECONDS s" >> "$OUT/rc.txt"
done
for s in $specs; do
    for t in shipped tuned; do
        if [ $SECONDS -gt 540 ]; then echo "bench $t $s: not started ($SECONDS s)" >> "$OUT/rc.txt"; continue; fi
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=$OUT/h200.tune; fi
        echo "== $s $t" >> "$OUT/bench.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/$s.moe --tokens 2048 --tokens 4096 \
            --tokens 16384 --iters 10 >> "$OUT/bench.log" 2>&1
        echo "bench $t $s: exit $? at $SECONDS s" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
diff tuning/h200.tune "$OUT/h200.tune" | grep '^[<>]'
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" LAYER gemm_up_swiglu gemm_down
