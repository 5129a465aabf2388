#!/usr/bin/env bash
# Run 64 (2026-12-05, eighth session), ~400 s. Main d0bcebb (the fp8 up GEMM's channel scales staged in shared
# memory on the persistent grid; its codes stored 4 bytes a lane) against build/old/moe_bench (e609034):
#   - test_quant_gpu on the shipped table (the Mixtral fp8 example's 4096 bucket: persistent, channel) and under
#     tests/tune/fp8p.tune (every inline case persistent: channel with and without ffn_bias, one and two consumers)
#   - moe_bench of the three fp8 specs at 4096 and 16384 tokens, old and new in the same call
#   - Nsight Compute of the new fp8 Mixtral up GEMM: warp samples per region (run 63's question again)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
v test_quant_gpu 120 build/tests/test_quant_gpu
MOEGEN_TUNING=tests/tune/fp8p.tune v test_quant_gpu_fp8p 120 build/tests/test_quant_gpu
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for b in build/old/moe_bench build/moe_bench; do
        echo "== $s $b" >> "$OUT/fp8_bench.log"
        timeout 25 $b examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/fp8_bench.log" 2>&1
        echo "bench $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 40 $NCU --clock-control none --section WarpStateStats --section SourceCounters --import-source no \
    -k 'regex:gemm_up' --launch-count 1 -o "$OUT/fp8up" build/moe_bench examples/specs/fp8/mixtral-8x7b-fp8.moe \
    --tokens 4096 --iters 1 > "$OUT/ncu_fp8up_run.log" 2>&1
echo "ncu: exit $?" >> "$OUT/rc.txt"
timeout 40 $NCU --import "$OUT/fp8up.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_fp8up_sass.csv" 2>&1
rm -f "$OUT/fp8up.ncu-rep"
cat "$OUT/rc.txt"
for f in test_quant_gpu test_quant_gpu_fp8p; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL" "$OUT/$f.log" | head -5
done
grep -E '^== |gemm_|LAYER' "$OUT/fp8_bench.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt|csv)$'))
