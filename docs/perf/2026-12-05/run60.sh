#!/usr/bin/env bash
# Run 60 (written 2026-12-05, seventh session; NOT run). Nsight Compute of Qwen3's backward router stage on
# main (0.30 ms of a 2.38 ms backward on the H100, run 56): bwd_dwr (phase 0 over 16 token splits, then phase 1)
# and bwd_dx, to see what bounds each (bwd_dwr is a fp32 CUDA-core product of 2 GFLOP; bwd_dx reads 134 MB of
# row gradients). ~90 s.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
{ cat examples/specs/qwen3-30b-a3b.moe; echo "training = true"; } > /tmp/train_qwen3.moe
timeout 80 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section LaunchStats --section Occupancy -k 'regex:bwd_dwr|bwd_dx' --launch-count 3 \
    build/moe_bench /tmp/train_qwen3.moe --backward --tokens 4096 --iters 1 > "$OUT/ncu_qwen3_router.log" 2>&1
echo "ncu: exit $?"
grep -E 'bwd_dwr|bwd_dx|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache|Compute \(SM\)|Grid Size|Achieved Occupancy|Registers Per' \
    "$OUT/ncu_qwen3_router.log" | head -40
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
