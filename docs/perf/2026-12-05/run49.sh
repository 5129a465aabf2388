#!/usr/bin/env bash
# Run 49 (2026-12-05, sixth session; NOT run: no device time left): the backward checked again after
# run 48's two changes (bwd_dwr's partials in their own dwr_part region, so test_bwd_gpu's dU read-back is dU;
# dgrad_down with 128-row blocks back on the tile grid), and timed against build/old/moe_bench (c483900), ~200 s
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v test_bwd_gpu_train 130 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/old/moe_bench build/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
echo "-- $(tail -n 1 $OUT/test_bwd_gpu_train.log)"; grep -E "FAIL" "$OUT/test_bwd_gpu_train.log" | head -5
grep -E '^== |^4096' "$OUT/backward.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
