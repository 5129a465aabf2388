#!/usr/bin/env bash
# Run 98 (written in the fifteenth session, NOT run: its device time was spent). The gathered up GEMM as landed
# (`0c30cc5`: form 1 of runs 95-97, its consumers' proxy fence now only in calls that gather, and MOEGEN_GATHER's
# size rule): (1) its first GPU tests — test_gpu on the gathering example specs under MOEGEN_GATHER=on (every
# call the kernels allow) and under the default auto, the grids under =on, test_vendored both ways; (2) what the
# gather costs inside the up GEMM: moe_bench --graph at 128..16384 tokens, off / auto / on (build r98) and on with
# the fence dropped (build nf = r98 + patches/gather_nofence.diff: an experiment, not correct by the memory model),
# interleaved per spec; (3) Nsight Compute of Mixtral's up GEMM at 4096 tokens gathering and not (stall reasons).
# carry ["build/r98", "build/nf"]: r98 = main's (prebuilt at 4b22296) moegen, moe_bench, test_gpu, test_vendored; nf = moegen, moe_bench (prebuilt at 15273a5)
# with the patch (all stripped; rebuild both if main's kernels changed since).
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/r98/moegen build/moegen
MOEGEN_GATHER=on timeout 150 stdbuf -oL -eL build/r98/test_gpu qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 \
    gemma4-26b-a4b > "$OUT/test_gpu_on.log" 2>&1
echo "test_gpu on: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_on.log") gathering calls" >> "$OUT/rc.txt"
timeout 60 stdbuf -oL -eL build/r98/test_gpu qwen3-30b-a3b deepseek-v3-ep8 > "$OUT/test_gpu_auto.log" 2>&1
echo "test_gpu auto: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_auto.log") gathering calls" >> "$OUT/rc.txt"
for g in tile persist splitk; do
    MOEGEN_GATHER=on MOEGEN_TUNING=tests/tune/$g.tune timeout 30 build/r98/test_gpu --tokens-max 600 qwen3-30b-a3b \
        > "$OUT/test_gpu_$g.log" 2>&1
    echo "test_gpu $g (on): exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
for m in on auto; do
    MOEGEN_GATHER=$m timeout 30 build/r98/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/test_vendored_$m.log" 2>&1
    echo "test_vendored $m: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
for s in qwen3-30b-a3b deepseek-v3-ep8 mixtral-8x7b gpt-oss-120b deepseek-v3; do
    for b in off auto on nf; do
        bin=r98; m=$b; [ $b = nf ] && bin=nf && m=on
        cp build/$bin/moegen build/moegen
        echo "== $s $b" >> "$OUT/bench.log"
        MOEGEN_GATHER=$m timeout 45 build/$bin/moe_bench examples/specs/$s.moe --graph --tokens 128 --tokens 512 \
            --tokens 2048 --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
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
grep -h "^test_gpu:\|^test_vendored:" "$OUT"/test_*.log
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu permute_scatter
grep -E '^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Stall' \
    "$OUT/ncu_up_off.log" "$OUT/ncu_up_on.log" | head -40
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
