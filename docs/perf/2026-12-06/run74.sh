#!/usr/bin/env bash
# Run 74 (eleventh session, 2026-12-06): decode and backward A/B and GPU tests in one call of at most ~520 s, for a session whose
# device time went mostly to refused starts. Builds (docs/PERF.md, 2026-12-06): build/{cur,pf,rb,g3,s64}, carried.
# Each step is skipped once the call has run past its start budget, so the logs that come back are whole.
set -u
B=${1:-520}   # the call's budget in seconds: each step's start limit is a share of it
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc ($SECONDS s)" >> "$OUT/rc.txt"; return $rc; }
# 1. decode: main (cur), gemv-pf (pf), gemv3 under gemv3.tune (g3), route split 64 (s64); graph replay, 1..8 tokens
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8; do
    case $s in qwen3*|gpt*) builds="cur pf g3 s64 cur pf g3 s64" ;; *) builds="cur pf g3 s64" ;; esac
    for b in $builds; do
        [ $SECONDS -gt $((B / 2)) ] && break 2
        echo "== $s $b" >> "$OUT/decode.log"
        [ $b = g3 ] && export MOEGEN_TUNING=build/g3/gemv3.tune || unset MOEGEN_TUNING
        timeout 30 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 \
            --iters 20 >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
# 2. router-tc's backward on the GPU: every train spec
[ $SECONDS -lt $((B * 58 / 100)) ] && v rb_test_bwd_gpu $((B * 17 / 100)) build/rb/test_bwd_gpu
# 3. the forward's tests of gemv3 (gemv3.tune: 1..7 tokens) + the prefetching gemv (8..64) + the route split 64
cp build/g3/moegen build/moegen
[ $SECONDS -lt $((B * 75 / 100)) ] && MOEGEN_TUNING=build/g3/gemv3.tune v g3_test_gpu $((B * 14 / 100)) \
    build/g3/test_gpu --tokens-max 64 qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8
# 4. the backward A/B, Qwen3 at 16384 tokens
{ cat examples/specs/qwen3-30b-a3b.moe; echo "training = true"; } > /tmp/train_q.moe
for b in cur rb; do
    [ $SECONDS -gt $((B * 90 / 100)) ] && break
    echo "== qwen3-30b-a3b $b" >> "$OUT/backward.log"
    timeout 25 build/$b/moe_bench /tmp/train_q.moe --backward --tokens 16384 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in rb_test_bwd_gpu g3_test_gpu; do [ -f "$OUT/$f.log" ] && tail -n 1 "$OUT/$f.log"; grep FAIL "$OUT/$f.log" 2>/dev/null | head -3; done
[ -f "$OUT/decode.log" ] && python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" gemm_up_swiglu gemm_down route
grep -E "^== |router  |^16384   0" "$OUT/backward.log" 2>/dev/null
