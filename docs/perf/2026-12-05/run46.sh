#!/usr/bin/env bash
# Run 46 (2026-12-05, sixth session; ran on an H200, build of 3a6ff30, logs in run46/). The sm_90a dgrad_down epilogue issued each U load right before the dU
# store that follows it (du may alias u, so nothing could be hoisted): 64 serialized global round trips per
# thread per tile, the likely cause of dgrad_down's 253 TFLOP/s (run 44, H100) against dgrad_up's 555. The
# build's templates issue a chunk of 8 n8 blocks' loads before the chunk's stores; and the wgrads walk their
# tiles with the smaller of M and N fastest (Mixtral's wgrad_down: 397 TFLOP/s against wgrad_up's 535 walked
# N = F fastest, its CTAs in flight sharing all 29 MB of A's k tiles). In one call:
#   - moe_bench --backward at 4096 tokens, Mixtral and Qwen3, three template sets: the build's (new epilogue),
#     build/tpl_old (2479786, before both), and the build's with bwd_dwr's chunk at 128 tokens
#     (run 45's A/B: TT = 128, the same sums in the same order)
#   - test_bgemm_gpu and test_bwd_gpu (whole) on the build: the new epilogue against the CPU reference
#   - Nsight Compute of the router stage's kernels (run 45's), shortened
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
rm -rf /tmp/tpl128 && cp -r templates /tmp/tpl128
sed -i 's/BE = ${p.dwr_experts}, TT = 32;/BE = ${p.dwr_experts}, TT = 128;/' /tmp/tpl128/bwd.lua
{ grep -c 'TT = 128;' /tmp/tpl128/bwd.lua; grep -c 'constexpr int DJ = 8;' build/tpl_old/templates/gemm_sm90.lua; } \
    > "$OUT/tpl_check.txt"
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for t in embedded build/tpl_old/templates /tmp/tpl128; do
        extra=(); [ "$t" != embedded ] && extra=(--templates "$t")
        echo "== $s $t" >> "$OUT/backward.log"
        timeout 90 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 "${extra[@]}" \
            >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $t: exit $?" >> "$OUT/rc.txt"
    done
done
timeout 60 build/tests/test_bgemm_gpu > "$OUT/test_bgemm_gpu.log" 2>&1; echo "test_bgemm_gpu: exit $?" >> "$OUT/rc.txt"
timeout 240 build/tests/test_bwd_gpu > "$OUT/test_bwd_gpu.log" 2>&1; echo "test_bwd_gpu: exit $?" >> "$OUT/rc.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 80 $NCU --clock-control none --section SpeedOfLight --section LaunchStats -k 'regex:bwd_(router|dx|dwr)' \
    --launch-count 3 build/moe_bench /tmp/train_qwen3-30b-a3b.moe --backward --tokens 4096 --iters 1 \
    > "$OUT/ncu_router_stage.log" 2>&1; echo "ncu: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt" "$OUT/tpl_check.txt"
tail -1 "$OUT/test_bgemm_gpu.log"; grep FAIL "$OUT/test_bgemm_gpu.log" | head -5
tail -1 "$OUT/test_bwd_gpu.log"; grep FAIL "$OUT/test_bwd_gpu.log" | head -5
grep -E '^== |^4096' "$OUT/backward.log"
grep -E '^  [a-z_0-9]+.*\(|Duration|Grid Size|Memory Throughput|Compute \(SM\)' "$OUT/ncu_router_stage.log" | head -30
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
