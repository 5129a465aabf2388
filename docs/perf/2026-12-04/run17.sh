#!/usr/bin/env bash
# Run 17 (an early look, before the merge): each helper branch's GPU tests from the test programs built in its own
# worktree (copied with the branch's examples/ tests/tune/ tests/specs/ tuning/ into build/early/NAME; the commit in
# NAME/commit: splitk 9d83977, smallroute 665ab88, fp8gather 1419c6b, fsdptrain c5f695c). build/moegen was not
# copied, so test_gpu's compiled-folder cases fail with "build/moegen: not found" (8 in splitk_examples.log, 2 in
# route_small.log): the harness's, not the code's. test_mgpu's case names were wrong (--mesh NAME is its syntax).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh 2>/dev/null
E=$PWD/build/early
v() { local log=$1 d=$2 t=$3; shift 3; ( cd $E/$d && timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt" ); }
v splitk_test_gpu splitk 200 build/tests/test_gpu &
v splitk_examples splitk 200 env MOEGEN_TUNING=tests/tune/splitk.tune build/tests/test_gpu = examples/specs/qwen3-30b examples/specs/mixtral examples/specs/deepseek-v3-ep8 &
{ v splitk_vendored splitk 100 build/tests/test_vendored_splitk examples/specs/qwen3-30b-a3b.moe
  v fsdp_bwd fsdptrain 120 build/tests/test_bwd_gpu fsdp
  v fsdp_mgpu fsdptrain 30 build/tests/test_mgpu fsdp2_train; } &
{ v fp8_ep fp8gather 150 build/tests/test_ep_gpu fp8
  v fp8_mgpu fp8gather 30 build/tests/test_mgpu fp8_fsdp2; } &
v route_small smallroute 200 build/tests/test_gpu --tokens-max 64 &
v route_off smallroute 200 env MOEGEN_ROUTE_FUSE=off build/tests/test_gpu --family route,permute,combine,layer --tokens-max 64 examples/specs/qwen3-30b-a3b &
wait
cat "$OUT/rc.txt"
