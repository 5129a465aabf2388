#!/usr/bin/env bash
# Run 105 (written in the sixteenth session, NOT run). bf16 GEMMs with bk 128 (two swizzle atoms a stage: each weight
# row read 256 bytes at a time instead of 128) — the tuning-table counterpart of boxramp's boxk128 mode (run104.sh).
# Build bk = main 99ac8e6 + patches/bf16_bk128.diff (the planner takes bk 128 for bf16; the template already ran it
# for fp8): its test_gpu under MOEGEN_TUNING=docs/perf/2026-12-06/bk128.tune on Mixtral and the EP8 rank (their
# first GPU run: correctness), then moe_bench --graph under the shipped table and under bk128.tune, interleaved, at
# 128..16384 tokens (same binary both ways).
# carry ["build/bk"] (stripped moegen, moe_bench, test_gpu)
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/bk/moegen build/moegen
T=docs/perf/2026-12-06/bk128.tune
MOEGEN_TUNING=$T timeout ${TGPU_S:-150} stdbuf -oL -eL build/bk/test_gpu mixtral-8x7b deepseek-v3-ep8 > "$OUT/test_gpu_bk128.log" 2>&1
echo "test_gpu bk128: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
for s in mixtral-8x7b deepseek-v3-ep8; do
    for b in shipped bk128; do
        echo "== $s $b" >> "$OUT/bench.log"
        if [ $b = bk128 ]; then export MOEGEN_TUNING=$T; else unset MOEGEN_TUNING; fi
        timeout 60 build/bk/moe_bench examples/specs/$s.moe --graph --tokens 128 --tokens 512 --tokens 2048 \
            --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
cat "$OUT/rc.txt"
grep -h "^test_gpu:" "$OUT/test_gpu_bk128.log"; grep -m5 FAIL "$OUT/test_gpu_bk128.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu gemm_down
gzip -9 "$OUT"/*.log
