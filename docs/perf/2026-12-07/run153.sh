#!/usr/bin/env bash
# Run 153 (written in the twenty-seventh session for a later one; NOT run): where the CTA pairs lose. Run 151 measured
# the bf16 pairs 1.2-1.3x slower than the same tiles without them at 4096-16384 tokens and profiled only the pair
# kernel (L2 85 % busy, DRAM 59 %). This profiles both forms of Mixtral's up GEMM at 4096 tokens (shipped table: the
# pingpong 64 x 256 tile; mc.tune: the same tile in pairs) and the fp8 Mixtral up GEMM (persist 128 x 256 x 128,
# shipped against fp8mc.tune), with the L2 and crossbar byte counts: if the pairs' multicast halves the weight bytes
# L2 serves (lts__t_sectors_srcunit_tex_op_read) but the L2 stays as busy, the limit is elsewhere (the in-step ring);
# if the bytes do not halve, the multicast is not saving what it should. Build: main (moegen, moe_bench, libs as
# run151.sh's r151). Carry ["build/r151"] (or a later main build). $1: budget in seconds (default 300).
set -u
BUDGET=${1:-300}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
B=${B:-build/r151}
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
M="lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_bytes.sum"
M="$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
M="$M,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct"
for c in "examples/specs/mixtral-8x7b.moe tuning/h200.tune base" "examples/specs/mixtral-8x7b.moe docs/perf/2026-12-07/mc.tune mc" \
         "examples/specs/fp8/mixtral-8x7b-fp8.moe tuning/h200.tune fp8base" \
         "examples/specs/fp8/mixtral-8x7b-fp8.moe docs/perf/2026-12-07/fp8mc.tune fp8mc"; do
    set -- $c
    [ $((SECONDS + 60)) -le $BUDGET ] || break
    MOEGEN_TUNING=$PWD/$2 timeout 90 ncu --kernel-name regex:gemm_up_swiglu --launch-count 1 --metrics "$M" \
        $B/moe_bench $1 --tokens 4096 --iters 1 > "$OUT/w/ncu_$3.log" 2>&1
    echo "ncu $3: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/ncu_*.log; do echo "== $f"; grep -E "gemm_up|lts__|dram__|l1tex__|sm__pipe|gpu__time|smsp__" "$f"; done
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
