#!/usr/bin/env bash
# Run 91 (fourteenth session): issue #16 item 4 for the one example shape left without tuning entries,
# longcat-flash (512 12 6144 2048, zero experts): moegen tune at 1 .. 2048 tokens with the router buffers sized
# for the scored experts (main a5f9c4e; run 89's tune faulted on them), merged into $OUT/h200.tune, then the layer
# under CUDA graphs under the shipped table (the heuristics) and the new one, with the fixed moe_bench (routing
# over all 768 scored experts, the zero experts' entries in no GEMM). carry ["build/lc"].
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
cp build/lc/moegen build/lc/moe_bench build/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp tuning/h200.tune "$OUT/h200.tune"
timeout 420 build/moegen tune examples/specs/longcat-flash.moe --tokens 1,8,64,128,512,2048 --iters 10 \
    -o "$OUT/h200.tune" > "$OUT/tune.log" 2>&1
echo "tune longcat-flash: exit $? at $SECONDS s" >> "$OUT/rc.txt"
for t in shipped tuned; do
    if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=$OUT/h200.tune; fi
    echo "== longcat-flash $t" >> "$OUT/bench.log"
    MOEGEN_TUNING=$tab timeout 60 build/moe_bench examples/specs/longcat-flash.moe --graph --tokens 1 --tokens 8 \
        --tokens 64 --tokens 128 --tokens 512 --tokens 2048 --iters 20 >> "$OUT/bench.log" 2>&1
    echo "bench $t: exit $? at $SECONDS s" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"; tail -n 4 "$OUT/tune.log"
diff tuning/h200.tune "$OUT/h200.tune" | grep '^>'
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu gemm_down
grep -E "^(1|2048) +(LAYER graph|gemm_up|weights)" "$OUT/bench.log"
