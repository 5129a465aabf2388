#!/usr/bin/env bash
# Run 35 (2026-12-05, second session: the first device call in four sessions): correctness of everything that
# landed unrun since 2026-12-04's run 26, side by side (times not meaningful), one call under 600 s:
#   - docs/perf/2026-12-04/run27.sh's jobs (the gemv grid's bn 8/16, PDL on, recompute_u, the folded combine on and
#     off, sqrtsoftplus/sparsemixer, the verify suites, the Python ops, fp8 on two consumer warpgroups)
#   - run34.sh's correctness part (the fp8 gemv grid under tests/tune/gemv8.tune eager and PDL, the vendored fp8
#     gemv build, memcheck, the softcap and zero_experts specs)
#   - run33.sh's test_quant_gpu under tests/tune/fp8p.tune (the fp8 persistent grid)
#   - run32.sh's bench/gpu_check_models.sh (the model families through libmoegen.so against transformers)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout ${T_LIMIT:-470} "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_gpu_small build/tests/test_gpu --tokens-max 48 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8
  MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv build/tests/test_gpu gemv.tune
  MOEGEN_COMBINE_FUSE=off MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv_nofuse build/tests/test_gpu gemv.tune
  v test_gpu_rules build/tests/test_gpu tests/specs/softcap.moe tests/specs/zero_experts.moe; } &
{ MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv_examples build/tests/test_gpu --tokens-max 128 examples/
  v test_vendored_gemv build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe
  v test_vendored_splitk build/tests/test_vendored_splitk examples/specs/qwen3-30b-a3b.moe
  v test_vendored_fp8 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe
  v test_vendored_fp8_gemv build/tests/test_vendored_fp8_gemv examples/specs/fp8/qwen3-30b-a3b-fp8.moe
  v test_vendored build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe
  MOEGEN_PDL=on v test_vendored_pdl build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe
  MOEGEN_PDL=on v test_vendored_gemv_pdl build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe; } &
{ MOEGEN_PDL=on v test_gpu_pdl build/tests/test_gpu --tokens-max 200 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b \
      deepseek-v3-ep8 tiny clamp odd shared
  MOEGEN_PDL=on v test_bgemm_gpu_pdl build/tests/test_bgemm_gpu; } &
{ MOEGEN_PDL=on v test_ep_gpu_pdl build/tests/test_ep_gpu; v test_runtime build/tests/test_runtime
  v test_gpu_scores build/tests/test_gpu tests/specs/sqrtsoftplus.moe tests/specs/sparsemixer.moe
  v example build/moe_example examples/specs/qwen3-30b-a3b.moe 1000; } &
{ MOEGEN_PDL=on v test_bwd_gpu_pdl build/tests/test_bwd_gpu; } &
{ v test_bwd_gpu build/tests/test_bwd_gpu; } &
{ v test_quant_gpu build/tests/test_quant_gpu
  MOEGEN_TUNING=tests/tune/fp8.tune v test_quant_gpu_fp8c2 build/tests/test_quant_gpu
  MOEGEN_TUNING=tests/tune/fp8p.tune v test_quant_gpu_fp8p build/tests/test_quant_gpu; } &
{ MOEGEN_TUNING=tests/tune/gemv8.tune v test_quant_gpu_gemv8 build/tests/test_quant_gpu
  MOEGEN_PDL=on MOEGEN_TUNING=tests/tune/gemv8.tune v test_quant_gpu_gemv8_pdl build/tests/test_quant_gpu
  MOEGEN_TUNING=tests/tune/gemv8.tune MOEGEN_TEST_CASE="Qwen3" v memcheck_gemv8 compute-sanitizer --tool memcheck \
      --error-exitcode 9 build/tests/test_quant_gpu; } &
{ mkdir -p /tmp/verify_torch_op
  v build_torch python3 python/build_torch.py --out /tmp/verify_torch_op/libmoegen_torch.so
  MOEGEN_TORCH_LIBRARY=/tmp/verify_torch_op/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so \
      v test_torch_gpu python3 python/tests/test_torch_gpu.py
  v build_jax python3 python/build_jax.py
  MOEGEN_LIBRARY=$PWD/build/libmoegen.so v test_jax_gpu python3 python/tests/test_jax_gpu.py; } &
{ OUT=$OUT timeout 480 bash bench/gpu_check_models.sh --tokens 1,37,512 > "$OUT/check_models_run.txt" 2>&1
  echo "check_models gpu: exit $?" >> "$OUT/rc.txt"; } &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_0-9]+): [0-9]+ passed' $f | tail -1)"; done
grep -E 'FAIL' "$OUT"/test_*.log | head -40
grep -E 'FAIL|failed|skipped|^check_models' "$OUT/check_models.gpu.log" | head -20
tail -3 "$OUT/memcheck_gemv8.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
