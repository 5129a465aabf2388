#!/usr/bin/env bash
# Run 106 (seventeenth session): the chain grid on a GPU (templates/gemm_gemv.lua, "The chain"; main d022a00). First correctness: test_gpu under tests/tune/chain.tune (calls of at most 64 tokens on
# Qwen3, gpt-oss-20b, Mixtral, the EP8 rank, gpt-oss-120b: the chained calls are Qwen3's 1..47 and the others'
# 1..7), the vendored chain (test_vendored_chain: NAME_forward's cooperative launch) and the shipped vendored
# build. Then moe_bench --graph at 1..32 tokens, per spec: the shipped table, chain.tune (chain, 2 stages), chain3
# (3 stages) and stream2 (chain.tune with the plain stream grid: the same kernels' up and down in two launches, and
# the combine).
# Env: TGPU_SPECS, TGPU_S (test_gpu's specs and limit), SPECS, BUILDS (the A/B's) to run less; BUILD the binaries'
# folder (default build/r106); NCU=1 adds Nsight Compute of the chained kernel at 1 Qwen3 token (run 106 ran without).
# carry ["build/r106"] (stripped moegen, moe_bench, test_gpu, test_vendored, test_vendored_chain)
set -u
B=${BUILD:-build/r106}  # the binaries (run107.sh: build/r107)
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
cp $B/moegen build/moegen
sed 's/ chain / stream /' tests/tune/chain.tune > /tmp/stream2.tune
sed 's/ 2 1 1 chain / 3 1 1 chain /' tests/tune/chain.tune > /tmp/chain3.tune
MOEGEN_TUNING=tests/tune/chain.tune timeout ${TGPU_S:-150} stdbuf -oL -eL $B/test_gpu --tokens-max 64 \
    ${TGPU_SPECS:-qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b} > "$OUT/test_gpu_chain.log" 2>&1
echo "test_gpu chain: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
timeout 60 $B/test_vendored_chain examples/specs/qwen3-30b-a3b.moe > "$OUT/vendored_chain.log" 2>&1
echo "test_vendored_chain: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
timeout 60 $B/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/vendored.log" 2>&1
echo "test_vendored: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
for s in ${SPECS:-qwen3-30b-a3b gpt-oss-20b}; do
    for b in ${BUILDS:-shipped chain chain3 stream2}; do
        case $b in shipped) unset MOEGEN_TUNING ;; chain) export MOEGEN_TUNING=tests/tune/chain.tune ;;
                   chain3) export MOEGEN_TUNING=/tmp/chain3.tune ;; stream2) export MOEGEN_TUNING=/tmp/stream2.tune ;; esac
        echo "== $s $b" >> "$OUT/bench.log"
        timeout 60 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 \
            --tokens 32 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
# Nsight Compute of the chained kernel at 1 Qwen3 token (where its time goes: DRAM throughput, stall reasons)
if [ "${NCU:-0}" = 1 ]; then
    NCUB=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    MOEGEN_TUNING=tests/tune/chain.tune timeout 90 $NCUB --clock-control none --set full -k regex:chain \
        --launch-skip 2 --launch-count 1 $B/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 \
        > "$OUT/ncu_chain.log" 2>&1
    echo "ncu chain: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
fi
cat "$OUT/rc.txt"
grep -h "^test_gpu:\|passed" "$OUT/test_gpu_chain.log" | tail -2; grep -m5 FAIL "$OUT/test_gpu_chain.log"
tail -n 2 "$OUT/vendored_chain.log" "$OUT/vendored.log"; grep -m3 FAIL "$OUT"/vendored*.log
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" gemm_up_swiglu gemm_down combine
grep -E "^== |floor" "$OUT/bench.log" | head -40
[ -f "$OUT/ncu_chain.log" ] && grep -E 'Duration|DRAM Throughput|Memory Throughput|SM Frequency|Achieved Occupancy|No Eligible|Warp Cycles Per Issued' "$OUT/ncu_chain.log" | head -12
gzip -9 "$OUT"/*.log
