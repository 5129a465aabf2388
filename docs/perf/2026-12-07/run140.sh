#!/usr/bin/env bash
# Run 140 (twenty-fifth session): launch overlap for the fp8 layers, and where the fp8 gemv's down GEMM waits.
# r139 as run139.sh (main 1fbfd5e's tree). Carry ["build/r139"].
# (1) moe_bench --graph on the three fp8 example specs at 1 / 8 / 64 / 128 tokens with MOEGEN_PDL=off and =on,
# interleaved, twice (the data for +pdl marks on the fp8 entries: faster by >= 1 % in both repeats);
# (2) Nsight Compute (--set full) of the fp8 Qwen3 layer at 1 token: the up and down gemv kernels' details.
set -u
BUDGET=${1:-300}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r139
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for rep in 1 2; do
    for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
        for pdl in off on; do
            [ $((SECONDS + 20)) -le $((BUDGET - 90)) ] || break 3
            echo "== $s pdl=$pdl rep=$rep" >> "$OUT/w/pdl.log"
            MOEGEN_PDL=$pdl timeout 20 $B/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 \
                --tokens 64 --tokens 128 --iters 20 >> "$OUT/w/pdl.log" 2>&1
            echo "pdl $s $pdl rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
r="$OUT/w/gemv8_qwen3_1"
left=$((BUDGET - SECONDS - 10)); [ $left -le 120 ] || left=120
if [ $left -ge 40 ]; then
    timeout $left $NCU --clock-control none --set full -k "regex:gemm_(up|down)" --launch-skip 4 --launch-count 2 \
        -o "$r" $B/moe_bench examples/specs/fp8/qwen3-30b-a3b-fp8.moe --tokens 1 --iters 2 > "$r.run.log" 2>&1
    echo "ncu: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    [ -f "$r.ncu-rep" ] && timeout 40 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
    rm -f "$r.ncu-rep"
fi
cat "$OUT/w/rc.txt"
grep -E "^== |^(1|8|64|128) +LAYER graph" "$OUT/w/pdl.log"
grep -E "gemm_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Block Limit|Grid Size|Theoretical Occ|One or More Eligible|Issued Warp" "$r.details.txt" 2>/dev/null | head -60
