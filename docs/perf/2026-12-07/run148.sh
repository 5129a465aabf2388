#!/usr/bin/env bash
# Run 148 (twenty-sixth session): the CTA pairs (+mc) again, their remote stage releases without the cluster-scope
# fence (templates/gemm_sm90.lua, release: mbarrier.arrive's default semantics, as CUTLASS's cluster barrier;
# with .release.cluster each kernel had 56 instructions more and run 146 measured the pairs 1.6-2.3x slower).
# Written in the twenty-sixth session, NOT run (no device time left). r148 = main 59ed566 (the pair grid capped at
# half the SMs) + patches/mc_release_cta.diff; the resident-pair count it prints is the driver's answer, before the cap
# (git apply it, make -j2 all build/moe_bench build/tests/test_gpu build/libmoegen_ref.so
# build/tests/test_vendored_pairs, copy and strip with test_vendored_pairs beside the rest; main keeps the
# GPU-tested .release.cluster form until this measures the other). Land the patch if (3) passes and (2) shows the
# pairs no slower than before. Carry ["build/r148"]. $1: budget in seconds (default 330).
# (1) moe_bench on Mixtral at 4096 under mc.tune (prints the resident pairs);
# (2) moe_bench --graph, the shipped table against mc.tune, interleaved, twice (as run 146);
# (3) test_gpu gemm under tests/tune/pairs.tune, test_vendored_pairs; (4) Nsight Compute of the first up GEMM at
# 4096 tokens under mc.tune (grid, cluster size, SM activity, warp states: run147.sh's); (5) test_gpu layer under
# pairs.tune with what is left.
set -u
BUDGET=${1:-330}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=${B:-build/r148}
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MC=$PWD/docs/perf/2026-12-07/mc.tune BASE=$PWD/tuning/h200.tune PAIRS=$PWD/tests/tune/pairs.tune
MOEGEN_TUNING=$MC timeout 60 $B/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 5 > "$OUT/w/bench.log" 2>&1
echo "bench: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in mixtral-8x7b:128,512,4096,16384 deepseek-v3-ep8:128,512,4096,16384 qwen3-30b-a3b:512,4096,16384; do
        spec=${s%%:*}; toks=${s#*:}
        for tab in base mc; do
            [ $((SECONDS + 30)) -le $((BUDGET - 110)) ] || break 3
            if [ $tab = mc ]; then tt=$MC; else tt=$BASE; fi
            echo "== $spec $tab rep=$rep" >> "$OUT/w/ab.log"
            MOEGEN_TUNING=$tt timeout 40 $B/moe_bench examples/specs/$spec.moe --graph $(for t in ${toks//,/ }; do
                echo --tokens $t; done) --iters 20 >> "$OUT/w/ab.log" 2>&1
            echo "ab $spec $tab $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
MOEGEN_TUNING=$PAIRS timeout 70 stdbuf -oL -eL $B/test_gpu --family gemm > "$OUT/w/test_gpu_pairs_gemm.log" 2>&1
echo "test_gpu gemm (pairs.tune): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 30 $B/test_vendored_pairs examples/specs/qwen3-30b-a3b.moe > "$OUT/w/test_vendored_pairs.log" 2>&1
echo "test_vendored_pairs: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
MOEGEN_TUNING=$MC timeout 60 ncu --kernel-name regex:gemm_up_swiglu --launch-count 1 --section LaunchStats \
    --section Occupancy --section SpeedOfLight --section WarpStateStats --metrics \
    sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_elapsed.max,launch__cluster_dim_x,launch__grid_size \
    $B/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 1 > "$OUT/w/ncu_mc.log" 2>&1
echo "ncu mc: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
left=$((BUDGET - SECONDS - 5))
[ $left -ge 20 ] && MOEGEN_TUNING=$PAIRS timeout $left stdbuf -oL -eL $B/test_gpu --family layer \
    > "$OUT/w/test_gpu_pairs_layer.log" 2>&1
echo "test_gpu layer (pairs.tune): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "CTA pairs" "$OUT/w/bench.log"
grep -E "Cluster|Grid Size|Waves|Duration|SM Busy|Stall|Warp Cycles|sm__|launch__" "$OUT/w/ncu_mc.log" | head -40
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$OUT/w/ab.log" | head -150
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
