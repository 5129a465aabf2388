#!/usr/bin/env bash
# Run 8 (device call, first of the third 2026-12-04 session): the GEMM variants per call size (issue #16 item 1,
# merged from h/variants) under their GPU tests, the examples under the shipped table, and the Python ops never run
# on the GPU since their fixes (83b848c: the C++ torch op on a shared libstdc++; ffc3e3a: the JAX test's jitted
# reference). Jobs side by side on the one GPU (times not meaningful); one line per job in $OUT/rc.txt.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
L=$PWD/build/libmoegen.so
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
{ v test_gpu_variants 240 build/tests/test_gpu variants.tune
  v test_bwd_variants 120 build/tests/test_bwd_gpu train_softmax
  v test_vendored 120 build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe; } &
v test_gpu_examples 420 build/tests/test_gpu = examples/ &
{ MOEGEN_LIBRARY=$L v test_torch_gpu 300 python3 python/tests/test_torch_gpu.py; } &
{ v build_jax 120 python3 python/build_jax.py
  MOEGEN_LIBRARY=$L v test_jax_gpu 280 python3 python/tests/test_jax_gpu.py; } &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): [0-9]+ passed' $f | tail -1)"; done
grep -hE 'FAIL' "$OUT"/*.log | head -30
tail -5 "$OUT/test_torch_gpu.log" "$OUT/test_jax_gpu.log"
