#!/usr/bin/env bash
# Run 86: the route's split sum with float4 partials (the last block's loads of four splits issued together, and
# the partial writes as float4s) against main before it, Qwen3 / gpt-oss-20b / EP8 rank / Mixtral at 1..512 tokens
# (clean flush, graph); then test_gpu --tokens-max 64 under the new build. carry ["build/rc", "build/rs"]:
# build/rc = main 066cffc (moe_bench, moegen), build/rs = this commit's moe_bench, moegen, test_gpu.
set -u
B=${1:-330}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b; do
    for b in rc rs; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/route.log"
        timeout 40 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 8 --tokens 64 \
            --tokens 512 --iters 20 >> "$OUT/route.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/rs/moegen build/moegen
MOEGEN_TEST_PROGRESS=1 timeout $((B - SECONDS - 10)) stdbuf -oL -eL build/rs/test_gpu --tokens-max 64 \
    qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
gzip -9 "$OUT/route.log"
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"; gzip -9 "$OUT/test_gpu.log"
python3 docs/perf/2026-12-06/ab.py <(zcat "$OUT/route.log.gz") "LAYER graph" route
