#!/usr/bin/env bash
# Run 53 (2026-12-05, seventh session): the wgrads in CTA pairs (branch wgrad-mc: clusters of 2 along M, B's
# boxes loaded once by TMA multicast; run 52's Nsight Compute put main's wgrad_up at 80 % of L2 throughput,
# tensor pipes 64 % busy). build/mc = the branch, build/base = main 1ee9c24, build/pc = branch wgrad-persist.
#   - test_bgemm_gpu (every wgrad case, odd M-tile counts included); stop here if it fails
#   - moe_bench --backward at 4096 tokens, Mixtral and Qwen3: base, mc, pc
#   - test_bwd_gpu on four train specs; memcheck of test_bgemm_gpu
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v mc_test_bgemm_gpu 60 build/mc/test_bgemm_gpu; then
    for s in mixtral-8x7b qwen3-30b-a3b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        for b in build/base/moe_bench build/mc/moe_bench build/pc/moe_bench; do
            echo "== $s $b" >> "$OUT/backward.log"
            timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
            echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
    v mc_test_bwd_gpu_train 130 build/mc/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
    v mc_memcheck_bgemm 100 compute-sanitizer --tool memcheck --error-exitcode 3 build/mc/test_bgemm_gpu
fi
cat "$OUT/rc.txt"
for f in mc_test_bgemm_gpu mc_test_bwd_gpu_train mc_memcheck_bgemm; do
    [ -f $OUT/$f.log ] && { echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5; }
done
grep -E '^== |^4096' "$OUT/backward.log" 2>/dev/null
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
