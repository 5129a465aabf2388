#!/usr/bin/env bash
# Run 89 (fourteenth session): issue #16 item 4, moegen tune at 1, 8, 64, 128, 512 and 2048 tokens for the
# example shapes the shipped table has no entry for (deepseek-v4 = deepseek-v4-hash's shape, gemma4-26b-a4b,
# nemotron-3-nano-30b-a3b, longcat-flash), merged into $OUT/h200.tune (from tuning/h200.tune), then the layer
# under CUDA graphs at 1 .. 2048 tokens under the shipped table and under the new one, side by side.
# Binaries: build/wk (main + patches/route_wk_slices.diff, as landed). carry ["build/wk"]. Deadlines keep the call
# under the device limit.
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
cp build/wk/moegen build/wk/moe_bench build/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp tuning/h200.tune "$OUT/h200.tune"
specs="${SPECS:-gemma4-26b-a4b nemotron-3-nano-30b-a3b deepseek-v4 longcat-flash}"
for s in $specs; do
    if [ $SECONDS -gt ${TUNE_UNTIL:-400} ]; then echo "tune $s: not started (deadline, $SECONDS s)" >> "$OUT/rc.txt"; continue; fi
    echo "== $s" >> "$OUT/tune.log"
    timeout $(( ${TUNE_UNTIL:-400} + 60 - SECONDS )) build/moegen tune examples/specs/$s.moe --tokens 1,8,64,128,512,2048 \
        --iters 10 -o "$OUT/h200.tune" >> "$OUT/tune.log" 2>&1
    echo "tune $s: exit $? at $SECONDS s" >> "$OUT/rc.txt"
done
for s in $specs deepseek-v4-hash; do
    for t in shipped tuned; do
        if [ $SECONDS -gt 560 ]; then echo "bench $t $s: not started ($SECONDS s)" >> "$OUT/rc.txt"; continue; fi
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=$OUT/h200.tune; fi
        echo "== $s $t" >> "$OUT/bench.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
            --tokens 64 --tokens 128 --tokens 512 --tokens 2048 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "bench $t $s: exit $? at $SECONDS s" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
diff tuning/h200.tune "$OUT/h200.tune" | grep '^>'
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph"
