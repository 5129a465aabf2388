#!/usr/bin/env bash
# Run 45 (2026-12-05, fifth session): d router_w's kernel in chunks of 128 tokens (was 32: run 44's router
# stage, 0.38-0.40 ms at 4096 tokens, is mostly its serial chain of chunks): test_bwd_gpu on the specs whose
# dwr reads router_x (train_own_input), the ones column (train_gptoss, logit_bias) and the shared gate's row
# (train_shared), then the backward's stage breakdown at 4096 tokens, Mixtral and Qwen3, as run 44. ~120 s.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout 90 "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_bwd_gpu_own build/tests/test_bwd_gpu train_own_input; } &
{ v test_bwd_gpu_gptoss build/tests/test_bwd_gpu train_gptoss; v test_bwd_gpu_shared build/tests/test_bwd_gpu train_shared; } &
wait
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    timeout 60 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in "$OUT"/test_*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): ' $f | tail -1)"; done
grep -h FAIL "$OUT"/test_*.log | head -10
grep -E 'bwd ms|^4096' "$OUT/backward.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
