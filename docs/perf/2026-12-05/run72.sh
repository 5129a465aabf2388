#!/usr/bin/env bash
# Run 72 (written in the tenth session, 2026-12-05, NOT run: the session's device time ran out in refused starts).
# One call, ~150 s: where the 1-token route's cycles go, per template line. Run 71's source csv could not be mapped
# to lines: its per-instruction addresses are of the device's NVRTC build, and a local nvdisasm of a local compile
# differs. So this profiles main's route with MOEGEN_LINEINFO=on and brings back the very cubin it ran (from the
# private JIT cache), for `nvdisasm -g -c` here: address -> templates/route.lua line, then the csv's samples and
# executed counts per line (PC sampling every 32 cycles, three launches).
# Carry: ["build/cur"] (main's moe_bench, stripped: mkdir -p build/cur && cp build/moe_bench build/cur/ &&
# strip --strip-debug build/cur/moe_bench).
set -u
mkdir -p "$OUT" /tmp/mc_li && chmod 700 /tmp/mc_li
export MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on NCCL_NVLS_ENABLE=0
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 120 $NCU --set full --import-source yes --sampling-interval 0 -k 'regex:_route_' --launch-count 3 \
    -o "$OUT/r" build/cur/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_run.log" 2>&1
echo "ncu exit $?"
timeout 40 $NCU --import "$OUT/r.ncu-rep" --page source --csv --print-source sass > "$OUT/route1_sass.csv" 2>&1
timeout 40 $NCU --import "$OUT/r.ncu-rep" --print-details all > "$OUT/route1_details.log" 2>&1
grep -E "Duration|SM Active Cycles|Elapsed Cycles  " "$OUT/route1_details.log" | head -12
rm -f "$OUT/r.ncu-rep"
cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null
gzip -9 "$OUT/route1_sass.csv" "$OUT/route1_details.log" "$OUT"/*.cubin
ls -la "$OUT"
