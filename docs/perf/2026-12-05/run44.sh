#!/usr/bin/env bash
# Run 44 (2026-12-05, fifth session): run 43's three failures again after their test fixes (test_gpu's swiglu
# case gave every row the shared slot's activation; test_vendored_own's size loop routed its reference on the
# first call's router_x), then run 41's backward breakdown (moe_bench --backward at 4096 tokens, Mixtral and
# Qwen3). ~200 s (the fp8 comparison of run 41 left out: 437 s of device time were left). Ran: README.md here.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout 200 "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_gpu_clamp_after build/tests/test_gpu clamp_after; v test_gpu_shared_unclamped build/tests/test_gpu shared_unclamped; } &
{ v test_vendored_own build/tests/test_vendored_own tests/specs/router_own_input.moe; } &
wait
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    timeout 60 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in "$OUT"/test_*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): ' $f | tail -1)"; done
grep -h FAIL "$OUT"/test_*.log | head -10
grep -vE '^(plan|gemms)' "$OUT/backward.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
