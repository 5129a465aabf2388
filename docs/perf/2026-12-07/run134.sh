#!/usr/bin/env bash
# Run 134 (twenty-fourth session): the route's split as a thread-block cluster (r134 = main 4c02183: partials summed
# by rank 0 through DSMEM; specs with hidden <= 2048 split into at most 8 blocks take it, wider ones keep the
# ticket) on a GPU: (1) test_gpu --family route <= 100 tokens on the specs that cluster and some that do not;
# (2) test_gpu every family <= 8 on Qwen3-30B and OLMoE; (3) test_vendored (the vendored launcher's cluster launch);
# (4) stamps h_132 / h_134 (MOEGEN_PDL=off); (5) moe_bench --graph r132 / r134 interleaved, twice, Qwen3 and OLMoE
# at 1 / 8 / 64 tokens. Carry ["build/r132", "build/r134", "build/sb"].
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r134
timeout 60 stdbuf -oL -eL build/r134/test_gpu --family route --tokens-max 100 qwen3-30b olmoe softcap zero_experts \
    training group_12e given_ids router_own_input gpt-oss-20b > "$OUT/w/test_gpu_r134_route100.log" 2>&1
echo "test_gpu r134 route <= 100: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 40 stdbuf -oL -eL build/r134/test_gpu --tokens-max 8 qwen3-30b olmoe > "$OUT/w/test_gpu_r134_8.log" 2>&1
echo "test_gpu r134 all families <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 30 build/r134/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/w/test_vendored_r134.log" 2>&1
echo "test_vendored r134: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_132 h_134 h_132 h_134; do echo "=== $b"; MOEGEN_PDL=off timeout 20 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in qwen3-30b-a3b olmoe-1b-7b; do
        for r in r132 r134; do
            [ $SECONDS -le 150 ] || break 3
            use $r
            echo "== $s $r rep=$rep" >> "$OUT/w/ab.log"
            timeout 20 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --iters 20 \
                >> "$OUT/w/ab.log" 2>&1
        done
    done
    echo "ab rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens 1:|phase1|ticket|partsum|phase2|plan |end " "$OUT/w/stamps.log" | head -40
grep -E "^== |^1 .*route|LAYER graph" "$OUT/w/ab.log" | head -60
