#!/usr/bin/env bash
# Run 116 (twentieth session): where it stands, on main as built for it. Build: `make -j2 all build/moe_bench
# build/libmoegen.so`, copy moegen, moe_bench, libmoegen.so (stripped) and Debian's liblua5.4.so.0 and libjansson.so.4
# into build/r116; carry ["build/r116"]. (1) the layer as served (CUDA graph replay, clean L2 flush) at 1..512 tokens
# and eagerly-and-graphed at 4096 / 16384, five specs, with moe_bench's ceilings and floor; (2) compare_torch --graph
# (torch._grouped_mm layer, eager torch layer, captured likewise) at 1/64/512/4096 tokens, three specs.
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
B=build/r116
cp $B/moegen build/moegen; cp $B/libmoegen.so build/libmoegen.so
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b gpt-oss-120b; do
    echo "== $s main" >> "$OUT/w/table.log"
    timeout 60 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/table.log" 2>&1
    echo "table $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b; do
    echo "== $s main" >> "$OUT/w/large.log"
    timeout 60 $B/moe_bench examples/specs/$s.moe --graph --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/w/large.log" 2>&1
    echo "large $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 80 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 64 --tokens 512 \
        --tokens 4096 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/table.log"
python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/large.log"
grep -E 'graph|^compare|flush' "$OUT/w/compare.log" | head -60
