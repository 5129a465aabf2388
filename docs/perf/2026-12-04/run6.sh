#!/usr/bin/env bash
# Run 6 (device call; its first attempt, run 5b, lost when the machine was taken back): the Python ops on the GPU (torch under gdb when there is one, JAX after
# python/build_jax.py), test_bwd_gpu's examples again, then fp8, ping-pong and route benchmarks.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
L=$PWD/build/libmoegen.so
( timeout 300 build/tests/test_bwd_gpu examples > $OUT/test_bwd_examples.log 2>&1; echo "test_bwd_gpu examples: exit $?" > $OUT/bwd_rc.txt ) &
if command -v gdb > /dev/null; then
    MOEGEN_LIBRARY=$L timeout 200 gdb -q -batch -ex run -ex bt --args python3 python/tests/test_torch_gpu.py > $OUT/test_torch_gpu.log 2>&1
else
    MOEGEN_LIBRARY=$L timeout 200 python3 python/tests/test_torch_gpu.py > $OUT/test_torch_gpu.log 2>&1
fi
echo "test_torch_gpu: exit $?"; grep -vE "^ok|^\[New Thread|^\[Thread" $OUT/test_torch_gpu.log | tail -40
timeout 90 python3 python/build_jax.py > $OUT/build_jax.log 2>&1; echo "build_jax: exit $?"; tail -3 $OUT/build_jax.log
MOEGEN_LIBRARY=$L timeout 120 python3 python/tests/test_jax_gpu.py > $OUT/test_jax_gpu.log 2>&1; echo "test_jax_gpu: exit $?"; grep -v "^ok" $OUT/test_jax_gpu.log | tail -15
wait; cat $OUT/bwd_rc.txt; grep -E "FAIL|passed" $OUT/test_bwd_examples.log | tail -5
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    timeout 90 python3 bench/compare_torch.py examples/specs/fp8/$s.moe --tokens 128 --tokens 4096 --tokens 16384 --iters 10 >> $OUT/fp8_compare.log 2>&1
    echo "compare_torch exit status $?" >> $OUT/fp8_compare.log
done
grep -vE "^plan" $OUT/fp8_compare.log | head -60
timeout 60 build/moe_bench examples/specs/fp8/mixtral-8x7b-fp8.moe --tokens 128 --tokens 4096 --tokens 16384 --iters 10 >> $OUT/fp8_bench.log 2>&1
grep -E "LAYER|gemm|ceilings|^moe_bench" $OUT/fp8_bench.log
for s in mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s, embedded table" >> $OUT/pingpong_bench.log
    timeout 60 build/moe_bench examples/specs/$s.moe --tokens 4096 --tokens 16384 --iters 20 >> $OUT/pingpong_bench.log 2>&1
    echo "== $s, tests/tune/pingpong.tune" >> $OUT/pingpong_bench.log
    MOEGEN_TUNING=tests/tune/pingpong.tune timeout 60 build/moe_bench examples/specs/$s.moe --tokens 4096 --tokens 16384 --iters 20 >> $OUT/pingpong_bench.log 2>&1
done
grep -E "^==|LAYER|gemm_|ceilings" $OUT/pingpong_bench.log
timeout 60 build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --tokens 2048 --iters 20 > $OUT/route_bench.log 2>&1
grep -E "ceilings|route|permute|combine|LAYER" $OUT/route_bench.log
