#!/usr/bin/env bash
# Run 78 (written in the twelfth session, 2026-12-06, NOT run: the session's device time went to refused starts).
# One call, ~300 s: (1) the stream grid as main has it after run 76 (a stage's loads issued together, at most two
# CTAs an SM) against gemv at 1..4 tokens, with 2, 3 and 4 stages; (2) Nsight Compute with source-level warp
# sampling on the 2-stage stream kernels and on the 1-token route (the cubin that ran comes back for
# docs/perf/2026-12-05/ncu_lines.py); (3) test_gpu under the 2-stage table. Build: main's moe_bench, test_gpu,
# moegen stripped into build/st, and build/st/stream{2,3}.tune (tests/tune/stream.tune with stages 2, 3:
# awk '{ if ($14=="stream") { $11=S } print }'); carry ["build/st"].
set -u
B=${1:-300}
mkdir -p "$OUT" /tmp/mc_li && chmod 700 /tmp/mc_li
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/st/moegen build/moegen
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for s in qwen3-30b-a3b deepseek-v3-ep8 gpt-oss-20b; do
    for b in gemv s2 s3 s4; do
        [ $SECONDS -gt $((B * 40 / 100)) ] && break 2
        echo "== $s $b" >> "$OUT/decode.log"
        case $b in
            gemv) unset MOEGEN_TUNING ;;
            s4) export MOEGEN_TUNING=tests/tune/stream.tune ;;
            *) export MOEGEN_TUNING=build/st/stream${b#s}.tune ;;
        esac
        timeout 30 build/st/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --iters 20 \
            >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
prof() {  # prof NAME KERNEL-REGEX [env...]: source-level profile of moe_bench qwen3 at 1 token, cubin back
    local name=$1 re=$2; shift 2
    env "$@" MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 60 $NCU --set full --import-source yes \
        --warp-sampling-interval 0 -k "regex:$re" --launch-count 2 -o "$OUT/$name" build/st/moe_bench \
        examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_$name.log" 2>&1
    echo "ncu $name: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    [ -f "$OUT/$name.ncu-rep" ] || return
    timeout 30 $NCU --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
    timeout 20 $NCU --import "$OUT/$name.ncu-rep" --print-details all > "$OUT/${name}_details.log" 2>&1
    rm -f "$OUT/$name.ncu-rep"
    gzip -9 "$OUT/${name}_sass.csv" "$OUT/${name}_details.log"
}
[ $SECONDS -lt $((B * 55 / 100)) ] && prof stream2 _stream_ MOEGEN_TUNING=build/st/stream2.tune
[ $SECONDS -lt $((B * 65 / 100)) ] && prof route1 _route_
cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null && gzip -9 "$OUT"/*.cubin
[ $SECONDS -lt $((B * 75 / 100)) ] && { MOEGEN_TEST_PROGRESS=1 MOEGEN_TUNING=build/st/stream2.tune timeout $((B - SECONDS - 10)) stdbuf -oL -eL \
    build/st/test_gpu --tokens-max 64 qwen3-30b-a3b deepseek-v3-ep8 gpt-oss-20b > "$OUT/test_gpu_s2.log" 2>&1;
    echo "test_gpu s2: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; }
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu_s2.log" 2>/dev/null; grep -m5 FAIL "$OUT/test_gpu_s2.log" 2>/dev/null
python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" gemm_up_swiglu gemm_down
