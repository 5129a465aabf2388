#!/usr/bin/env bash
# Run 118 (twenty-first session): the one call to make when the device time left is short. Carry ["build/r115"]
# (main a71e99c: moegen, moe_bench, test_gpu, test_bwd_gpu, stripped). In order, each step only while the budget
# (seconds, $1, default 420) has room for it:
#  1. test_gpu under the shipped table, Mixtral and the EP8 rank at 512..1024 tokens: the 192 x 128 persist entries
#     at 512-767 against the reference, through the bucket sweep (never run on a GPU before);
#  2. where it stands: the layer replayed from a CUDA graph at 1..1024 tokens (Qwen3, Mixtral, the EP8 rank), and
#     at 4096 / 16384 for Qwen3 and Mixtral, with moe_bench's floor and ceilings;
#  3. Nsight Compute on the route kernel at 1 Qwen3 token: per-instruction stall samples (run117's first job).
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r115
cp $B/moegen build/moegen
timeout 110 stdbuf -oL -eL $B/test_gpu --tokens-min 512 --tokens-max 1024 mixtral deepseek-v3-ep8 \
    > "$OUT/w/test_gpu_shipped.log" 2>&1
echo "test_gpu shipped: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $((SECONDS + 50)) -le $BUDGET ] || break
    echo "== $s main" >> "$OUT/w/table.log"
    timeout 50 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --tokens 640 --tokens 1024 --iters 20 >> "$OUT/w/table.log" 2>&1
    echo "table $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    [ $((SECONDS + 45)) -le $BUDGET ] || break
    echo "== $s main" >> "$OUT/w/large.log"
    timeout 45 $B/moe_bench examples/specs/$s.moe --graph --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/w/large.log" 2>&1
    echo "large $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
if [ $((SECONDS + 70)) -le $BUDGET ]; then
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    r="$OUT/w/route_qwen3_1"
    timeout 60 $NCU --clock-control none --set full --import-source no -k "regex:route" --launch-skip 3 \
        --launch-count 1 -o "$r" $B/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 2 > "$r.run.log" 2>&1
    echo "ncu route: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    if [ -f "$r.ncu-rep" ]; then
        timeout 30 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
        timeout 30 $NCU -i "$r.ncu-rep" --page source --print-source sass --csv > "$r.sass.csv" 2>&1
        echo "import: exit $? ($SECONDS s), $(wc -l < "$r.sass.csv") lines" >> "$OUT/w/rc.txt"
        gzip -9 "$r.sass.csv" "$r.details.txt"; rm -f "$r.ncu-rep"
    fi
fi
cat "$OUT/w/rc.txt"
f="$OUT/w/test_gpu_shipped.log"
echo "$(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1) | $(tail -1 "$f")"; grep -h -m5 FAIL "$f"
grep -h "bucket's variant\|variant [0-9]" "$f" | head -12
python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/table.log"
[ -f "$OUT/w/large.log" ] && python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/large.log"
