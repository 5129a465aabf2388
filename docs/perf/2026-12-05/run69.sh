#!/usr/bin/env bash
# Run 69 (ninth session, 2026-12-05). Builds carried: build/moe_bench (main 27cfea5, code as 819257a),
# build/alt/{moe_bench,test_quant_gpu} (branch fp8-alternate ed9490e). ~300 s.
# What it asks:
#   - fp8-alternate (run68.sh's first part): correct on the shipped table and under tests/tune/fp8p.tune? faster
#     than main for the three fp8 specs at 4096 / 16384 tokens (same call)?
#   - decode, a same-card baseline: Qwen3 and Mixtral replayed from a CUDA graph at 1 / 8 / 64 / 512 tokens
#   - where Qwen3's 1-token layer goes: Nsight Compute of its kernels (duration, DRAM throughput, occupancy)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v alt_test_quant_gpu 120 build/alt/test_quant_gpu; then
    MOEGEN_TUNING=tests/tune/fp8p.tune v alt_test_quant_gpu_fp8p 120 build/alt/test_quant_gpu
    for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
        for b in build/moe_bench build/alt/moe_bench; do
            echo "== $s $b" >> "$OUT/fp8_bench.log"
            timeout 25 $b examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/fp8_bench.log" 2>&1
            echo "bench $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
fi
for s in qwen3-30b-a3b mixtral-8x7b; do
    echo "== $s" >> "$OUT/decode.log"
    timeout 40 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 512 --iters 20 >> "$OUT/decode.log" 2>&1
    echo "decode $s: exit $?" >> "$OUT/rc.txt"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 $NCU --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section LaunchStats --section Occupancy -k 'regex:route|gemv|combine|scatter|plan' --launch-count 6 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_qwen3_decode.log" 2>&1
echo "ncu decode: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
for f in alt_test_quant_gpu alt_test_quant_gpu_fp8p; do
    [ -f "$OUT/$f.log" ] && { echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep FAIL "$OUT/$f.log" | head -5; }
done
grep -E '^== |gemm_|LAYER' "$OUT/fp8_bench.log" 2>/dev/null
grep -vE '^\s*$' "$OUT/decode.log" | head -80
grep -E '^  [a-z].*\(|Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy|Grid Size|Block Size' \
    "$OUT/ncu_qwen3_decode.log" | head -60
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
