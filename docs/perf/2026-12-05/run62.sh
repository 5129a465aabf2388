#!/usr/bin/env bash
# Run 62 (2026-12-05, eighth session), ~500 s. Main 541306b (dgrad_up on the ping-pong grid) plus the fp8 up
# GEMM's epilogue computing its activation once (the next commit; build/old/moe_bench = e609034's):
#   - test_bwd_gpu: the four train specs, the EP cases, the dp x fsdp cases (the rest of run 58, now on this build)
#   - moe_bench of the fp8 specs at 4096 and 16384 tokens, build/old against this build
#   - test_quant_gpu (the fp8 layer's GPU tests) on this build
#   - compare_torch of the fp8 specs at 4096 and 16384 tokens (run 47: the peer torch._scaled_grouped_mm)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
v test_bwd_gpu_train 90 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
v test_bwd_gpu_ep 150 build/tests/test_bwd_gpu ep
v test_bwd_gpu_fsdp 60 build/tests/test_bwd_gpu fsdp
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for b in build/old/moe_bench build/moe_bench; do
        echo "== $s $b" >> "$OUT/fp8_bench.log"
        timeout 30 $b examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/fp8_bench.log" 2>&1
        echo "bench $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
v test_quant_gpu 120 build/tests/test_quant_gpu
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    echo "== $s" >> "$OUT/fp8_compare.log"
    timeout 60 python3 bench/compare_torch.py examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 \
        >> "$OUT/fp8_compare.log" 2>&1; echo "compare $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in test_bwd_gpu_train test_bwd_gpu_ep test_bwd_gpu_fsdp test_quant_gpu; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL" "$OUT/$f.log" | head -5
done
grep -E '^== |gemm_|LAYER' "$OUT/fp8_bench.log"
grep -vE '^plan' "$OUT/fp8_compare.log" | head -60
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
