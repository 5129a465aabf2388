#!/usr/bin/env bash
# Run 56 (2026-12-05, seventh session): run 54 again with bk 64 x 3 stages and the fp32 tile staged in two passes of 128 columns (64 KB; branch wgrad-tma `HEAD`); run 55: run 54's bk-32 ring cost tensor-pipe time (64 -> 56 %) while TMA's stores took L2 from 80 to 58 %. Was: (branch wgrad-tma:
# persistent, both warpgroups on each 128x256 tile, bk 32 x 4 stages, the output tile staged in shared memory
# in the 128-byte swizzle and written by cp.async.bulk.tensor (beta 1: TMA's fp32 reduce-add) while the next
# tile's main loop runs). build/tm = the branch, build/base = main 1ee9c24, build/pc = branch wgrad-persist.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v tm2_test_bgemm_gpu 60 build/tm2/test_bgemm_gpu; then
    for s in mixtral-8x7b qwen3-30b-a3b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        for b in build/base/moe_bench build/tm2/moe_bench; do
            echo "== $s $b" >> "$OUT/backward.log"
            timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
            echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
fi
cat "$OUT/rc.txt"
for f in tm2_test_bgemm_gpu tm2_test_bwd_gpu_train; do
    [ -f $OUT/$f.log ] && { echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5; }
done
grep -E '^== |^4096' "$OUT/backward.log" 2>/dev/null
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
