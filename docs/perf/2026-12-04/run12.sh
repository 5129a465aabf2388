#!/usr/bin/env bash
# Run 12: the layer under CUDA graphs at 1 .. 2048 tokens with the variants, under the shipped table and under run 11's
# (tuned at 128, 512 and 2048 tokens), alternating per spec in one run; then the variant tests under run 11's table.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
T=docs/perf/2026-12-04/run11/h200.tune
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    for t in shipped run11; do
        echo "== $t $s" >> "$OUT/decode.log"
        if [ $t = shipped ]; then
            env -u MOEGEN_TUNING timeout 100 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
                --tokens 128 --tokens 256 --tokens 512 --tokens 1024 --tokens 2048 --iters 30 >> "$OUT/decode.log" 2>&1
        else
            MOEGEN_TUNING=$T timeout 100 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
                --tokens 128 --tokens 256 --tokens 512 --tokens 1024 --tokens 2048 --iters 30 >> "$OUT/decode.log" 2>&1
        fi
        echo "bench $t $s: exit $?" >> "$OUT/rc.txt"
    done
done
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $1, $4, $NF}' "$OUT/decode.log"
MOEGEN_TUNING=$T timeout 240 build/tests/test_gpu mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b > "$OUT/test_gpu_run11_table.log" 2>&1
echo "test_gpu (the three specs) under run 11's table: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -1 "$OUT/test_gpu_run11_table.log"
