#!/usr/bin/env bash
# Run 59 (written 2026-12-05, seventh session; NOT run). Branch dgrad-up-pp (dgrad_up with 64-row blocks on the
# ping-pong grid, never run on a GPU): build it, put its moe_bench and test_bgemm_gpu at build/dp/, main's at
# build/. test_bgemm_gpu of the branch (its 64-row cases run the new dgrad_up), then the backward at 4096 tokens,
# Mixtral (64-row blocks) and Qwen3 (128-row: unchanged, a control), main against the branch. ~150 s.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v dp_test_bgemm_gpu 60 build/dp/test_bgemm_gpu; then
    for s in mixtral-8x7b qwen3-30b-a3b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        for b in build/moe_bench build/dp/moe_bench; do
            echo "== $s $b" >> "$OUT/backward.log"
            timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
            echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
fi
cat "$OUT/rc.txt"
echo "-- dp_test_bgemm_gpu: $(tail -n 1 $OUT/dp_test_bgemm_gpu.log)"; grep FAIL "$OUT/dp_test_bgemm_gpu.log" | head -5
grep -E '^== |^4096' "$OUT/backward.log" 2>/dev/null
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
