#!/usr/bin/env bash
# Run 43 (written 2026-12-05, third and fourth sessions; run in the fifth, on an H100: README.md here): given routing
# (router.select = "given", router.score = "given"; README "Given routing") on the GPU, ~300 s:
#   - test_gpu on the two given specs (tests/specs/given_ids.moe, given_weights.moe: random, skewed, replayed
#     from a graph; the dropped ids against moe_plan_routing_errors)
#   - test_ep_gpu whole (its ep4_given_ids and ep2_given_weights_capacity cases are new)
#   - test_vendored_given (the vendored launcher with the caller's ids and weights, NAME_BAD_IDS_AT)
#   - test_torch_gpu (check_given: torch.ops.moegen.moe_given against the eager reference, graph replay,
#     Plan.routing_errors), on the Python ops and the C++ ones
#   - check_models --backend gpu: deepseek-v4-hash (DeepSeek-V4's hash_moe layer against transformers) and
#     deepseek-v4
#   - test_bwd_gpu's train_given (training with given ids: the saved dropped-ids count, the router's backward),
#     and compute-sanitizer memcheck of the given forward and training pair
#   - moe_bench of both given specs at 1 / 64 / 512 tokens, graph-replayed, against the router's own
#     (given_ids with router.select removed): the route without the selection, or without logits at all
# Added in the fourth session (2026-12-05, no GPU either): Gemma 4's router (router.input = "separate",
# router.expert_scale; README "The router's own input"): test_gpu on tests/specs/router_own_input.moe,
# test_vendored_own, test_torch_gpu's check_router_extras (moe_ext), check_models' gemma4 family, memcheck of
# the own-input forward, moe_bench of examples/specs/gemma4-26b-a4b.moe against the same spec without the keys;
# and its training: test_bwd_gpu on tests/specs/train_own_input.moe (d router_x, d expert_scale, the dw·w'
# parts) with memcheck, test_torch_gpu's check_training_ext (_TrainExt against torch autograd); and fp32 router
# weights (router.weight_dtype = "fp32"): test_gpu on tests/specs/router_fp32.moe, test_torch_gpu's
# fp32_router_small, check_models' ernie4.5-fp32router and longcat-fp32router on the GPU, moe_bench of
# router_fp32.moe against the same spec in bf16 (the route's cost of the three parts); and the activation's clamp
# after its unit (Step-3.7-Flash): test_gpu and test_bwd_gpu on tests/specs/train_clamp_after.moe, check_models'
# step3.7-clamped on the GPU. Added in the fifth session (2026-12-05): the shared expert's own limit
# (shared.limit: train_clamp_after.moe now has it, so its test_gpu / test_bwd_gpu lines cover it) and none
# (shared.unclamped: test_gpu on tests/specs/shared_unclamped.moe), check_models' step3.7-shared-limit and hy-v4;
# NemotronH's relu2 experts (activation.kind = "relu2"): test_gpu on tests/specs/train_relu2.moe and the
# nemotron-3-nano example, test_bwd_gpu train_relu2, check_models' nemotron-h, moe_bench of the example
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout 240 "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_gpu_given build/tests/test_gpu given; v test_gpu_own build/tests/test_gpu router_own_input
  v test_gpu_fp32router build/tests/test_gpu router_fp32; v test_gpu_clamp_after build/tests/test_gpu clamp_after
  v test_gpu_shared_unclamped build/tests/test_gpu shared_unclamped; v test_gpu_relu2 build/tests/test_gpu relu2
  v test_gpu_nemotron build/tests/test_gpu nemotron; } &
{ v test_ep_gpu build/tests/test_ep_gpu; v test_vendored_given build/tests/test_vendored_given tests/specs/given_weights.moe
  v test_vendored_own build/tests/test_vendored_own tests/specs/router_own_input.moe; } &
{ mkdir -p /tmp/r43_torch
  v build_torch python3 python/build_torch.py --out /tmp/r43_torch/libmoegen_torch.so
  MOEGEN_TORCH_LIBRARY=/tmp/r43_torch/libmoegen_torch.so MOEGEN_LIBRARY=$PWD/build/libmoegen.so \
      v test_torch_gpu python3 python/tests/test_torch_gpu.py
  MOEGEN_TORCH_LIBRARY=none MOEGEN_LIBRARY=$PWD/build/libmoegen.so v test_torch_gpu_pyops python3 python/tests/test_torch_gpu.py
} &
wait
# the given ids through training (saved counts, the router's backward skipping drops), then memcheck of the
# given specs' forward and training pair (the dropped-ids count is one int past the tickets)
v test_bwd_gpu_given build/tests/test_bwd_gpu given
v memcheck_given compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_gpu given_weights
v memcheck_bwd_given compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_bwd_gpu train_given
v memcheck_own compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_gpu router_own_input
v test_bwd_gpu_own build/tests/test_bwd_gpu train_own_input
v test_bwd_gpu_clamp_after build/tests/test_bwd_gpu train_clamp_after
v test_bwd_gpu_relu2 build/tests/test_bwd_gpu train_relu2
v memcheck_bwd_own compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_bwd_gpu train_own_input
MOEGEN_LIBRARY=$PWD/build/libmoegen.so v check_models python3 bench/check_models.py --backend gpu \
    --families deepseek-v4-hash,deepseek-v4,gemma4,ernie4.5-fp32router,longcat-fp32router,step3.7-clamped,step3.7-shared-limit,hy-v4,nemotron-h \
    --tokens 1,37,512
sed 's/select = "given", //' tests/specs/given_ids.moe > /tmp/topk_ids.moe
sed 's/, input = "separate", expert_scale = true//' examples/specs/gemma4-26b-a4b.moe > /tmp/gemma4_plain.moe
sed 's/, weight_dtype = "fp32"//' tests/specs/router_fp32.moe > /tmp/router_bf16.moe
for s in examples/specs/nemotron-3-nano-30b-a3b.moe tests/specs/given_ids.moe /tmp/topk_ids.moe tests/specs/given_weights.moe examples/specs/gemma4-26b-a4b.moe \
         /tmp/gemma4_plain.moe tests/specs/router_fp32.moe /tmp/router_bf16.moe; do
    echo "== $s" >> "$OUT/bench.log"
    timeout 60 build/moe_bench $s --graph --tokens 1 --tokens 64 --tokens 512 --iters 20 >> "$OUT/bench.log" 2>&1
done
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+|check_models): ' $f | tail -1)"; done
grep -h FAIL "$OUT"/*.log | head -20
grep -E '^== |LAYER|route' "$OUT/bench.log"
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
