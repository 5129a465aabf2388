#!/usr/bin/env bash
# Run 79 (thirteenth session, 2026-12-06): (1) readramp: what one read-only kernel of N MB takes from a cold L2
# (the 1-token floor's realism), and the cost of a kernel boundary with and without a PDL L2 prefetch; (2) run 78's
# source-level ncu of the 1-token route and of the 2-stage stream kernels again (run 78's csvs did not come back:
# at most 8 files return, so everything here is packed into ncu.tar). Build: build/st as run78.sh, plus
# build/st/readramp (nvcc -O3 -arch=sm_90a docs/perf/2026-12-06/readramp.cu); carry ["build/st"].
set -u
mkdir -p "$OUT" /tmp/mc_li /tmp/nc && chmod 700 /tmp/mc_li
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/st/moegen build/moegen
timeout 120 build/st/readramp > "$OUT/readramp.log" 2>&1; echo "readramp: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # prof NAME KERNEL-REGEX [env...]
    local name=$1 re=$2; shift 2
    env "$@" MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 90 $NCU --set full --import-source yes \
        --warp-sampling-interval 0 -k "regex:$re" --launch-count 2 -o /tmp/nc/$name build/st/moe_bench \
        examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > /tmp/nc/ncu_$name.log 2>&1
    echo "ncu $name: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    [ -f /tmp/nc/$name.ncu-rep ] || return
    timeout 30 $NCU --import /tmp/nc/$name.ncu-rep --page source --csv --print-source sass > /tmp/nc/${name}_sass.csv 2>&1
    timeout 20 $NCU --import /tmp/nc/$name.ncu-rep --print-details all > /tmp/nc/${name}_details.log 2>&1
    rm -f /tmp/nc/$name.ncu-rep
}
prof route1 _route_
prof gemv1 _gemv_
prof stream2 _stream_ MOEGEN_TUNING=build/st/stream2.tune
cp /tmp/mc_li/*.cubin /tmp/nc/ 2>/dev/null
tar -C /tmp/nc -czf "$OUT/ncu.tar.gz" .
cat "$OUT/rc.txt" "$OUT/readramp.log"
