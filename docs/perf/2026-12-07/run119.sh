#!/usr/bin/env bash
# Run 119 (twenty-first session): the shipped entries, where it stands and the route profile on main as of router.hidden (build r119: moegen, moe_bench, test_gpu,
# libmoegen.so, libmoegen_ref.so stripped, Debian's liblua5.4.so.0 and libjansson.so.4 beside them; carry
# ["build/r119"]), then the latent MoE on a GPU: test_gpu's router_latent cases (router_x and router_w 1024 wide, x
# 256) and check_models' nemotron-h and nemotron-h-latent families against transformers' NemotronHMoE (GPU backend,
# and the C reference's). $1: the budget in seconds (default 480).
set -u
BUDGET=${1:-480}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r119
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
timeout 90 stdbuf -oL -eL $B/test_gpu --tokens-min 512 --tokens-max 1024 mixtral deepseek-v3-ep8 \
    > "$OUT/w/test_gpu_shipped.log" 2>&1
echo "test_gpu shipped: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 60 stdbuf -oL -eL $B/test_gpu router_latent > "$OUT/w/test_gpu_latent.log" 2>&1
echo "test_gpu router_latent: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for be in gpu cpu; do
    timeout 60 python3 bench/check_models.py --backend $be --families nemotron-h,nemotron-h-latent \
        --log "$OUT/w/check_models_$be.log" > /dev/null 2>&1
    echo "check_models $be: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
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
        gzip -9 "$r.sass.csv" "$r.details.txt"; rm -f "$r.ncu-rep"
    fi
fi
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do
    echo "$f: $(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1) | $(tail -1 "$f")"; grep -h -m5 FAIL "$f"
done
grep -h "bucket's variant" "$OUT/w/test_gpu_shipped.log" | head -8
grep -hE "nemotron|FAIL|ok|skipped" "$OUT"/w/check_models_*.log | head -20
python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/table.log"
[ -f "$OUT/w/large.log" ] && python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/large.log"
