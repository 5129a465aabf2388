#!/usr/bin/env bash
# Run 19 (last device call of the session): what run 18 left unfinished (its four test_gpu jobs ran out of time or
# memory side by side) and the decode measurements. Phase 1, tests side by side, 260 s cap: test_gpu's default cases;
# the examples under tests/tune/splitk.tune; the specs with run 16's new entries at <= 2048 tokens under the shipped
# table; test_quant_gpu (its gather expectation fixed); test_bwd_gpu's qwen2 cases under four seeds (run 18: one
# scalar gradient 0.0221 > 0.015 at T=1); the JAX handler rebuilt (the saved-region refusal). Phase 2, alone:
# moe_bench --graph at 1, 4, 8, 16, 64 tokens under the shipped table, tests/tune/splitk.tune and MOEGEN_ROUTE_FUSE=off.
# The first attempt's machine was taken back mid-call (nothing returned); rerun with less, as RUN19_SHORT=1 says:
# test_gpu at <= 64 tokens (the fused route's and split-K's sizes) under the shipped and the split-K table, 150 s cap,
# and the decode measurement for Qwen3-30B-A3B and Mixtral only.
# Logs in $OUT/logs.tar.gz (the device returns few files), summary in $OUT/summary.txt.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
L=$OUT/logs; mkdir -p $L
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$L/$log.log" 2>&1; echo "$log: exit $?" >> "$L/rc.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/gpu.txt"
if [ "${RUN19_SHORT:-0}" = 1 ]; then
v test_gpu_small 150 build/tests/test_gpu --tokens-max 64 &
MOEGEN_TUNING=tests/tune/splitk.tune v test_gpu_splitk_small 150 build/tests/test_gpu --tokens-max 64 = examples/ &
{ v test_quant_gpu 150 build/tests/test_quant_gpu; MOEGEN_TEST_SEED=1 v test_bwd_qwen2_seed1 40 build/tests/test_bwd_gpu qwen2; } &
{ MOEGEN_TEST_SEED=2 v test_bwd_qwen2_seed2 40 build/tests/test_bwd_gpu qwen2; mkdir -p /tmp/jx
  v build_jax 100 python3 python/build_jax.py --out /tmp/jx/libmoegen_jax.so; } &
wait
DECODE_SPECS="qwen3-30b-a3b mixtral-8x7b"
else
v test_gpu 260 build/tests/test_gpu &
MOEGEN_TUNING=tests/tune/splitk.tune v test_gpu_splitk 260 build/tests/test_gpu = examples/ &
v test_gpu_new_entries 260 build/tests/test_gpu --tokens-max 2048 examples/specs/olmoe examples/specs/deepseek-v2 \
    examples/specs/qwen3-235b examples/specs/glm examples/specs/qwen2 examples/specs/gpt-oss-20b examples/specs/llama-4 \
    examples/specs/mixtral &
{ v test_quant_gpu 200 build/tests/test_quant_gpu
  for seed in 1 2 3 4; do MOEGEN_TEST_SEED=$seed v test_bwd_qwen2_seed$seed 60 build/tests/test_bwd_gpu qwen2; done; } &
{ mkdir -p /tmp/jx; v build_jax 120 python3 python/build_jax.py --out /tmp/jx/libmoegen_jax.so; } &
wait
fi
for s in ${DECODE_SPECS:-qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8}; do
    for t in shipped splitk fuseoff; do
        tab=tuning/h200.tune; f=on
        [ $t = splitk ] && tab=tests/tune/splitk.tune
        [ $t = fuseoff ] && f=off
        echo "== $t $s" >> "$L/decode.log"
        MOEGEN_TUNING=$tab MOEGEN_ROUTE_FUSE=$f timeout 40 build/moe_bench examples/specs/$s.moe --graph --tokens 1 \
            --tokens 4 --tokens 8 --tokens 16 --tokens 64 --iters 15 >> "$L/decode.log" 2>&1
    done
done
{ cat "$L/rc.txt"
  for f in "$L"/*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_]+): [0-9]+ passed' $f | tail -1)"; done
  grep -hE 'FAIL' "$L"/*.log | head -30
  awk '/^== /{b=$2" "$3} /LAYER graph|^route at/{print b, $0}' "$L/decode.log"; } > "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"
cat "$OUT/summary.txt"
