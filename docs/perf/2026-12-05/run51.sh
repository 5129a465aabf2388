#!/usr/bin/env bash
# Run 51 (2026-12-05, seventh session): run 49 and run 50 in one call, ~330 s.
#   main (1ee9c24): test_bwd_gpu on four train specs (the dwr_part region: run 48's NaN dU read-backs)
#   branch wgrad-pingpong (810a29b, rebased on 1ee9c24; its binaries at build/pp/): test_bgemm_gpu (every wgrad
#     case), then moe_bench --backward at 4096 tokens, Mixtral and Qwen3, main's build against the branch's
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v main_test_bwd_gpu_train 130 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
v pp_test_bgemm_gpu 60 build/pp/test_bgemm_gpu
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/moe_bench build/pp/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
for f in main_test_bwd_gpu_train pp_test_bgemm_gpu; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5
done
grep -vE '^plan' "$OUT/backward.log" | head -80
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
