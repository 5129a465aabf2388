#!/usr/bin/env bash
# Run 94 (written in the fourteenth session, run in the fifteenth). (1) gatherramp (build/rc/gatherramp:
# nvcc -O3 -arch=sm_90a docs/perf/2026-12-06/gatherramp.cu): can the up GEMM's producer gather A through the row map
# (per-row TMA boxes, or cp.async with the swizzle by hand) at the ring's pace, and do the bytes land where a box
# puts them? It decides how issue #17 item 2 (the scatter folded into the up GEMM) is built. (2) The route's H split
# up to 128 token blocks / 256 CTAs (patches/route_split256.diff: min(H / 256, 256 / blocks) shares, so Qwen3's calls
# of 2049..4096 tokens split H in two and 2048 in four) against main: build main's moe_bench + moegen into build/rc, apply the patch in a worktree and put its
# moe_bench, moegen, test_gpu into build/rs (strip them), then the layer at 1..8192 tokens side by side and test_gpu
# on Qwen3 and Mixtral (their 4096-token cases split now). carry ["build/rc", "build/rs"]. Prebuilt in the fourteenth
# session (this machine keeps build/): build/rc = main bccfe11's moegen + moe_bench + test_ep_gpu + test_bwd_gpu +
# gatherramp, build/rs = bccfe11 +
# the patch (moegen, moe_bench, test_gpu), all stripped; rebuild both if main's kernels changed since.
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 120 build/rc/gatherramp 4096 > "$OUT/gatherramp.log" 2>&1; echo "gatherramp: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/gatherramp.log"
for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8; do
    for b in rc rs; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/route.log"
        timeout 60 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 512 --tokens 1024 --tokens 2048 \
            --tokens 3000 --tokens 4096 --tokens 8192 --iters 20 >> "$OUT/route.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
# the run-92 entries under the two tests run 93 did not reach: the EP mesh spec's largest bucket and Qwen3's training
# forward at >= 4096 tokens (build/rc's test_ep_gpu and test_bwd_gpu, main bccfe11)
cp build/rc/moegen build/moegen
timeout 100 build/rc/test_ep_gpu > "$OUT/test_ep_gpu.log" 2>&1; echo "test_ep_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
timeout 120 build/rc/test_bwd_gpu > "$OUT/test_bwd_gpu.log" 2>&1; echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
tail -n 1 "$OUT/test_ep_gpu.log" "$OUT/test_bwd_gpu.log"; gzip -9 "$OUT/test_ep_gpu.log" "$OUT/test_bwd_gpu.log"
# moegen tune's per-GEMM columns (693a39d, first run on a GPU): one small size, written to a scratch table
timeout 60 build/rc/moegen tune examples/specs/qwen3-30b-a3b.moe --tokens 8 --grid gemv,tile -o "$OUT/tune8.json" \
    > "$OUT/tune8.log" 2>&1; echo "tune 8: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; tail -n 12 "$OUT/tune8.log"
cp build/rs/moegen build/moegen
timeout $((560 - SECONDS)) stdbuf -oL -eL build/rs/test_gpu qwen3-30b-a3b mixtral-8x7b > "$OUT/test_gpu.log" 2>&1
echo "test_gpu (rs): exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"; gzip -9 "$OUT/test_gpu.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/route.log" "LAYER graph" route
gzip -9 "$OUT/route.log"
