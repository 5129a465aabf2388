#!/usr/bin/env bash
# Run 52 (2026-12-05, seventh session): the wgrads, where their time goes. ~300 s.
#   build/pc: branch wgrad-persist (the wgrads persistent, both warpgroups on each 128-row tile, the producer
#     loading the next tile's k tiles during the stores); build/pp: branch wgrad-pingpong (run 51: correct, slower)
#   - test_bgemm_gpu of build/pc
#   - moe_bench --backward at 4096 tokens, Mixtral and Qwen3: main (1ee9c24) against build/pc
#   - Nsight Compute of Mixtral's wgrad_up: main's (one CTA per tile), pc's and pp's
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v pc_test_bgemm_gpu 60 build/pc/test_bgemm_gpu
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/moe_bench build/pc/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 40 $b /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in build/moe_bench build/pc/moe_bench build/pp/moe_bench; do
    n=$(echo $b | tr / _)
    timeout 90 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_write.sum,dram__bytes_read.sum,lts__t_bytes.sum \
        -k 'regex:wgrad_up' --launch-count 1 $b /tmp/train_mixtral-8x7b.moe --backward --tokens 4096 --iters 1 \
        > "$OUT/ncu_$n.log" 2>&1
    echo "ncu $b: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
echo "-- pc_test_bgemm_gpu: $(tail -n 1 $OUT/pc_test_bgemm_gpu.log)"; grep -E "FAIL" "$OUT/pc_test_bgemm_gpu.log" | head -5
grep -E '^== |^4096' "$OUT/backward.log"
for f in "$OUT"/ncu_*.log; do
    echo "== $(basename $f)"
    grep -E 'wgrad_up|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Compute \(SM\)|hmma|dram__bytes|lts__t_bytes|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Registers Per|Dynamic Shared|Grid Size' "$f" | head -24
    grep -iE 'stall|est\. speedup' "$f" | head -8
done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
