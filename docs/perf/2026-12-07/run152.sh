#!/usr/bin/env bash
# Run 152 (twenty-seventh session): what is left of run 149, on builds of this session's main, in one call.
#   fp8route/  run144.sh with NEW=r152 (branch land-route: main 3b6bbbf + patches/route_fp8_fuse.diff, kernels_out
#              and goldens regenerated) and BASE=r151 (branch fp8-mc, whose route is main's), test_quant_gpu cut at
#              120 s: test_quant_gpu, test_gpu <= 8 tokens, test_vendored, moe_bench --graph at 1 and 2 tokens;
#   ef/        run143.sh with B=build/r151 (80 s): "+ef" at the 512-token buckets of the EP8 rank, Qwen3, OLMoE,
#              gpt-oss-20b;
#   q/         Qwen3's 4096-token bucket on row blocks of 256 (256 x 128, two consumers) and 192 (192 x 128, three) against
#              the shipped 64 x 256 ping-pong (tuned before those row blocks existed): moe_bench --graph at 4096 and
#              8192 tokens, q4096_rb256.tune / q4096_rb192.tune, interleaved, twice (r151);
#   bwd/       test_bwd_gpu train_softmax (main's test, whose row-block case now expects rowblock.tune's two
#              GEMM variants; r151's library) for what is left.
# Carry ["build/r151", "build/r152"].
set -u
ROOT=$OUT
OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=120 bash docs/perf/2026-12-07/run144.sh 290
OUT=$ROOT/ef B=build/r151 bash docs/perf/2026-12-07/run143.sh 80
mkdir -p "$ROOT/bwd" "$ROOT/q"
export LD_LIBRARY_PATH=$PWD/build/r151 MOEGEN_CACHE_DIR=/tmp/moegen_cache
for rep in 1 2; do
    for t in tuning/h200.tune docs/perf/2026-12-07/q4096_rb256.tune docs/perf/2026-12-07/q4096_rb192.tune; do
        [ $SECONDS -le 440 ] || break 2
        echo "== $t rep=$rep" >> "$ROOT/q/ab.log"
        MOEGEN_TUNING=$PWD/$t timeout 30 build/r151/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --tokens 4096 \
            --tokens 8192 --iters 20 >> "$ROOT/q/ab.log" 2>&1
    done
done
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$ROOT/q/ab.log"
cp build/r151/moegen build/r151/libmoegen.so build/r151/libmoegen_ref.so build/r151/liblua5.4.so.0 \
    build/r151/libjansson.so.4 build/
left=$((490 - SECONDS))
[ $left -ge 20 ] && MOEGEN_CACHE_DIR=/tmp/moegen_cache MOEGEN_TEST_PROGRESS=1 timeout $left stdbuf -oL -eL \
    build/r151/test_bwd_gpu train_softmax > "$ROOT/bwd/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu train_softmax: exit $? ($SECONDS s)"; tail -1 "$ROOT/bwd/test_bwd_gpu.log"
grep -m5 FAIL "$ROOT/bwd/test_bwd_gpu.log"
cd "$ROOT" && tar czf run152.tgz --remove-files fp8route ef q bwd
