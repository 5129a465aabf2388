#!/usr/bin/env bash
# Run 82: run 81's compare_torch step again (run 81's found no liblua5.4.so.0 for build/libmoegen.so: the library
# links Debian's shared Lua and jansson, carried here in build/rc). carry ["build/rc"].
set -u
mkdir -p "$OUT"
cp build/rc/moegen build/moegen; cp build/rc/libmoegen.so build/libmoegen.so
export LD_LIBRARY_PATH=$PWD/build/rc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b; do
    echo "== $s" >> "$OUT/compare.log"
    timeout 80 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 512 --iters 20 >> "$OUT/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"; grep -v '^\s*$' "$OUT/compare.log" | head -80
