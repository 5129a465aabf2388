#!/usr/bin/env bash
# Run 135 (written at the end of the twenty-fourth session; NOT run): what main 467b4be still lacks on a GPU.
# Build first, here: make -j2, then build/r135 = moegen, moe_bench, tests/test_gpu, libmoegen.so, libmoegen_ref.so
# (stripped) with Debian's liblua5.4.so.0 and libjansson.so.4 beside them. Carry ["build/r135"].
# (1) test_gpu, every family, <= 8 tokens, on the specs whose calls of 2-7 tokens gained launch overlap by the
# run-133 marks (Qwen3-30B, gpt-oss-20b) and on OLMoE, MOEGEN_PDL unset (auto); (2) the peers as served
# (compare_torch --graph: torch._grouped_mm, the eager layer) at 1 / 8 / 64 / 512 / 1024 tokens for five specs;
# (3) large batches no slower (moe_bench --graph at 4096 / 16384, Qwen3 and Mixtral). $1: budget (default 400).
set -u
BUDGET=${1:-400}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
cp build/r135/moegen build/r135/libmoegen.so build/r135/libmoegen_ref.so build/r135/liblua5.4.so.0 build/r135/libjansson.so.4 build/
timeout 120 stdbuf -oL -eL build/r135/test_gpu --tokens-max 8 qwen3-30b gpt-oss-20b olmoe > "$OUT/w/test_gpu_r135_8.log" 2>&1
echo "test_gpu r135 <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
export LD_LIBRARY_PATH=$PWD/build/r135${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 olmoe-1b-7b gpt-oss-20b; do
    [ $((SECONDS + 60)) -le $BUDGET ] || break
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 60 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    [ $((SECONDS + 45)) -le $BUDGET ] || break
    echo "== $s" >> "$OUT/w/large.log"
    timeout 45 build/r135/moe_bench examples/specs/$s.moe --graph --tokens 4096 --tokens 16384 --iters 10 \
        >> "$OUT/w/large.log" 2>&1
    echo "large $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |layer \(CUDA graph\)" "$OUT/w/compare.log" | head -40
grep -E "^== |LAYER graph" "$OUT/w/large.log"
