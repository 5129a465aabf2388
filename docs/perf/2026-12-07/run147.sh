#!/usr/bin/env bash
# Run 147 (twenty-sixth session; NOT run, no machine; run148.sh carries its ncu step): why the CTA-pair GEMMs (+mc) ran ~2x slower in run 146 (correct: test_gpu
# 2353/0 + 12658/0 under tests/tune/pairs.tune before their time limits, test_vendored_pairs 100/0).
# r147 = main with moe_plan_info.pair_clusters (moe_bench prints the resident pairs the driver reported).
# (1) moe_bench on Mixtral at 4096 tokens under mc.tune; (2) Nsight Compute (LaunchStats, Occupancy,
# SpeedOfLight) of the first up GEMM launch at 4096 tokens under mc.tune and under the shipped table.
# Carry ["build/r147"].
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r147
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MC=$PWD/docs/perf/2026-12-07/mc.tune
MOEGEN_TUNING=$MC timeout 60 $B/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 5 > "$OUT/w/bench.log" 2>&1
echo "bench: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for tab in mc base; do
    if [ $tab = mc ]; then tt=$MC; else tt=$PWD/tuning/h200.tune; fi
    MOEGEN_TUNING=$tt timeout 150 ncu --kernel-name regex:gemm_up_swiglu --launch-count 1 --section LaunchStats \
        --section Occupancy --section SpeedOfLight --section WarpStateStats --metrics \
        sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_elapsed.max,launch__cluster_dim_x,launch__grid_size $B/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 \
        --iters 1 > "$OUT/w/ncu_$tab.log" 2>&1
    echo "ncu $tab: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
grep -E "CTA pairs|^4096 +(gemm|LAYER)" "$OUT/w/bench.log"
for tab in mc base; do echo "== $tab"; grep -E "gemm_up|Cluster|Grid Size|Waves|Occupancy|Active|Duration|SM Busy|Compute \(SM\)|Memory Throughput|Stall|Warp Cycles|sm__|launch__" "$OUT/w/ncu_$tab.log" | head -50; done
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
