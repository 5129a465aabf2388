#!/usr/bin/env bash
# Run 48 (2026-12-05, sixth session; ran on an H100, build of 00acb73, logs in run48/): dgrad_down on the persistent grid (ping-pong for 64-row
# blocks: Mixtral; persist for 128-row blocks: Qwen3) and bwd_dwr over token splits (run 46's ncu: 273 us of
# Qwen3's 391 us router stage, 128 blocks each over all 4096 tokens), against the build before both
# (build/old/moe_bench, c483900: one CTA per tile, run 46's load-before-store epilogue, one token range), ~380 s:
#   - moe_bench --backward at 4096 tokens, Mixtral and Qwen3, old and new binaries, in turn
#   - test_bgemm_gpu (64-row and 128-row blocks, in place, clamp, geglu fp16 shared)
#   - test_bwd_gpu on the train_* specs, softcap and sqrtsoftplus, then its EP cases (the router step's dU scratch)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/old/moe_bench build/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 90 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v test_bgemm_gpu 60 build/tests/test_bgemm_gpu
v test_bwd_gpu_train 170 build/tests/test_bwd_gpu train_ softcap sqrtsoftplus
v test_bwd_gpu_ep 60 build/tests/test_bwd_gpu ep
cat "$OUT/rc.txt"
for f in test_bgemm_gpu test_bwd_gpu_train test_bwd_gpu_ep; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5
done
grep -E '^== |^4096' "$OUT/backward.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
