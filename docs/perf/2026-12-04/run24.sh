#!/usr/bin/env bash
# Run 24: main after merging h/gemv (first GPU run of the gemv grid): test_gpu's cases under tests/tune/gemv.tune and
# test_vendored_gemv side by side, then the layer under CUDA graphs at 1, 2, 4, 8, 16, 64 tokens under the shipped
# table and under gemv.tune (every bucket gemv) for Qwen3-30B-A3B and Mixtral, one after the other.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
MOEGEN_TUNING=tests/tune/gemv.tune timeout 110 build/tests/test_gpu gemv.tune > "$OUT/test_gpu_gemv.log" 2>&1 &
timeout 60 build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe > "$OUT/test_vendored_gemv.log" 2>&1 &
wait
for f in test_gpu_gemv test_vendored_gemv; do echo "== $f: $(grep -E '^test_[a-z_]+: [0-9]+ passed' $OUT/$f.log | tail -1)"; grep FAIL $OUT/$f.log | head -5; done
for s in qwen3-30b-a3b mixtral-8x7b; do
    for t in shipped gemv; do
        echo "== $t $s" >> "$OUT/gemv_bench.log"
        if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=tests/tune/gemv.tune; fi
        MOEGEN_TUNING=$tab timeout 30 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 \
            --tokens 4 --tokens 8 --tokens 16 --tokens 64 --iters 20 >> "$OUT/gemv_bench.log" 2>&1
        echo "moe_bench $t $s: exit $?" >> "$OUT/gemv_bench.log"
    done
done
awk '/^== /{b=$2" "$3} /LAYER graph|gemm_up|gemm_down/{print b, $0}' "$OUT/gemv_bench.log" | head -80
