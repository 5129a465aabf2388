#!/usr/bin/env bash
# Run 104 (written in the sixteenth session, NOT run: its device time was spent). Why the sm_90a GEMMs stream the
# weights at only ~70 % of the copy rate at 128 rows an expert (Mixtral / the EP8 rank at 512 tokens: layer 1.48x /
# 1.31x its floor on an H100, run 101; issue #16's 8..512-token target is 1.15x), and what bounds them at 16384
# (#17's 90 %-of-cuBLAS target; run 99's ncu at 4096: tensor pipe 80 %, L2 79 %, SM clock 1.56 GHz). Nsight Compute
# (full set plus DRAM / L2 byte counts) of one timed call of: Mixtral's up and down GEMMs at 512 tokens, the EP8
# rank's up GEMM at 512, Mixtral's up GEMM at 16384, all with MOEGEN_GATHER=off (the TMA-fed kernels); and Mixtral's
# gathering up GEMM at 4096 (=on, with the .L2::256B copies: its DRAM bytes against run 99's 1.78x).
# Questions: DRAM bytes against the weights' bytes (is B read from DRAM more than once?), the stall reasons of the
# producer and consumer warps, the tensor pipe's and L2's utilization, the SM clock.
# Last, boxramp.cu (build/r104/boxramp: nvcc -O3 -std=c++17 -arch=sm_90a ... -lcuda): the weights streamed through
# the GEMMs' ring as TMA boxes of 256 rows x 64 k against contiguous bulk copies and a plain read, on four shapes.
# First, test_gpu on Qwen3 and the EP8 rank under the default auto and under =off: moe_plan_info.gather (5219c2d, not
# yet run on a GPU) and the gathering calls.
# carry ["build/r104"] (main 2cbc973's moegen, moe_bench, test_gpu, test_vendored, stripped; rebuild if main's
# kernels or runtime change)
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
cp build/r104/moegen build/moegen
for m in auto off; do
    MOEGEN_GATHER=$m timeout 90 stdbuf -oL -eL build/r104/test_gpu qwen3-30b-a3b deepseek-v3-ep8 > "$OUT/test_gpu_$m.log" 2>&1
    echo "test_gpu $m: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_$m.log") gathering calls" >> "$OUT/rc.txt"
done
export MOEGEN_GATHER=off
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__cycles_active.avg"
for job in "mixtral-8x7b 512 gemm_up" "mixtral-8x7b 512 gemm_down" "deepseek-v3-ep8 512 gemm_up" \
           "mixtral-8x7b 16384 gemm_up" "mixtral-8x7b 4096 gemm_up on"; do
    set -- $job
    MOEGEN_GATHER=${4:-off} timeout 90 $NCU --clock-control none --set full --metrics "$M" -k "regex:$3" --launch-skip 2 --launch-count 1 \
        build/r104/moe_bench examples/specs/$1.moe --tokens $2 --iters 1 > "$OUT/ncu_$1_$2_$3${4:+_$4}.log" 2>&1
    echo "ncu $job: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
for shape in "8 28672 4096" "8 4096 14336" "32 4096 7168" "128 1536 2048"; do   # Mixtral up, down; EP8 up; Qwen3 up
    timeout 60 build/r104/boxramp $shape >> "$OUT/boxramp.log" 2>&1
    echo "boxramp $shape: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
cat "$OUT/boxramp.log"
grep -h "^test_gpu:" "$OUT"/test_gpu_*.log; grep -h -m3 FAIL "$OUT"/test_gpu_*.log
for f in "$OUT"/ncu_*.log; do
    echo "== $(basename "$f")"
    grep -E '^  [a-z_0-9]+.*\(|Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|L2 Hit Rate|Compute \(SM\)|dram__bytes|lts__t_bytes|hmma_cycles|Warp Cycles Per Issued|No Eligible' "$f" | head -16
    grep -A2 -E 'stalled waiting|This stall type' "$f" | head -12
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log   # at most 8 files come back
