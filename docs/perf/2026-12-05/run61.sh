#!/usr/bin/env bash
# Run 61 (2026-12-05, eighth session), ~500 s: run 59 (branch dgrad-up-pp, its build at build/dp/), the first half
# of run 58 (main e609034's own build: test_bgemm_gpu, its memcheck, test_bwd_gpu's four train specs) and Nsight
# Compute of the fp8 up GEMM (Mixtral fp8, channel scales; the EP8 rank fp8, block scales) at 4096 tokens on the
# shipped e4m3 entries, to see what bounds the fp8 main loop (#20).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
if v dp_test_bgemm_gpu 60 build/dp/test_bgemm_gpu; then
    for s in mixtral-8x7b qwen3-30b-a3b; do
        { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
        for b in build/moe_bench build/dp/moe_bench; do
            echo "== $s $b" >> "$OUT/backward.log"
            timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
            echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
        done
    done
fi
v test_bgemm_gpu 50 build/tests/test_bgemm_gpu
v memcheck_bgemm 90 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_bgemm_gpu
v test_bwd_gpu_train 120 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    timeout 60 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section LaunchStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__pcsamp_warps_issue_stalled_wait.avg,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
        -k 'regex:gemm_(up|down)' --launch-count 2 build/moe_bench examples/specs/fp8/$s.moe --tokens 4096 --iters 1 \
        > "$OUT/ncu_$s.log" 2>&1
    echo "ncu $s: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in dp_test_bgemm_gpu test_bgemm_gpu memcheck_bgemm test_bwd_gpu_train; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5
done
grep -E '^== |^4096' "$OUT/backward.log" 2>/dev/null
for f in "$OUT"/ncu_*.log; do
    echo "== $(basename $f)"
    grep -E 'gemm_|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Compute \(SM\)|hmma|gmma|wavefronts|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Registers Per|Grid Size' "$f" | head -30
    grep -iE 'stall|est\. speedup' "$f" | head -10
done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
