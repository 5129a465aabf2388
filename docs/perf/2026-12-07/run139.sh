#!/usr/bin/env bash
# Run 139 (twenty-fifth session): r139 = main after the fp8 scatter's block per token and the fp8 entries at 512,
# 1024, 2048 tokens (this commit's parent tree); r138 as run138.sh. Carry ["build/r138", "build/r139"].
# (1) test_quant_gpu (r139: a call at every bucket of the fp8 example specs, 1 .. 4096); (2) test_gpu route and
# permute families on three bf16 specs (the scatter geometry changed only for fp8: a check that bf16 is untouched);
# (3) moe_bench --graph r138 / r139 on the fp8 example specs at 1 / 8 / 128 / 512 / 1024 / 2048 tokens, interleaved;
# (4) compare_torch --graph (torch._scaled_grouped_mm) on r139 for the EP8 rank at 1 / 8 / 128 / 512.
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r139
timeout 220 stdbuf -oL -eL build/r139/test_quant_gpu > "$OUT/w/test_quant_gpu_r139.log" 2>&1
echo "test_quant_gpu r139: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 40 stdbuf -oL -eL build/r139/test_gpu --family route,permute --tokens-max 64 qwen3-30b mixtral deepseek-v3-ep8 \
    > "$OUT/w/test_gpu_r139_permute.log" 2>&1
echo "test_gpu r139 route,permute <= 64: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b-fp8 mixtral-8x7b-fp8 deepseek-v3-ep8-fp8; do
    for r in r138 r139; do
        [ $((SECONDS + 30)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 30 build/$r/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 --tokens 128 \
            --tokens 512 --tokens 1024 --tokens 2048 --iters 20 >> "$OUT/w/ab.log" 2>&1
        echo "ab $s $r: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
use r139
export LD_LIBRARY_PATH=$PWD/build/r139${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
left=$((BUDGET - SECONDS - 5))
if [ $left -ge 30 ]; then
    [ $left -le 60 ] || left=60
    timeout $left python3 bench/compare_torch.py examples/specs/fp8/deepseek-v3-ep8-fp8.moe --graph --tokens 1 \
        --tokens 8 --tokens 128 --tokens 512 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare ep8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
fi
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |^[0-9]+ +(permute_scatter|LAYER graph)" "$OUT/w/ab.log"
grep -E "layer after route|scaled_grouped" "$OUT/w/compare.log"
