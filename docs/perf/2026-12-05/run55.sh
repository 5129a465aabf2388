#!/usr/bin/env bash
# Run 55 (2026-12-05, seventh session): main's backward on the meshes one GPU hosts — test_bwd_gpu's EP cases
# (every rank on one GPU, the harness moving rows as the transfer lists say) and its dp x fsdp cases, each with
# its own time limit (run 48's 60 s was too short for the EP cases: no verdict), progress printed. Then Nsight
# Compute of two wgrads: branch wgrad-tma's Mixtral wgrad_up (build/tm; run 54: slower than main's) and main's
# Qwen3 wgrad_up (1.6 GB of fp32 gradient for 0.2 TFLOP: bound by the writes?).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
v test_bwd_gpu_ep 200 build/tests/test_bwd_gpu ep
v test_bwd_gpu_fsdp 90 build/tests/test_bwd_gpu fsdp
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for s in mixtral-8x7b qwen3-30b-a3b; do { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe; done
for c in "tm mixtral-8x7b build/tm/moe_bench" "main qwen3-30b-a3b build/moe_bench"; do
    set -- $c
    timeout 75 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_write.sum,dram__bytes_read.sum,lts__t_bytes.sum \
        -k 'regex:wgrad_up' --launch-count 1 $3 /tmp/train_$2.moe --backward --tokens 4096 --iters 1 > "$OUT/ncu_$1_$2.log" 2>&1
    echo "ncu $1 $2: exit $?" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
for f in "$OUT"/ncu_*.log; do
    echo "== $(basename $f)"
    grep -E 'wgrad_up_|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache|Compute \(SM\)|hmma|dram__bytes|lts__t_bytes|L2 Hit' "$f" | head -14
done
for f in test_bwd_gpu_ep test_bwd_gpu_fsdp; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL" "$OUT/$f.log" | head -5
done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
