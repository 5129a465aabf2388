#!/usr/bin/env bash
# Run 63 (2026-12-05, eighth session), ~450 s. Main be838d3 (the builds of run 62):
#   - the backward against torch autograd (gpu_session.sh backward's commands; Mixtral, Qwen3, the EP8 rank at
#     4096 and 16384 tokens): moe_bench --backward and compare_torch.py --backward in the same call
#   - Nsight Compute of the fp8 Mixtral up GEMM (persistent, two consumers) at 4096 tokens: stall reasons, and
#     the per-instruction samples (source page, SASS) to see what its per-tile overhead is
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --section WarpStateStats --section SourceCounters --import-source no \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    -k 'regex:gemm_up' --launch-count 1 -o "$OUT/fp8up" build/moe_bench examples/specs/fp8/mixtral-8x7b-fp8.moe \
    --tokens 4096 --iters 1 > "$OUT/ncu_fp8up_run.log" 2>&1
echo "ncu: exit $?" >> "$OUT/rc.txt"
timeout 60 $NCU --import "$OUT/fp8up.ncu-rep" --print-details all > "$OUT/ncu_fp8up.log" 2>&1
timeout 60 $NCU --import "$OUT/fp8up.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_fp8up_sass.csv" 2>&1
echo "ncu import: exit $?" >> "$OUT/rc.txt"
rm -f "$OUT/fp8up.ncu-rep"
for s in mixtral-8x7b qwen3-30b-a3b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    timeout 100 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $s: exit $?" >> "$OUT/rc.txt"
    timeout 120 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/backward.log" 2>&1
    echo "compare backward $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
grep -E 'stalled.*ratio' "$OUT/ncu_fp8up.log" | sort -k3 -n -r | head -12
grep -vE '^(plan|gemms)' "$OUT/backward.log" | grep -vE 'recompute_u|dys|bias_grads' | head -80
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt|csv)$'))
