#!/usr/bin/env bash
# Run 76 (twelfth session, 2026-12-06): the gemv "stream" grid (#16) on the GPU. Build st = main c98197b's
# moe_bench, test_gpu, moegen (stripped; carry ["build/st"]); the A/B is the same binary under the embedded
# table (the shipped gemv) and MOEGEN_TUNING=tests/tune/stream.tune (stream at 1..7 tokens; Qwen3 1..63).
# Steps are skipped once the call has run past their share of the budget B (seconds).
set -u
B=${1:-420}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt"
cp build/st/moegen build/moegen
# 1. correctness: test_gpu under stream.tune on the decode specs (calls of at most 64 tokens)
MOEGEN_TUNING=tests/tune/stream.tune timeout $((B * 30 / 100)) stdbuf -oL -eL build/st/test_gpu --tokens-max 64 \
    qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8 > "$OUT/test_gpu_stream.log" 2>&1
echo "test_gpu stream: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
# 2. decode A/B: gemv (embedded table) vs stream, graph replay, 1..8 tokens (Qwen3 to 64)
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b gpt-oss-20b; do
    toks="--tokens 1 --tokens 2 --tokens 4 --tokens 8"
    [ $s = qwen3-30b-a3b ] && toks="$toks --tokens 16 --tokens 64"
    for b in gemv stream; do
        [ $SECONDS -gt $((B * 80 / 100)) ] && break 2
        echo "== $s $b" >> "$OUT/decode.log"
        if [ $b = stream ]; then export MOEGEN_TUNING=tests/tune/stream.tune; else unset MOEGEN_TUNING; fi
        timeout 40 build/st/moe_bench examples/specs/$s.moe --graph $toks --iters 20 >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
# 3a. the 1-token route per template line: PC sampling every 32 cycles, line tables, the cubin that ran
if [ $SECONDS -lt $((B * 84 / 100)) ]; then
    mkdir -p /tmp/mc_li && chmod 700 /tmp/mc_li
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 60 $NCU --set full --import-source yes --sampling-interval 0 \
        -k 'regex:_route_' --launch-count 2 -o "$OUT/r1" build/st/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 \
        --iters 1 > "$OUT/ncu_route.log" 2>&1
    echo "ncu route: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    if [ -f "$OUT/r1.ncu-rep" ]; then
        timeout 40 $NCU --import "$OUT/r1.ncu-rep" --page source --csv --print-source sass > "$OUT/route1_sass.csv" 2>&1
        rm -f "$OUT/r1.ncu-rep"
        cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null
        gzip -9 "$OUT/route1_sass.csv" "$OUT"/*.cubin
    fi
fi
# 3. Nsight Compute on the stream kernels, Qwen3 at 1 token
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ $SECONDS -lt $((B * 88 / 100)) ]; then
    MOEGEN_TUNING=tests/tune/stream.tune timeout $((B - SECONDS - 5)) $NCU --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis -k 'regex:_stream_' --launch-count 2 \
        build/st/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_stream.log" 2>&1
    echo "ncu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
fi
cat "$OUT/rc.txt"
tail -n 3 "$OUT/test_gpu_stream.log"; grep -m8 FAIL "$OUT/test_gpu_stream.log"
[ -f "$OUT/decode.log" ] && python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" gemm_up_swiglu gemm_down
grep -E "Duration|DRAM Throughput|Achieved Occupancy|^  [a-z]" "$OUT/ncu_stream.log" 2>/dev/null | head -20
