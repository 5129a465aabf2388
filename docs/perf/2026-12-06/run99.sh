#!/usr/bin/env bash
# Run 99 (written in the fifteenth session, NOT run). What the gathered up GEMM costs inside the GEMM, after run98's
# tests: moe_bench --graph at 512..16384 tokens, MOEGEN_GATHER off / auto / on (build r98, main `4b22296`), on with
# the consumers' fence dropped (build nf = `15273a5` + patches/gather_nofence.diff: an experiment, not correct by
# the memory model — it says what the fence costs), and on with one thread per warpgroup fencing and a named
# barrier (build f1 = `d7ad37a` + patches/gather_fence1.diff), and on with the copying threads fencing a lag of
# STAGES - 2 stages behind their copies (build lg = `153a202` + patches/gather_lag.diff: the
# writer-side order the memory model states plainly, without form 2's serialization), interleaved per spec; then
# Nsight Compute of Mixtral's up GEMM at 4096 tokens gathering and not (stall reasons).
# carry ["build/r98", "build/nf", "build/f1", "build/lg"] (stripped moegen + moe_bench each; r98 also the tests).
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b deepseek-v3-ep8 mixtral-8x7b gpt-oss-120b; do
    for b in off auto on nf f1 lg; do
        bin=r98; m=$b; case $b in nf|f1|lg) bin=$b; m=on ;; esac
        cp build/$bin/moegen build/moegen
        echo "== $s $b" >> "$OUT/bench.log"
        MOEGEN_GATHER=$m timeout 45 build/$bin/moe_bench examples/specs/$s.moe --graph --tokens 512 --tokens 2048 \
            --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/r98/moegen build/moegen
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in off on; do
    MOEGEN_GATHER=$m timeout 60 $NCU --clock-control none --set full -k 'regex:gemm_up' --launch-skip 2 --launch-count 1 \
        build/r98/moe_bench examples/specs/mixtral-8x7b.moe --tokens 4096 --iters 1 > "$OUT/ncu_up_$m.log" 2>&1
    echo "ncu $m: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu permute_scatter
grep -E '^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Stall' \
    "$OUT/ncu_up_off.log" "$OUT/ncu_up_on.log" | head -40
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
