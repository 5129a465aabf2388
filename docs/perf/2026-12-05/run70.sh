#!/usr/bin/env bash
# Run 70 (ninth session): Nsight Compute of Qwen3's backward router-stage kernels (bwd_router, bwd_dx, bwd_dwr) and
# bwd_dys at 16384 tokens, main's build (build/moe_bench, 27cfea5). What bounds each? ~150 s.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
{ cat examples/specs/qwen3-30b-a3b.moe; echo "training = true"; } > /tmp/train_qwen3.moe
timeout 150 $NCU --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis \
    -k 'regex:bwd_(router|dx|dwr|dys)' --launch-count 6 \
    build/moe_bench /tmp/train_qwen3.moe --backward --tokens 16384 --iters 1 > "$OUT/ncu_qwen3_bwd.log" 2>&1
echo "ncu: exit $?"
grep -E '^  [a-z].*\(|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Grid Size|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A' \
    "$OUT/ncu_qwen3_bwd.log" | head -90
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
