#!/usr/bin/env bash
# Run 132 (twenty-fourth session; run131.sh before the 1-token plan was added): r132 = main 6856a75 (the route's
# slot_of by cp.async, one token's early x copy and its plan without a scan; launch overlap per call size,
# MOEGEN_PDL unset = the tuning table's +pdl marks) and r131 = main 6eb9e57 (the same without the 1-token plan).
# (1) test_gpu, every family, <= 16 tokens, on Qwen3-30B, OLMoE, gpt-oss-20b, Mixtral (the marked buckets' calls run
# with overlap; test_gpu checks moe_plan_pdl and each call's launcher against the marks); (2) test_gpu --family
# route <= 1000 on four specs; (3) the stamped timelines h_124 / h_129 / h_131 / h_132 with MOEGEN_PDL=off (the
# route alone); (4) moe_bench --graph r124 (main 0755cb7) / r131 / r132 / r132 with MOEGEN_PDL=off, interleaved, twice, at
# 1 / 8 / 64 tokens; (5) compare_torch --graph on r132 (torch._grouped_mm, the eager layer) for Qwen3 and OLMoE.
# $1: the budget in seconds (default 360). Carry ["build/r124", "build/r131", "build/r132", "build/sb"].
set -u
BUDGET=${1:-360}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r132
timeout 150 stdbuf -oL -eL build/r132/test_gpu --tokens-max 16 qwen3-30b olmoe gpt-oss-20b mixtral zero_experts softcap \
    > "$OUT/w/test_gpu_r132_16.log" 2>&1
echo "test_gpu r132 all families <= 16: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 90 stdbuf -oL -eL build/r132/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b >> "$OUT/w/test_gpu_r132_route1000.log" 2>&1
echo "test_gpu r132 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_124 h_129 h_131 h_132 h_124 h_129 h_131 h_132; do echo "=== $b"; MOEGEN_PDL=off timeout 30 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in qwen3-30b-a3b olmoe-1b-7b gpt-oss-20b mixtral-8x7b; do
        for r in r124 r131 r132 r132off; do
            [ $((SECONDS + 15)) -le $BUDGET ] || break 3
            b=${r%off}; use $b
            echo "== $s $r rep=$rep" >> "$OUT/w/ab.log"
            if [ "$r" = r132off ]; then pdl=off; else pdl=; fi
            MOEGEN_PDL=$pdl timeout 25 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
                --tokens 64 --iters 20 >> "$OUT/w/ab.log" 2>&1
        done
    done
    echo "ab rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
use r132
export LD_LIBRARY_PATH=$PWD/build/r132${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b olmoe-1b-7b; do
    [ $((SECONDS + 60)) -le $BUDGET ] || break
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 60 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 512 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens 1:|phase1|ticket|partsum|phase2|plan |end " "$OUT/w/stamps.log" | head -60
grep -E "^== |^1 .*route|LAYER graph|launch overlap" "$OUT/w/ab.log" | head -150
grep -E "^== |layer|x floor|floor" "$OUT/w/compare.log" | head -40
