#!/usr/bin/env bash
# Run 85: source-level Nsight Compute of Qwen3's route at 64 and at 512 tokens (27-28 us on the H200 in run 84,
# against 14-16 at 1-8), for the next look at the route; everything packed into ncu85.tar.gz with the cubin.
# Build: build/rc (main's moe_bench, moegen); carry ["build/rc"].
set -u
mkdir -p "$OUT" /tmp/mc_li /tmp/nc && chmod 700 /tmp/mc_li
cp build/rc/moegen build/moegen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/nc/gpu.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for T in 64 512; do
    MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 90 $NCU --set full --import-source yes \
        --warp-sampling-interval 0 -k "regex:_route_" --launch-count 1 -o /tmp/nc/route$T build/rc/moe_bench \
        examples/specs/qwen3-30b-a3b.moe --tokens $T --iters 1 > /tmp/nc/ncu_route$T.log 2>&1
    echo "ncu route$T: exit $? ($SECONDS s)" >> /tmp/nc/rc.txt
    timeout 30 $NCU --import /tmp/nc/route$T.ncu-rep --page source --csv --print-source sass > /tmp/nc/route${T}_sass.csv 2>&1
    timeout 20 $NCU --import /tmp/nc/route$T.ncu-rep --print-details all > /tmp/nc/route${T}_details.log 2>&1
    rm -f /tmp/nc/route$T.ncu-rep
done
cp /tmp/mc_li/*.cubin /tmp/nc/ 2>/dev/null
tar -C /tmp/nc -czf "$OUT/ncu85.tar.gz" .
cat /tmp/nc/rc.txt
