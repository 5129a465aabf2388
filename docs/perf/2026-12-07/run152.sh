#!/usr/bin/env bash
# Run 152 (twenty-seventh session): what is left of run 149, on builds of this session's main, in one call of ~300 s
# (bwd/ first, then q/, then fp8route/ with what is left: test_quant_gpu cut at 50 s, test_gpu <= 8 at 40 s).
#   fp8route/  run144.sh with NEW=r152 (branch land-route: main 3b6bbbf + patches/route_fp8_fuse.diff, kernels_out
#              and goldens regenerated) and BASE=r151 (branch fp8-mc, whose route is main's), test_quant_gpu cut at
#              120 s: test_quant_gpu, test_gpu <= 8 tokens, test_vendored, moe_bench --graph at 1 and 2 tokens;
#   q/         Qwen3's 4096-token bucket on row blocks of 256 (256 x 128, two consumers) and 192 (192 x 128, three) against
#              the shipped 64 x 256 ping-pong (tuned before those row blocks existed): moe_bench --graph at 4096 and
#              8192 tokens, q4096_rb256.tune / q4096_rb192.tune, interleaved, twice (r151);
#   bwd/       the weight gradients on a second stream beside the data gradients (r153 = main with
#              MOEGEN_WGRAD_SMS; docs/DESIGN.md, "The backward's second stream"): moe_bench --backward on Qwen3 and
#              Mixtral at 4096 tokens with it off, 33, 66 SMs; then test_bwd_gpu (train cases, examples; its
#              row-block case now expecting rowblock.tune's two GEMM variants) with MOEGEN_WGRAD_SMS=44 for what
#              is left. ("+ef" at 512 tokens, run143.sh, did not fit: a later call.)
# Carry ["build/r151", "build/r152", "build/r153"].
set -u
ROOT=$OUT
mkdir -p "$ROOT/bwd" "$ROOT/q"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
LD0=${LD_LIBRARY_PATH:-}
cp build/r153/moegen build/r153/libmoegen.so build/r153/libmoegen_ref.so build/r153/liblua5.4.so.0 \
    build/r153/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build/r153${LD0:+:$LD0}
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    for k in off 33 66; do
        [ $SECONDS -le 70 ] || break 2
        echo "== $s MOEGEN_WGRAD_SMS=$k" >> "$ROOT/bwd/backward.log"
        MOEGEN_WGRAD_SMS=$k timeout 30 build/r153/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 \
            >> "$ROOT/bwd/backward.log" 2>&1
        echo "backward $s $k: exit $? ($SECONDS s)" >> "$ROOT/bwd/rc.txt"
    done
done
grep -E "^== |^4096 +0 " "$ROOT/bwd/backward.log"
left=$((140 - SECONDS))
[ $left -ge 20 ] && MOEGEN_WGRAD_SMS=44 MOEGEN_TEST_PROGRESS=1 timeout $left stdbuf -oL -eL \
    build/r153/test_bwd_gpu train examples > "$ROOT/bwd/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu (MOEGEN_WGRAD_SMS=44): exit $? ($SECONDS s)" >> "$ROOT/bwd/rc.txt"
cat "$ROOT/bwd/rc.txt"; tail -1 "$ROOT/bwd/test_bwd_gpu.log"
grep -m5 FAIL "$ROOT/bwd/test_bwd_gpu.log"
export LD_LIBRARY_PATH=$PWD/build/r151${LD0:+:$LD0}
for rep in 1 2; do
    for t in tuning/h200.tune docs/perf/2026-12-07/q4096_rb256.tune docs/perf/2026-12-07/q4096_rb192.tune; do
        [ $SECONDS -le 185 ] || break 2
        echo "== $t rep=$rep" >> "$ROOT/q/ab.log"
        MOEGEN_TUNING=$PWD/$t timeout 30 build/r151/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --tokens 4096 \
            --tokens 8192 --iters 20 >> "$ROOT/q/ab.log" 2>&1
    done
done
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$ROOT/q/ab.log"
export LD_LIBRARY_PATH=$LD0
OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=50 TG=40 bash docs/perf/2026-12-07/run144.sh 110
cd "$ROOT" && tar czf run152.tgz --remove-files fp8route q bwd
