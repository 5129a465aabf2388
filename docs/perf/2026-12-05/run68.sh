#!/usr/bin/env bash
# Run 68 (written 2026-12-05, eighth session; NOT run: no device time left). ~400 s. Builds to carry:
#   build/        main (its moe_bench, tests/test_bwd_gpu, libmoegen.so + liblua5.4.so.0 + libjansson.so.4)
#   build/alt/    branch fp8-alternate (ed9490e): moe_bench, test_quant_gpu  (git worktree add ... fp8-alternate;
#                 make build/moe_bench build/tests/test_quant_gpu; copy both, strip --strip-debug)
#   build/old/    main e609034's moe_bench (before dgrad_up's ping-pong)
# What it asks:
#   - fp8-alternate: the two fp8 consumer warpgroups taking turns on the tensor cores one 128-column half at a
#     time (each promotes while the other's group runs alone). Correct? (test_quant_gpu on the shipped table and
#     under tests/tune/fp8p.tune) Faster? (moe_bench of the three fp8 specs at 4096 and 16384 tokens, main and
#     the branch in this call)
#   - dgrad_up on the ping-pong grid, a same-call pair on this card: Mixtral's backward at 4096 tokens, old
#     against main (run 61's pair was on an H200)
#   - run60: Nsight Compute of Qwen3's backward router stage (bwd_dwr, bwd_dx)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v alt_test_quant_gpu 120 build/alt/test_quant_gpu; then
    MOEGEN_TUNING=tests/tune/fp8p.tune v alt_test_quant_gpu_fp8p 120 build/alt/test_quant_gpu
    for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
        for b in build/moe_bench build/alt/moe_bench; do
            echo "== $s $b" >> "$OUT/fp8_bench.log"
            timeout 25 $b examples/specs/fp8/$s.moe --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/fp8_bench.log" 2>&1
            echo "bench $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
fi
{ cat examples/specs/mixtral-8x7b.moe; echo "training = true"; } > /tmp/train_mixtral.moe
for b in build/old/moe_bench build/moe_bench; do
    echo "== mixtral $b" >> "$OUT/backward.log"
    timeout 40 $b /tmp/train_mixtral.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $b: exit $?" >> "$OUT/rc.txt"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
{ cat examples/specs/qwen3-30b-a3b.moe; echo "training = true"; } > /tmp/train_qwen3.moe
timeout 80 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section LaunchStats --section Occupancy -k 'regex:bwd_dwr|bwd_dx' --launch-count 3 \
    build/moe_bench /tmp/train_qwen3.moe --backward --tokens 4096 --iters 1 > "$OUT/ncu_qwen3_router.log" 2>&1
echo "ncu router: exit $?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
for f in alt_test_quant_gpu alt_test_quant_gpu_fp8p; do
    [ -f "$OUT/$f.log" ] && { echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep FAIL "$OUT/$f.log" | head -5; }
done
grep -E '^== |gemm_|LAYER' "$OUT/fp8_bench.log" 2>/dev/null
grep -E '^== |^4096' "$OUT/backward.log"
grep -E 'bwd_dwr|bwd_dx|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache|Compute \(SM\)|Grid Size' \
    "$OUT/ncu_qwen3_router.log" | head -40
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
