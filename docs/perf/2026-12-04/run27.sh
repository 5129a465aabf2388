#!/usr/bin/env bash
# Run 27 (sixth 2026-12-04 session's first call): correctness of what landed unrun last session, side by side
# (times not meaningful): run 26's test_gpu --tokens-max 48 on the four specs with shipped gemv entries, the
# verify suites but test_gpu's default list (test_ep_gpu, test_bwd_gpu, test_bgemm_gpu, test_quant_gpu, the
# vendored builds, test_runtime, the example, the Python ops), and test_quant_gpu under tests/tune/fp8.tune (two
# consumer fp8 GEMMs). Then on a quiet GPU: moe_bench of the fp8 examples under the default tile and fp8.tune, and
# ncu (--clock-control none) of Qwen3's kernels at 1 token (route, gemv up, gemv down, combine).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout ${T_LIMIT:-280} "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v test_gpu_small build/tests/test_gpu --tokens-max 48 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 &
{ v test_vendored_splitk build/tests/test_vendored_splitk examples/specs/qwen3-30b-a3b.moe
  v test_vendored_fp8 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe
  v test_vendored_gemv build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe
  v test_vendored build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe; } &
{ v test_bwd_gpu build/tests/test_bwd_gpu; v test_bgemm_gpu build/tests/test_bgemm_gpu; } &
{ v test_quant_gpu build/tests/test_quant_gpu; v test_runtime build/tests/test_runtime
  v example build/moe_example examples/specs/qwen3-30b-a3b.moe 1000; } &
{ MOEGEN_TUNING=tests/tune/fp8.tune v test_quant_gpu_fp8c2 build/tests/test_quant_gpu; } &
{ v test_ep_gpu build/tests/test_ep_gpu; } &
{ mkdir -p /tmp/verify_torch_op
  v build_torch python3 python/build_torch.py --out /tmp/verify_torch_op/libmoegen_torch.so
  MOEGEN_TORCH_LIBRARY=/tmp/verify_torch_op/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so \
      v test_torch_gpu python3 python/tests/test_torch_gpu.py
  v build_jax python3 python/build_jax.py
  MOEGEN_LIBRARY=$PWD/build/libmoegen.so v test_jax_gpu python3 python/tests/test_jax_gpu.py; } &
wait
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    for t in default fp8c2; do
        echo "== $t $s" >> "$OUT/fp8c2_bench.log"
        if [ $t = default ]; then tab=tuning/h200.tune; else tab=tests/tune/fp8.tune; fi
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/fp8/$s.moe --tokens 128 --tokens 4096 \
            --tokens 16384 --iters 10 >> "$OUT/fp8c2_bench.log" 2>&1
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --set full -k 'regex:route|gemv|combine' --launch-skip 12 --launch-count 4 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_qwen3_1tok.log" 2>&1
echo "ncu: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): [0-9]+ passed' $f | tail -1)"; done
grep -E 'FAIL' "$OUT"/test_*.log | head -20
grep -E '^== |gemm_up|gemm_down|LAYER' "$OUT/fp8c2_bench.log"
grep -E '^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Block Size|Grid Size' "$OUT/ncu_qwen3_1tok.log" | head -60
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
