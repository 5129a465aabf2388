#!/usr/bin/env bash
# Run 45 (written 2026-12-05, fifth session, after its device time ran out; its A/B and ncu ran inside run 46). Run 44's backward breakdown
# (H100, 4096 tokens) puts 0.38-0.40 ms in the "router" stage for both Mixtral (E 8) and Qwen3 (E 128), 14 % of
# Qwen3's backward; its likely cost is bwd_dwr's serial chain of 32-token chunks (64 and 128 blocks, each over all
# 4096 tokens). The A/B: the same backward with the kernel's chunk at 128 tokens (TT = 128: the same sums in the
# same order; test_bwd_host holds it bit for bit), through moe_bench --templates, then Nsight Compute of the
# router stage's kernels (bwd_router, bwd_dx, bwd_dwr) to confirm which one it is. ~150 s.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
rm -rf /tmp/tpl128 && cp -r templates /tmp/tpl128
sed -i 's/BE = ${p.dwr_experts}, TT = 32;/BE = ${p.dwr_experts}, TT = 128;/' /tmp/tpl128/bwd.lua
grep -c 'TT = 128;' /tmp/tpl128/bwd.lua > "$OUT/tpl128_check.txt"
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for t in embedded /tmp/tpl128; do
        extra=(); [ "$t" != embedded ] && extra=(--templates "$t")
        echo "== $s $t" >> "$OUT/backward.log"
        timeout 90 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 "${extra[@]}" \
            >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $t: exit $?" >> "$OUT/rc.txt"
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 120 $NCU --clock-control none --section SpeedOfLight --section LaunchStats -k 'regex:bwd_(router|dx|dwr)' \
    --launch-count 6 build/moe_bench /tmp/train_qwen3-30b-a3b.moe --backward --tokens 4096 --iters 1 \
    > "$OUT/ncu_router_stage.log" 2>&1; echo "ncu: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt" "$OUT/tpl128_check.txt"
grep -E '^== |bwd ms|^4096' "$OUT/backward.log"
grep -E '^  [a-z_0-9]+.*\(|Duration|Grid Size' "$OUT/ncu_router_stage.log" | head -30
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
