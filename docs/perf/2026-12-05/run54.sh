#!/usr/bin/env bash
# Run 54 (2026-12-05, seventh session): the wgrads with their fp32 tile stored by TMA (branch wgrad-tma:
# persistent, both warpgroups on each 128x256 tile, bk 32 x 4 stages, the output tile staged in shared memory
# in the 128-byte swizzle and written by cp.async.bulk.tensor (beta 1: TMA's fp32 reduce-add) while the next
# tile's main loop runs). build/tm = the branch, build/base = main 1ee9c24, build/pc = branch wgrad-persist.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v tm_test_bgemm_gpu 60 build/tm/test_bgemm_gpu; then
    for s in mixtral-8x7b qwen3-30b-a3b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        for b in build/base/moe_bench build/tm/moe_bench; do
            echo "== $s $b" >> "$OUT/backward.log"
            timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
            echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
    v tm_test_bwd_gpu_train 130 build/tm/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
fi
cat "$OUT/rc.txt"
for f in tm_test_bgemm_gpu tm_test_bwd_gpu_train; do
    [ -f $OUT/$f.log ] && { echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5; }
done
grep -E '^== |^4096' "$OUT/backward.log" 2>/dev/null
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
