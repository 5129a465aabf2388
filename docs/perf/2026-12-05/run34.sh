#!/usr/bin/env bash
# Run 34 (written in the 2026-12-05 session, which had no GPU): the fp8 gemv grid (templates/gemm_gemv.lua's
# device_code8: e4m3 operands, the up GEMM's clusters of 256 / bn CTAs sharing a quantization block through
# distributed shared memory), ~400 s. Needs `make gpu-build` here first (carry ["build"]).
#   - test_quant_gpu under tests/tune/gemv8.tune (every fp8 test shape and example on the gemv grid: bn 32..256,
#     clusters of 8 .. 1), then again with MOEGEN_PDL=on
#   - the vendored fp8 build on the gemv grid (test_vendored_fp8_gemv: the folded combine at small calls)
#   - compute-sanitizer memcheck of test_quant_gpu's Qwen3 case on the gemv grid
#   - the new routing rules (2026-12-05): test_gpu's softcap (router.logit_softcap) and zero_experts (LongCat's
#     zero-computation experts) specs; test_bwd_gpu of the softcap spec's backward runs in run27's full list
#   - moe_bench --graph of the fp8 Mixtral, EP8 and Qwen3 specs at 1, 8, 64 and 128 tokens under the default
#     tile (tuning/h200.tune: no e4m3 entry) and tests/tune/gemv8.tune; the bf16 twins under tuning/h200.tune
#     (their shipped gemv entries) for the bytes-streamed comparison
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
MOEGEN_TUNING=tests/tune/gemv8.tune timeout 150 build/tests/test_quant_gpu > "$OUT/test_quant_gpu_gemv8.log" 2>&1
echo "test_quant_gpu gemv8: exit $?" >> "$OUT/rc.txt"
MOEGEN_PDL=on MOEGEN_TUNING=tests/tune/gemv8.tune timeout 150 build/tests/test_quant_gpu \
    > "$OUT/test_quant_gpu_gemv8_pdl.log" 2>&1
echo "test_quant_gpu gemv8 pdl: exit $?" >> "$OUT/rc.txt"
timeout 60 build/tests/test_vendored_fp8_gemv examples/specs/fp8/qwen3-30b-a3b-fp8.moe \
    > "$OUT/test_vendored_fp8_gemv.log" 2>&1
echo "test_vendored_fp8_gemv: exit $?" >> "$OUT/rc.txt"
timeout 120 build/tests/test_gpu tests/specs/softcap.moe tests/specs/zero_experts.moe > "$OUT/test_gpu_rules.log" 2>&1
echo "test_gpu softcap zero_experts: exit $?" >> "$OUT/rc.txt"
MOEGEN_TUNING=tests/tune/gemv8.tune MOEGEN_TEST_CASE="Qwen3" timeout 120 compute-sanitizer --tool memcheck \
    --error-exitcode 9 build/tests/test_quant_gpu > "$OUT/memcheck_gemv8.log" 2>&1
echo "memcheck test_quant_gpu gemv8 Qwen3: exit $?" >> "$OUT/rc.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for tab in tuning/h200.tune tests/tune/gemv8.tune; do
        echo "== $tab $s" >> "$OUT/fp8_gemv.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 \
            --tokens 64 --tokens 128 --iters 20 >> "$OUT/fp8_gemv.log" 2>&1
    done
done
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    echo "== tuning/h200.tune $s (bf16)" >> "$OUT/fp8_gemv.log"
    timeout 40 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --iters 20 >> "$OUT/fp8_gemv.log" 2>&1
done
cat "$OUT/rc.txt"
tail -2 "$OUT/test_quant_gpu_gemv8.log"
grep -E '^== |gemm_up|gemm_down|LAYER|floor' "$OUT/fp8_gemv.log" | head -120
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
