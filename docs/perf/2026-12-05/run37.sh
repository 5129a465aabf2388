#!/usr/bin/env bash
# Run 37 (2026-12-05, second session's third call): after run 36 showed the route's L2 prefetch costing 66 us at
# decode and the folded combine never faster, main with the prefetch removed, the fold off by default
# (MOEGEN_COMBINE_FUSE=on keeps it) and the EP training overflow count at one offset in both layouts:
#   1. (alone) moe_bench --graph of the four decode specs at 1 .. 512 tokens, the default launch
#   2. (side by side, times not meaningful) test_bwd_gpu (whose EP capacity cases failed in run 35), test_gpu on
#      the decode specs up to 200 tokens, the gemv cases with MOEGEN_COMBINE_FUSE=on, test_ep_gpu, test_runtime,
#      the vendored gemv builds (fold off and on), and bench/check_models.py's 15 families run 35 did not reach
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s" >> "$OUT/decode_bench.log"
    timeout 60 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 8 --tokens 64 \
        --tokens 128 --tokens 512 --iters 20 >> "$OUT/decode_bench.log" 2>&1
done
v() { local log=$1; shift; timeout ${T_LIMIT:-380} "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
{ v test_bwd_gpu build/tests/test_bwd_gpu; } &
{ v test_gpu_decode build/tests/test_gpu --tokens-max 200 qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 \
      tiny clamp odd shared; } &
{ MOEGEN_COMBINE_FUSE=on MOEGEN_TUNING=tests/tune/gemv.tune v test_gpu_gemv_fold build/tests/test_gpu gemv.tune
  v test_runtime build/tests/test_runtime
  v test_vendored_gemv build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe
  MOEGEN_COMBINE_FUSE=on v test_vendored_gemv_fold build/tests/test_vendored_gemv examples/specs/qwen3-30b-a3b.moe
  v test_vendored_fp8_gemv build/tests/test_vendored_fp8_gemv examples/specs/fp8/qwen3-30b-a3b-fp8.moe; } &
{ v test_ep_gpu build/tests/test_ep_gpu; v test_quant_gpu build/tests/test_quant_gpu; } &
{ OUT=$OUT timeout 400 bash bench/gpu_check_models.sh --tokens 1,37,512 --families \
      glm-moe-dsa,glm5-next,deepseek-v4,hy-v3,qwen4-exp,minimax-m3-vl,mellum,axk2,granitemoe-swa,deepseek-ocr2,privacy-filter,aria,laguna,laguna-softcap,ernie4.5-vl \
      > "$OUT/check_models_run.txt" 2>&1
  echo "check_models gpu: exit $?" >> "$OUT/rc.txt"; } &
wait
cat "$OUT/rc.txt"
grep -E '^== |LAYER graph|^(1|4|8) +(route|gemm|combine)' "$OUT/decode_bench.log"
for f in "$OUT"/test_*.log; do echo "== $(basename $f): $(grep -E '^(total|test_[a-z_0-9]+): [0-9]+ passed' $f | tail -1)"; done
grep -E 'FAIL' "$OUT"/test_*.log | head -20
grep -E '\| (ok|FAIL)|failed|^check_models' "$OUT/check_models.gpu.log" | awk '{print $1, $2, $NF}' | head -60
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
