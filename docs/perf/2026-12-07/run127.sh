#!/usr/bin/env bash
# Run 127 (twenty-third session): run124.sh reordered and trimmed for a short call (device starts kept failing),
# with the up gemv's W2 prefetch, the launcher's switches and the skip bounds added.
# Builds as run124.sh says (build/r124 = main 0755cb7's, build/r125 = the same + patches/route_acqrel_tickets.diff,
# build/sb: stamped harnesses h_124 / h_125 (Qwen3, main / patched), h_mix (Mixtral, main, instrument.py skips), h_w2pf
# (Qwen3, main, instrument.py w2pf skips)). Carry ["build/r124", "build/r125", "build/sb"]. $1: the budget in seconds (default 400).
# (1) the up gemv asking L2 for its expert's W2: PF_MODE 0 none, 1 at a CTA's start, 2 after its rows, 5 / 6 the
# same with an evict_last policy; (2) the launcher's switches (PDL, combine folded) through the same forward;
# (3) r125's route on a GPU (test_gpu --family route to 1000 tokens); (4) the route timeline, r124 against r125;
# (5) moe_bench --graph A/B r124 / r125 at 1 / 8 / 64 tokens; (6) compare_torch's peers on r124.
set -u
BUDGET=${1:-400}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
(cd build/sb && for rep in 1 2; do
    for m in 0 1 2 5 6; do echo "=== qwen3 PF_MODE=$m"; PF_MODE=$m timeout 30 ./h_w2pf 20 1 2 8; done
done
for e in "X=0" "MOEGEN_PDL=on" "MOEGEN_COMBINE_FUSE=on" "MOEGEN_PDL=on MOEGEN_COMBINE_FUSE=on"; do
    echo "=== qwen3 $e"; env $e timeout 30 ./h_124 20 1 8
    echo "=== mixtral $e"; env $e timeout 30 ./h_mix 20 1 8
done
echo "=== qwen3 PF_MODE=2 MOEGEN_PDL=on"; PF_MODE=2 MOEGEN_PDL=on timeout 30 ./h_w2pf 20 1 2 8
# bounds (instrument.py skips): the layer without its combine, without its route (the GEMMs on the first call's
# tables), without both; one token count a process
for T in 1 8; do
    for e in "X=0" "SKIP_COMBINE=1" "SKIP_ROUTE=1" "SKIP_ROUTE=1 SKIP_COMBINE=1"; do
        echo "=== qwen3 T=$T $e"; env $e timeout 30 ./h_w2pf 20 $T
        echo "=== mixtral T=$T $e"; env $e timeout 30 ./h_mix 20 $T
    done
done
) > "$OUT/w/w2pf.log" 2>&1
echo "w2pf: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r125
timeout 90 stdbuf -oL -eL build/r125/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b > "$OUT/w/test_gpu_route1000.log" 2>&1
echo "test_gpu r125 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_124 h_125 h_124 h_125; do echo "=== $b"; timeout 30 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
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
grep -E "^===|layer:" "$OUT/w/w2pf.log"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens|layer" "$OUT/w/stamps.log" | head -40
grep -E "^== |^1 .*route|^8 .*route|^64 .*route|LAYER graph" "$OUT/w/ab.log" | head -60
grep -E 'graph|^compare|flush|^==' "$OUT/w/compare.log" | head -60
