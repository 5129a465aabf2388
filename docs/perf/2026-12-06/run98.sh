#!/usr/bin/env bash
# Run 98 (written in the fifteenth session, NOT run: its device time was spent). The gathered up GEMM as landed
# (`0c30cc5`: form 1 of runs 95-97, its consumers' proxy fence now only in calls that gather, and MOEGEN_GATHER's
# size rule) and the alignment checks (`6c912a7`, `4b22296`): their first GPU tests — test_gpu on gathering example
# specs under MOEGEN_GATHER=on (every call the kernels allow) and under the default auto, the grids under =on,
# test_vendored both ways. run99.sh then times it.
# carry ["build/r98"]: main's moegen, moe_bench, test_gpu, test_vendored (prebuilt at 4b22296, stripped; rebuild if
# main's kernels or runtime changed since).
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/r98/moegen build/moegen
MOEGEN_GATHER=on timeout 200 stdbuf -oL -eL build/r98/test_gpu qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 \
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
cat "$OUT/rc.txt"
grep -h "^test_gpu:\|^test_vendored:" "$OUT"/test_*.log
grep -h -m3 FAIL "$OUT"/test_*.log
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
