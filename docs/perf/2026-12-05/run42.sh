#!/usr/bin/env bash
# Run 42 (written 2026-12-05, NOT run yet): Nsight Compute of the decode kernels that keep #16's targets out of
# reach, on main after run 37's fix (no route prefetch), ~250 s:
#   - Qwen3 at 1 token: route (15 us of a 51 us layer whose floor is 18), the gemv up / down GEMMs (2133 / 1830 GB/s
#     against a 4200 GB/s copy), combine (4.5 us)
#   - Qwen3's route at 64 tokens (27 us against Mixtral's 19: E = 128 columns)
#   - Mixtral's up GEMM at 512 tokens (the ping-pong tile at ~2840 GB/s and ~50 % of the dense rate: the layer
#     1.49x its floor)
# --clock-control none (the GPU's own clocks, as moe_bench sees them); the full set, so memory throughput,
# occupancy, warp stall reasons and the L2 hit rates are all there.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# moe_bench's first call per token count compiles nothing (cache) but runs warm-ups: skip them
timeout 90 $NCU --clock-control none --set full -k 'regex:route|gemv|combine' --launch-skip 12 --launch-count 4 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_qwen3_1tok.log" 2>&1
echo "ncu qwen3 1 token: exit $?" >> "$OUT/rc.txt"
timeout 60 $NCU --clock-control none --set full -k 'regex:route' --launch-skip 3 --launch-count 1 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 64 --iters 1 > "$OUT/ncu_qwen3_route64.log" 2>&1
echo "ncu qwen3 route 64: exit $?" >> "$OUT/rc.txt"
timeout 90 $NCU --clock-control none --set full -k 'regex:gemm_up' --launch-skip 3 --launch-count 1 \
    build/moe_bench examples/specs/mixtral-8x7b.moe --tokens 512 --iters 1 > "$OUT/ncu_mixtral_up512.log" 2>&1
echo "ncu mixtral up 512: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
for f in "$OUT"/ncu_*.log; do
    echo "== $(basename $f)"
    grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Registers Per|Achieved Occupancy|Grid Size|Compute \(SM\) Throughput|Warp Cycles Per Issued|Stall' "$f" | head -50
done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
