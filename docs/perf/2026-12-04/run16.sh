#!/usr/bin/env bash
# Run 16 (first device call of the fourth 2026-12-04 session): issue #16 item 4 / #17 item 3 — moegen tune at
# 1, 8, 64, 128, 512, 2048 (and 4096) tokens for the example specs the shipped table lacks or lacks small buckets
# for, merged into a copy of tuning/h200.tune ($OUT/h200.tune); a deadline keeps the call under the device limit
# (a spec not started is listed in rc.txt). Then the layer under CUDA graphs, shipped table against the new one.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp tuning/h200.tune "$OUT/h200.tune"
specs=${SPECS:-"olmoe-1b-7b deepseek-v2-lite qwen3-235b-a22b glm-4.5-air qwen2-moe-57b-a14b gpt-oss-20b llama-4-scout mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b kimi-k2 deepseek-v3"}
done_specs=""
for s in $specs; do
    if [ $(el) -gt ${TUNE_UNTIL:-290} ]; then echo "tune $s: not started (deadline, $(el) s)" >> "$OUT/rc.txt"; continue; fi
    echo "== $s" >> "$OUT/tune.log"
    timeout 150 build/moegen tune examples/specs/$s.moe --tokens 1,8,64,128,512,2048,4096 --iters 10 \
        -o "$OUT/h200.tune" >> "$OUT/tune.log" 2>&1
    rc=$?; echo "tune $s: exit $rc at $(el) s" >> "$OUT/rc.txt"
    [ $rc -eq 0 ] && done_specs="$done_specs $s"
done
for s in $done_specs; do
    if [ $(el) -gt ${BENCH_UNTIL:-440} ]; then echo "bench $s: not started ($(el) s)" >> "$OUT/rc.txt"; continue; fi
    for t in shipped tuned; do
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=$OUT/h200.tune; fi
        echo "== $t $s" >> "$OUT/bench.log"
        MOEGEN_TUNING=$tab timeout 60 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
            --tokens 64 --tokens 512 --tokens 2048 --iters 10 >> "$OUT/bench.log" 2>&1
    done
    echo "bench $s: done at $(el) s" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $0}' "$OUT/bench.log" | head -80
