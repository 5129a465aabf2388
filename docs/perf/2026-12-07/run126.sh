#!/usr/bin/env bash
# Run 126 (twenty-third session): run124.sh with a step (2b) added: the up gemv asking L2 for its expert's W2.
# Builds (here, no GPU): r124 = main as it stands (`make -j2 all build/moe_bench build/tests/test_gpu
# build/libmoegen_ref.so`; copy moegen, moe_bench, tests/test_gpu, libmoegen.so, libmoegen_ref.so into build/r124,
# strip, and Debian's liblua5.4.so.0 and libjansson.so.4 beside them), r125 = the same with
# docs/perf/2026-12-07/patches/route_acqrel_tickets.diff applied (`git apply`, `make kernels`, build, copy into
# build/r125, then `git checkout -- .` back), and the stamped harnesses: run `docs/perf/2026-12-07/stamps/build.sh`
# in each tree (it remakes build/sb; its h_base is that tree's stamped forward) and keep the main tree's h_base as
# h_124 and the patched tree's as h_125, both in build/sb at the end.
# Carry ["build/r124", "build/r125", "build/sb"]. $1: the budget in seconds (default 420).
# (1) r125's tickets on a GPU: test_gpu --family route --tokens-max 1000 on six specs (the split ticket at 1-8 tokens,
# the fused ticket across token blocks at 33-64, and calls whose last block of 32 has at most 8 tokens — 129, 1000 —
# where the few-token path meets the staged one in one call: never yet on a GPU), then the whole layer to 64 tokens
# on Qwen3 and Mixtral;
# (2) the route's timeline r124 against r125; (3) moe_bench --graph at 1 / 8 / 64 tokens, r124 against r125,
# interleaved, four specs; (4) the peers: compare_torch --graph at 1..1024 tokens on r124 (run120's step, never run).
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r125
timeout 120 stdbuf -oL -eL build/r125/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b zero_experts router_latent > "$OUT/w/test_gpu_route1000.log" 2>&1
echo "test_gpu r125 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 90 stdbuf -oL -eL build/r125/test_gpu --tokens-max 64 qwen3-30b mixtral > "$OUT/w/test_gpu_layer64.log" 2>&1
echo "test_gpu r125 layers <= 64: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_124 h_125 h_124 h_125; do echo "=== $b"; timeout 30 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
# (2b) the stamped Qwen3 forward whose up gemv asks L2 for its expert's W2 (instrument.py w2pf, h_w2pf, main's
# emitted sources): PF_MODE 0 none, 1 at a CTA's start, 2 after its rows; interleaved, three times
(cd build/sb && for rep in 1 2 3; do
    for m in 0 1 2; do echo "=== qwen3 PF_MODE=$m"; PF_MODE=$m timeout 30 ./h_w2pf 20 1 2 8; done
done
# (2c) the same forward (h_124: main's, Qwen3; h_mix: Mixtral) under the launcher's switches: PDL, the combine folded
# into the down gemv, both
for rep in 1 2; do
    for e in "X=0" "MOEGEN_PDL=on" "MOEGEN_COMBINE_FUSE=on" "MOEGEN_PDL=on MOEGEN_COMBINE_FUSE=on"; do
        echo "=== qwen3 $e"; env $e timeout 30 ./h_124 20 1 8
        echo "=== mixtral $e"; env $e timeout 30 ./h_mix 20 1 8
    done
done
echo "=== qwen3 PF_MODE=2 MOEGEN_PDL=on MOEGEN_COMBINE_FUSE=on"; PF_MODE=2 MOEGEN_PDL=on MOEGEN_COMBINE_FUSE=on timeout 30 ./h_w2pf 20 1 2 8
) > "$OUT/w/w2pf.log" 2>&1
echo "w2pf: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8; do
    for r in r124 r125 r124 r125; do
        [ $((SECONDS + 15)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 25 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
use r124
export LD_LIBRARY_PATH=$PWD/build/r124${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $((SECONDS + 80)) -le $BUDGET ] || break
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 80 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 128 --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^===|layer:" "$OUT/w/w2pf.log"
grep -v "^\s*$" "$OUT/w/stamps.log" | grep -E "===|tokens|phase|ticket|partsum|plan|rows|end|layer" | head -80
grep -E "^== |^1 .*route|^8 .*route|^64 .*route|LAYER graph" "$OUT/w/ab.log" | head -100
grep -E 'graph|^compare|flush|^==' "$OUT/w/compare.log" | head -60
tar -C "$OUT" -czf "$OUT/run126.tgz" w && rm -rf "$OUT/w"
