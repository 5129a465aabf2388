#!/usr/bin/env bash
# Run 109 (eighteenth session), from build/r107 (main 22a5283's binaries; the sm_90a GEMM templates unchanged since
# 2cbc973) and build/r104/boxramp:
# 1. moegen tune at 1, 2, 4, 8 tokens over the gemv, gemv3, stream and chain grids for Qwen3 and gpt-oss-20b: run 108's
#    Nsight Compute put the shipped gemv GEMMs at 2 CTAs an SM (128 registers) and Qwen3's 1-token up GEMM at 1.45
#    waves (384 CTAs), 67 % of DRAM; gemv3 (3 CTAs an SM) makes it one wave. Qwen3's 1-token entry predates gemv3.
# 2. the route kernel at 1 Qwen3 token, SASS with warp-stall samples every 32 cycles (run 108's default interval
#    gave 44 samples).
# 3. run104.sh's Nsight Compute of the TMA GEMMs at 128 rows an expert and at 16384 tokens (MOEGEN_GATHER=off) and
#    the gathering up GEMM at 4096, then boxramp (its test_gpu part dropped: that build is stale).
# carry ["build/r107", "build/r104"]
set -u
mkdir -p "$OUT/t" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/t/gpu.txt"
B=build/r107
cp $B/moegen build/moegen
for s in qwen3-30b-a3b gpt-oss-20b; do
    timeout ${TUNE_S:-150} $B/moegen tune examples/specs/$s.moe --tokens 1,2,4,8 --grid gemv,gemv3,stream,chain \
        --iters 20 > "$OUT/t/tune_$s.tune" 2> "$OUT/t/tune_$s.log"
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --warp-sampling-interval 0 --section SourceCounters --section WarpStateStats \
    -k regex:route --launch-skip 2 --launch-count 1 --page source --print-source sass --csv \
    $B/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/t/ncu_route_sass.log" 2>&1
echo "ncu route sass: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
M="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__cycles_active.avg"
for job in "mixtral-8x7b 512 gemm_up" "mixtral-8x7b 512 gemm_down" "deepseek-v3-ep8 512 gemm_up" \
           "mixtral-8x7b 16384 gemm_up" "mixtral-8x7b 4096 gemm_up on"; do
    set -- $job
    MOEGEN_GATHER=${4:-off} timeout 60 $NCU --clock-control none --set full --metrics "$M" -k "regex:$3" --launch-skip 2 \
        --launch-count 1 $B/moe_bench examples/specs/$1.moe --tokens $2 --iters 1 > "$OUT/t/ncu_$1_$2_$3${4:+_$4}.log" 2>&1
    echo "ncu $job: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
done
for shape in "8 28672 4096" "8 4096 14336" "32 4096 7168" "128 1536 2048"; do   # Mixtral up, down; EP8 up; Qwen3 up
    timeout 40 build/r104/boxramp $shape >> "$OUT/t/boxramp.log" 2>&1
    echo "boxramp $shape: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
done
cat "$OUT/t/rc.txt"
for s in qwen3-30b-a3b gpt-oss-20b; do echo "== $s"; grep -v "^#" "$OUT/t/tune_$s.tune"; tail -n 40 "$OUT/t/tune_$s.log"; done
cat "$OUT/t/boxramp.log"
for f in "$OUT"/t/ncu_[md]*.log; do
    echo "== $(basename "$f")"
    grep -E '^  [a-z_0-9]+.*\(|Duration|SM Frequency|DRAM Throughput|L2 Hit Rate|dram__bytes_read|lts__t_bytes|hmma_cycles|Registers Per|Achieved Occ' "$f" | head -12
done
cd "$OUT" && tar czf t.tgz t && rm -rf t
