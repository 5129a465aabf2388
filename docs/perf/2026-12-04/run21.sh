#!/usr/bin/env bash
# Run 21 (fifth 2026-12-04 session): (1) the route's H split at decode sizes: at least 256 (shipped), 128 or 64
# columns per split block (build/exp/moe_bench_N: gen/family_route.c compiled with -DMOE_ROUTE_SPLIT_COLS=N),
# the layer replayed from CUDA graphs at 1, 4, 16, 64 tokens, the three binaries interleaved per spec;
# (2) test_gpu --cudnn (the cuDNN cases, which run 20's test_gpu did not reach); (3) issue #16 item 4: moegen tune
# at decode sizes for the four example specs run 16 did not reach, and the layer under the shipped table against
# the new one. Deadlines keep the call under the device limit.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b; do
    for b in build/moe_bench build/exp/moe_bench_128 build/exp/moe_bench_64 build/moe_bench; do
        echo "== $b $s" >> "$OUT/routesplit.log"
        timeout 60 $b examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 16 --tokens 64 --iters 30 \
            >> "$OUT/routesplit.log" 2>&1
    done
done
echo "routesplit done at $(el) s" >> "$OUT/rc.txt"
timeout 120 build/tests/test_gpu --cudnn > "$OUT/test_gpu_cudnn.log" 2>&1
echo "test_gpu --cudnn: exit $? at $(el) s" >> "$OUT/rc.txt"
cp tuning/h200.tune "$OUT/h200.tune"
done_specs=""
for s in ${SPECS:-deepseek-v3-ep8 gpt-oss-120b kimi-k2 deepseek-v3}; do
    if [ $(el) -gt ${TUNE_UNTIL:-330} ]; then echo "tune $s: not started (deadline, $(el) s)" >> "$OUT/rc.txt"; continue; fi
    echo "== $s" >> "$OUT/tune.log"
    timeout 100 build/moegen tune examples/specs/$s.moe --tokens 1,8,64,128,512 --iters 10 \
        -o "$OUT/h200.tune" >> "$OUT/tune.log" 2>&1
    rc=$?; echo "tune $s: exit $rc at $(el) s" >> "$OUT/rc.txt"
    [ $rc -eq 0 ] && done_specs="$done_specs $s"
done
for s in $done_specs; do
    if [ $(el) -gt ${BENCH_UNTIL:-480} ]; then echo "bench $s: not started ($(el) s)" >> "$OUT/rc.txt"; continue; fi
    for t in shipped tuned; do
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=$OUT/h200.tune; fi
        echo "== $t $s" >> "$OUT/bench.log"
        MOEGEN_TUNING=$tab timeout 45 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
            --tokens 64 --tokens 128 --tokens 512 --iters 10 >> "$OUT/bench.log" 2>&1
    done
    echo "bench $s: done at $(el) s" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $0}' "$OUT/routesplit.log"
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $0}' "$OUT/bench.log" | head -60
grep -E '^test_gpu: [0-9]+ passed|FAIL' "$OUT/test_gpu_cudnn.log" | head
