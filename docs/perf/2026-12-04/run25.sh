#!/usr/bin/env bash
# Run 25: where the gemv grid stops paying: the layer under CUDA graphs under the shipped table and under
# tests/tune/gemv.tune at 16, 24, 32, 48 tokens for Qwen3-30B-A3B, then at 1, 2, 4, 8 for gpt-oss-20b and the
# DeepSeek-V3 EP8 rank (a deadline keeps the call short).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
b() { local s=$1; shift
    for t in shipped gemv; do
        if [ $(el) -gt 150 ]; then echo "$t $s: not started ($(el) s)" >> "$OUT/gemv_bench.log"; continue; fi
        echo "== $t $s" >> "$OUT/gemv_bench.log"
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=tests/tune/gemv.tune; fi
        MOEGEN_TUNING=$tab timeout 30 build/moe_bench examples/specs/$s.moe --graph "$@" --iters 20 >> "$OUT/gemv_bench.log" 2>&1
        echo "moe_bench $t $s: exit $? at $(el) s" >> "$OUT/gemv_bench.log"
    done; }
b qwen3-30b-a3b --tokens 16 --tokens 24 --tokens 32 --tokens 48
b gpt-oss-20b --tokens 1 --tokens 2 --tokens 4 --tokens 8
b deepseek-v3-ep8 --tokens 1 --tokens 2 --tokens 4 --tokens 8
awk '/^== /{b=$2" "$3} /LAYER graph|gemm_up|gemm_down|exit|not started/{print b, $0}' "$OUT/gemv_bench.log"
