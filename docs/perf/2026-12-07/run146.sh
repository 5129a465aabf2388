#!/usr/bin/env bash
# Run 146 (twenty-sixth session): CTA pairs with B multicast ("+mc", templates/gemm_sm90.lua), first GPU run.
# r146 = main (the +mc grids, this commit; the shipped table has no +mc entry). mc.tune = tuning/h200.tune with "+mc" on
# every persist / pingpong bf16 entry of Mixtral, the DeepSeek-V3 EP8 rank and Qwen3-30B-A3B.
# (1) a first check: test_gpu gemm under tests/tune/pairs.tune (every test shape in pairs: persist below 64
#     tokens, ping-pong from 64; a hang is cut by timeout), then test_vendored_pairs (the vendored launcher);
# (2) moe_bench --graph, the shipped table against mc.tune, interleaved, twice: Mixtral and the EP8 rank at
#     128 / 512 / 4096 / 16384 tokens, Qwen3 at 512 / 4096 / 16384;
# (3) test_gpu gemm,layer under pairs.tune, then on the three specs under mc.tune, as the budget allows.
# Carry ["build/r146"] (test_vendored_pairs beside the others). $1: budget in seconds (default 540).
set -u
BUDGET=${1:-540}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r146
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MC=$PWD/docs/perf/2026-12-07/mc.tune
BASE=$PWD/tuning/h200.tune
PAIRS=$PWD/tests/tune/pairs.tune
[ "${SKIP_FIRST:-0}" = 1 ] || MOEGEN_TUNING=$PAIRS timeout 100 stdbuf -oL -eL $B/test_gpu --family gemm > "$OUT/w/test_gpu_first.log" 2>&1
first=$?
echo "test_gpu gemm (pairs.tune): exit $first ($SECONDS s)" >> "$OUT/w/rc.txt"
[ "${SKIP_FIRST:-0}" = 1 ] || timeout 60 $B/test_vendored_pairs examples/specs/qwen3-30b-a3b.moe > "$OUT/w/test_vendored_pairs.log" 2>&1
echo "test_vendored_pairs: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
# a hang (cut with nothing passed since its last case line): nothing more under mc
[ $first -eq 124 ] && ! tail -1 "$OUT/w/test_gpu_first.log" | grep -q "0 failed" && BUDGET=0
for rep in 1 2; do
    for s in mixtral-8x7b:128,512,4096,16384 deepseek-v3-ep8:128,512,4096,16384 qwen3-30b-a3b:512,4096,16384; do
        spec=${s%%:*}; toks=${s#*:}
        for tab in base mc; do
            [ $((SECONDS + 30)) -le $((BUDGET - 120)) ] || break 3
            if [ $tab = mc ]; then tt=$MC; else tt=$BASE; fi
            echo "== $spec $tab rep=$rep" >> "$OUT/w/ab.log"
            MOEGEN_TUNING=$tt timeout 40 $B/moe_bench examples/specs/$spec.moe --graph $(for t in ${toks//,/ }; do
                echo --tokens $t; done) --iters 20 >> "$OUT/w/ab.log" 2>&1
            echo "ab $spec $tab $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
left=$((BUDGET - SECONDS - 10))
[ $left -ge 30 ] && MOEGEN_TUNING=$PAIRS timeout $left stdbuf -oL -eL $B/test_gpu --family layer \
    > "$OUT/w/test_gpu_pairs_layer.log" 2>&1
echo "test_gpu layer (pairs.tune): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
left=$((BUDGET - SECONDS - 10))
[ $left -ge 30 ] && MOEGEN_TUNING=$MC timeout $left stdbuf -oL -eL $B/test_gpu --family gemm,layer \
    mixtral deepseek-v3-ep8 qwen3-30b > "$OUT/w/test_gpu_mc.log" 2>&1
echo "test_gpu gemm,layer (mc): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |^gemms at|^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$OUT/w/ab.log" | head -150
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
