#!/usr/bin/env bash
# Run 65 (2026-12-05, eighth session), ~220 s. Main d0bcebb's build (run 64's):
#   - compare_torch of the fp8 Mixtral spec at 4096 and 16384 tokens (the peer torch._scaled_grouped_mm, same call)
#   - compute-sanitizer racecheck and memcheck of the staged channel scales: moe_bench on test_quant_gpu's q8li case
#     (channel, ffn_bias, two consumers) under tests/tune/fp8p.tune (the persistent grid)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 70 python3 bench/compare_torch.py examples/specs/fp8/mixtral-8x7b-fp8.moe --tokens 4096 --tokens 16384 --iters 10 \
    > "$OUT/fp8_compare.log" 2>&1; echo "compare: exit $?" >> "$OUT/rc.txt"
printf "name = 'q8li'\nexperts = 4\ntop_k = 1\nhidden = 512\nffn = 256\ntokens = 200\nffn_bias = true\nrouter = { score = 'sigmoid', apply = 'input' }\nquant = { weights = 'fp8_e4m3', scaling = 'channel' }\n" > /tmp/q8li.moe
for tool in racecheck memcheck; do
    MOEGEN_TUNING=tests/tune/fp8p.tune timeout 80 compute-sanitizer --tool $tool --error-exitcode 3 \
        build/moe_bench /tmp/q8li.moe --tokens 200 --iters 1 > "$OUT/$tool.log" 2>&1
    echo "$tool: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
grep -vE '^plan' "$OUT/fp8_compare.log" | head -20
for tool in racecheck memcheck; do grep -E "gemms|ERROR SUMMARY|RACE" "$OUT/$tool.log" | head -5; done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
