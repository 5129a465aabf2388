#!/usr/bin/env bash
# Run 13: run 11's tuned table against run13.tune (run 11's with the 512 bucket of Mixtral and the DeepSeek-V3 EP8 rank
# on the ping-pong tiles main ran there before the variants, and Qwen3's first bucket at 1 token on the shipped
# 64 x 128 tile), the layer under CUDA graphs, A B A B in one run.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
for rep in 1 2; do
    for t in run11/h200 run13; do
        for s in mixtral-8x7b deepseek-v3-ep8; do
            echo "== $t $s" >> "$OUT/decode.log"
            MOEGEN_TUNING=docs/perf/2026-12-04/$t.tune timeout 60 build/moe_bench examples/specs/$s.moe --graph --tokens 256 \
                --tokens 512 --tokens 1024 --iters 30 >> "$OUT/decode.log" 2>&1
        done
        echo "== $t qwen3-30b-a3b" >> "$OUT/decode.log"
        MOEGEN_TUNING=docs/perf/2026-12-04/$t.tune timeout 60 build/moe_bench examples/specs/qwen3-30b-a3b.moe --graph \
            --tokens 1 --tokens 4 --tokens 8 --tokens 64 --iters 30 >> "$OUT/decode.log" 2>&1
    done
done
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $1, $4, $NF}' "$OUT/decode.log"
