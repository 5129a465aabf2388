#!/usr/bin/env bash
# Run 88 (written in the thirteenth session, NOT run: its device time was spent). (1) The route's k-split sum in
# slices (patches/route_wk_slices.diff) against main: build main's moe_bench + moegen into build/rc, then apply the
# patch, rebuild, and put moe_bench + moegen + test_gpu into build/wk (strip them; regenerate goldens and kernels
# only if the patch is kept). (2) test_gpu on the four example specs test_gpu.c lists since 2026-12-06's thirteenth
# session (deepseek-v4, deepseek-v4-hash, gemma4-26b-a4b, longcat-flash), never yet run on a GPU, and the Qwen3
# and Mixtral few-token cases under the patch. (3) fusedramp (build/wk/fusedramp: nvcc -O3 -arch=sm_90a
# docs/perf/2026-12-06/fusedramp.cu): one persistent kernel for up and down against two. carry ["build/rc", "build/wk"].
set -u
B=${1:-330}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for ab in "50 25" "100 50" "25 12"; do timeout 60 build/wk/fusedramp $ab >> "$OUT/fusedramp.log" 2>&1; done
cat "$OUT/fusedramp.log"
for s in qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b; do
    for b in rc wk; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/route.log"
        timeout 40 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 8 --tokens 64 \
            --tokens 512 --iters 20 >> "$OUT/route.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/wk/moegen build/moegen
MOEGEN_TEST_PROGRESS=1 timeout $((B - SECONDS - 10)) stdbuf -oL -eL build/wk/test_gpu --tokens-max 600 \
    deepseek-v4 gemma4-26b-a4b longcat-flash qwen3-30b-a3b mixtral-8x7b > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
gzip -9 "$OUT/route.log"
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"; gzip -9 "$OUT/test_gpu.log"
python3 docs/perf/2026-12-06/ab.py <(zcat "$OUT/route.log.gz") "LAYER graph" route
