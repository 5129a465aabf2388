#!/usr/bin/env bash
# Run 108 (eighteenth session): run107.sh (the chain with one counter of CTAs done, main 22a5283's code, from
# build/r107, with Nsight Compute of the chained kernel) and then run105.sh (bf16 GEMMs with bk 128, build/bk) in one
# call, each into its own folder of $OUT, tarred (at most 8 files come back).
# carry ["build/r107", "build/bk"]
set -u
O=$OUT
mkdir -p "$O/r107" "$O/r105"
OUT=$O/r107 TGPU_SPECS="qwen3-30b-a3b gpt-oss-20b mixtral-8x7b" TGPU_S=75 SPECS="qwen3-30b-a3b gpt-oss-20b" \
    BUILDS="shipped chain chain3 stream2" bash docs/perf/2026-12-06/run107.sh
# Nsight Compute of the shipped gemv up and down GEMMs at 1 Qwen3 token (their DRAM throughput and stalls: the
# 9 us they take beyond a plain read of the same weights)
NCUB=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 100 $NCUB --clock-control none --set full -k regex:sm90a_gemv --launch-skip 4 --launch-count 2 \
    build/r107/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$O/r107/ncu_gemv.log" 2>&1
echo "ncu gemv: exit $? ($SECONDS s)" >> "$O/r107/rc.txt"
grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|No Eligible|Warp Cycles Per Issued' \
    "$O/r107/ncu_gemv.log" | head -16
# the route kernel at 1 Qwen3 token, instruction by instruction (SASS with its warp-stall samples: where the
# last block's ~14 k cycles of tail go), then its usual sections
timeout 60 $NCUB --clock-control none --section SourceCounters --section WarpStateStats -k regex:route \
    --launch-skip 2 --launch-count 1 --page source --print-source sass --csv \
    build/r107/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$O/r107/ncu_route_sass.log" 2>&1
echo "ncu route sass: exit $? ($SECONDS s)" >> "$O/r107/rc.txt"
head -c 600 "$O/r107/ncu_route_sass.log"; echo
OUT=$O/r105 TGPU_S=100 bash docs/perf/2026-12-06/run105.sh
cd "$O" && tar czf r107.tgz r107 && tar czf r105.tgz r105 && rm -rf r107 r105
