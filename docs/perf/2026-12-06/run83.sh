#!/usr/bin/env bash
# Run 83: Mixtral's bucket-512 GEMM tile (the shipped pingpong m64n256k64 s4 c2 g8) against four other tiles in
# tables that differ from tuning/h200.tune in that one line (build/rc/mx_GRID_BM_BN_STAGES.tune), moe_bench with
# the clean flush at 512 and 1024 tokens, graph replay. carry ["build/rc"].
set -u
mkdir -p "$OUT"
cp build/rc/moegen build/moegen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for r in 1 2; do
for b in main persist_128_256_3 persist_128_256_4 tile_128_256_3 persist_128_128_4; do
    echo "== mixtral-8x7b $b" >> "$OUT/mx512.log"
    if [ $b = main ]; then unset MOEGEN_TUNING; else export MOEGEN_TUNING=build/rc/mx_$b.tune; fi
    timeout 60 build/rc/moe_bench examples/specs/mixtral-8x7b.moe --graph --tokens 512 --tokens 1024 --iters 20 \
        >> "$OUT/mx512.log" 2>&1
    echo "$b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
done
cat "$OUT/rc.txt"
python3 docs/perf/2026-12-06/ab.py "$OUT/mx512.log" "LAYER graph" gemm_up_swiglu gemm_down
