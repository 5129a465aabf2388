#!/usr/bin/env bash
# Qwen3's 4096-token bucket on row blocks of 256 (256 x 128, two consumers) and 192 (192 x 128, three) against the
# shipped 64 x 256 ping-pong (tuned before those row blocks existed): moe_bench --graph at 4096 and 8192 tokens under
# tuning/h200.tune, q4096_rb256.tune, q4096_rb192.tune, interleaved, twice, into $OUT/ab.log. Used by run152.sh and
# run156.sh. $1: the build folder (default build/r151); $2: stop starting runs past this many seconds (default 60).
set -u
B=${1:-build/r151}
STOP=${2:-60}
mkdir -p "$OUT"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
for rep in 1 2; do
    for t in tuning/h200.tune docs/perf/2026-12-07/q4096_rb256.tune docs/perf/2026-12-07/q4096_rb192.tune; do
        [ $SECONDS -le $STOP ] || break 2
        echo "== $t rep=$rep" >> "$OUT/ab.log"
        MOEGEN_TUNING=$PWD/$t timeout 30 $B/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --tokens 4096 \
            --tokens 8192 --iters 20 >> "$OUT/ab.log" 2>&1
    done
done
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$OUT/ab.log"
