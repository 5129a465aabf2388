#!/usr/bin/env bash
# Run 100 (sixteenth session). Run 99 showed the gathered up GEMM's cost is not the proxy fence (nofence as slow)
# and ncu showed it reading 1.78x the DRAM bytes of the TMA-fed kernel (Mixtral, 4096 tokens). The gathering
# producer's cp.async carried no L2 prefetch size (the sm_80 GEMMs' cp.async use .L2::128B): builds l2a (main
# d8864f9 + patches/gather_l2_128.diff) and l2b (+ patches/gather_l2_256.diff) against r98 off / on, interleaved
# per spec; ncu of Mixtral's up GEMM at 4096 tokens under l2a.
# carry ["build/r98", "build/l2a", "build/l2b"]
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b gpt-oss-120b; do
    for b in off on l2a l2b; do
        bin=r98; m=$b; case $b in l2a|l2b) bin=$b; m=on ;; esac
        cp build/$bin/moegen build/moegen
        echo "== $s $b" >> "$OUT/bench.log"
        MOEGEN_GATHER=$m timeout 45 build/$bin/moe_bench examples/specs/$s.moe --graph --tokens 512 --tokens 2048 \
            --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/l2a/moegen build/moegen
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
MOEGEN_GATHER=on timeout 60 $NCU --clock-control none --set full -k 'regex:gemm_up' --launch-skip 2 --launch-count 1 \
    build/l2a/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 1 > "$OUT/ncu_up_l2a.log" 2>&1
echo "ncu l2a: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu
grep -E 'Duration|DRAM Throughput|Memory Throughput' "$OUT/ncu_up_l2a.log" | head
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
