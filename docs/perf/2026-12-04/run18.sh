#!/usr/bin/env bash
# Run 18: main with h/splitk, h/smallroute, h/fp8ops, h/fp8gather, h/fsdptrain merged (and run 16's table):
# every GPU test side by side on the one GPU (times not meaningful), a line per job in $OUT/rc.txt.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
L=$PWD/build/libmoegen.so
T=${T:-420}
v() { local log=$1; shift; timeout $T "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
git log -1 --format=%H > "$OUT/commit.txt" 2>/dev/null
v test_gpu build/tests/test_gpu &
MOEGEN_TUNING=tests/tune/pingpong.tune v test_gpu_pingpong build/tests/test_gpu = examples/ &
MOEGEN_TUNING=tests/tune/splitk.tune v test_gpu_splitk build/tests/test_gpu = examples/ &
v test_gpu_examples build/tests/test_gpu = examples/ &
{ v test_bwd_gpu build/tests/test_bwd_gpu; v test_bwd_fsdp build/tests/test_bwd_gpu fsdp; v test_bgemm_gpu build/tests/test_bgemm_gpu; } &
{ v test_quant_gpu build/tests/test_quant_gpu; v test_runtime build/tests/test_runtime
  MOEGEN_ROUTE_FUSE=off v test_gpu_fuse_off build/tests/test_gpu --family route,permute,combine,layer --tokens-max 200 \
      examples/specs/qwen3-30b-a3b examples/specs/mixtral-8x7b examples/specs/deepseek-v3-ep8; } &
{ v test_ep_gpu build/tests/test_ep_gpu; v test_vendored build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe
  v test_vendored_splitk build/tests/test_vendored_splitk examples/specs/qwen3-30b-a3b.moe
  v test_vendored_fp8 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe
  v example build/moe_example examples/specs/qwen3-30b-a3b.moe 1000; } &
{ mkdir -p /tmp/op
  v build_torch python3 python/build_torch.py --out /tmp/op/libmoegen_torch.so
  MOEGEN_TORCH_LIBRARY=/tmp/op/libmoegen_torch.so MOEGEN_LIBRARY=$L v test_torch_gpu python3 python/tests/test_torch_gpu.py
  v build_jax python3 python/build_jax.py
  MOEGEN_LIBRARY=$L v test_jax_gpu python3 python/tests/test_jax_gpu.py; } &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+|[0-9]+ passed)' $f | tail -1)"; done
grep -hE 'FAIL' "$OUT"/*.log | head -30
grep -h "alignment:" "$OUT"/test_jax_gpu.log
