#!/usr/bin/env bash
# Run 27 (for the next session's first device call; the sixth 2026-12-04 session was lent no GPU): correctness
# of everything that landed unrun, side by side (times not meaningful), ~400 s:
#   - run 26's test_gpu --tokens-max 48 on the four specs with shipped gemv entries (tuning/h200.tune)
#   - the gemv grid's bn 8 / 16 (warps sharing a group's K): test_gpu's gemv cases and the examples up to 128
#     tokens under tests/tune/gemv.tune (tiny, clamp, geglu on bn 8; wide and Qwen3 on bn 16), test_vendored_gemv
#   - launch overlap: test_gpu on the four decode specs and the gemv/route cases up to 200 tokens, test_ep_gpu and
#     test_bwd_gpu, all with MOEGEN_PDL=on
#   - the backward's recompute_u = 1 on the forward's up GEMM (seventh session; bwd_upre removed): test_bwd_gpu
#     with PDL off too (its save cases now also run the backward with recompute_u = 1 on the saved rows and
#     require the same bits: U and every gradient)
#   - the combine folded into the gemv down GEMM (seventh session): on by default, so every gemv case above up to
#     64 tokens runs it; test_gpu's gemv cases once more with MOEGEN_COMBINE_FUSE=off (the separate combine)
#   - the new router scores (seventh session): test_gpu's sqrtsoftplus (DeepSeek-V4) and sparsemixer (Phi-3.5-MoE)
#     specs; test_bwd_gpu (above) has sqrtsoftplus's backward; the examples run takes deepseek-v4
#   - the verify suites but test_gpu's default list (test_bgemm_gpu, test_quant_gpu, the vendored builds,
#     test_runtime, the example, the Python ops) and test_quant_gpu under tests/tune/fp8.tune (two-consumer fp8)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout ${T_LIMIT:-330} "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_gpu_small build/tests/test_gpu --tokens-max 48 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8
  MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv build/tests/test_gpu gemv.tune
  MOEGEN_COMBINE_FUSE=off MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv_nofuse build/tests/test_gpu gemv.tune; } &
{ MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv_examples build/tests/test_gpu --tokens-max 128 examples/
  v test_vendored_gemv build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe
  v test_vendored_splitk build/tests/test_vendored_splitk examples/specs/qwen3-30b-a3b.moe
  v test_vendored_fp8 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe
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
  MOEGEN_TUNING=tests/tune/fp8.tune v test_quant_gpu_fp8c2 build/tests/test_quant_gpu; } &
{ mkdir -p /tmp/verify_torch_op
  v build_torch python3 python/build_torch.py --out /tmp/verify_torch_op/libmoegen_torch.so
  MOEGEN_TORCH_LIBRARY=/tmp/verify_torch_op/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so \
      v test_torch_gpu python3 python/tests/test_torch_gpu.py
  v build_jax python3 python/build_jax.py
  MOEGEN_LIBRARY=$PWD/build/libmoegen.so v test_jax_gpu python3 python/tests/test_jax_gpu.py; } &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): [0-9]+ passed' $f | tail -1)"; done
grep -E 'FAIL' "$OUT"/test_*.log | head -30
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
