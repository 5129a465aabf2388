#!/usr/bin/env bash
# Run 101 (sixteenth session). Main 4d16cb0 (the gathering cp.async with .L2::256B, MOEGEN_GATHER=auto's rule
# T*k'*2F <= 2^19*E'): GPU tests of the gathered up GEMM under =on and auto, the vendored build both ways, then
# moe_bench --graph off vs auto at 512..16384 tokens on four specs (auto's picks timed against no gathering).
# carry ["build/r101"] (stripped moegen, moe_bench, test_gpu, test_vendored at 4d16cb0)
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/r101/moegen build/moegen
MOEGEN_GATHER=on timeout 240 stdbuf -oL -eL build/r101/test_gpu qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 \
    gpt-oss-120b > "$OUT/test_gpu_on.log" 2>&1
echo "test_gpu on: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_on.log") gathering calls" >> "$OUT/rc.txt"
timeout 120 stdbuf -oL -eL build/r101/test_gpu qwen3-30b-a3b gpt-oss-20b > "$OUT/test_gpu_auto.log" 2>&1
echo "test_gpu auto: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_auto.log") gathering calls" >> "$OUT/rc.txt"
for m in on auto; do
    MOEGEN_GATHER=$m timeout 40 build/r101/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/test_vendored_$m.log" 2>&1
    echo "test_vendored $m: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
for s in qwen3-30b-a3b deepseek-v3-ep8 gpt-oss-120b mixtral-8x7b; do
    for m in off auto; do
        echo "== $s $m" >> "$OUT/bench.log"
        MOEGEN_GATHER=$m timeout 45 build/r101/moe_bench examples/specs/$s.moe --graph --tokens 512 --tokens 2048 \
            --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $m: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
grep -h "^test_gpu:\|^test_vendored:" "$OUT"/test_*.log
grep -h -m3 FAIL "$OUT"/test_*.log
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu permute_scatter
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
