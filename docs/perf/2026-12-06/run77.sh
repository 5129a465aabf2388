#!/usr/bin/env bash
# Run 77 (twelfth session, 2026-12-06): the stream grid (main with a stage's loads issued together and two CTAs an
# SM at stages 2 or 3; run 76 had 4 stages, one CTA an SM, and was 1.2-2x slower than gemv), and the 1-token route per template
# line (PC sampling at every 32 cycles). Carry ["build/st"] (run 76's binaries + build/st/stream{2,3}.tune: the
# stream.tune entries with stages 2 and 3).
set -u
B=${1:-200}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/st/moegen build/moegen
# the stream kernels under test_gpu first (Qwen3 1..63 tokens, the EP8 rank 1..7), stages 2
MOEGEN_TUNING=build/st/stream2.tune timeout $((B * 20 / 100)) stdbuf -oL -eL build/st/test_gpu --tokens-max 64 \
    qwen3-30b-a3b deepseek-v3-ep8 > "$OUT/test_gpu_s2.log" 2>&1
echo "test_gpu s2: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
for s in qwen3-30b-a3b deepseek-v3-ep8 gpt-oss-20b; do
    for b in gemv s2 s3; do
        [ $SECONDS -gt $((B * 65 / 100)) ] && break 2
        echo "== $s $b" >> "$OUT/decode.log"
        case $b in gemv) unset MOEGEN_TUNING ;; s2) export MOEGEN_TUNING=build/st/stream2.tune ;; s3) export MOEGEN_TUNING=build/st/stream3.tune ;; esac
        timeout 30 build/st/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --iters 20 >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
mkdir -p /tmp/mc_li && chmod 700 /tmp/mc_li
if [ $SECONDS -lt $((B * 80 / 100)) ]; then
    MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 50 $NCU --set full --import-source yes --warp-sampling-interval 0 \
        -k 'regex:_route_' --launch-count 1 -o "$OUT/r1" build/st/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 \
        --iters 1 > "$OUT/ncu_route.log" 2>&1
    echo "ncu route: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    if [ -f "$OUT/r1.ncu-rep" ]; then
        timeout 30 $NCU --import "$OUT/r1.ncu-rep" --page source --csv --print-source sass > "$OUT/route1_sass.csv" 2>&1
        timeout 20 $NCU --import "$OUT/r1.ncu-rep" --print-details all > "$OUT/route1_details.log" 2>&1
        rm -f "$OUT/r1.ncu-rep"
        cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null
        gzip -9 "$OUT/route1_sass.csv" "$OUT/route1_details.log" "$OUT"/*.cubin
    fi
fi
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu_s2.log"; grep -m5 FAIL "$OUT/test_gpu_s2.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" gemm_up_swiglu gemm_down
