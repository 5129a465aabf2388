#!/usr/bin/env bash
# Run 128 (twenty-third session): main abfaa67's route (the acq_rel tickets) in the whole layer on a GPU, and PDL per
# spec and size. Build r128 = main after abfaa67 (its libmoegen.so is byte-identical to run 127's r125), as run124.sh
# builds r124. Carry ["build/r128"]. $1: the budget in seconds (default 330).
# (1) test_gpu --tokens-max 64 on four specs (every stage, the fused route's plan and scatter, the gemv GEMMs);
# (2) moe_bench --graph at 1 / 8 / 64 / 512 tokens with MOEGEN_PDL unset and on, interleaved, twice, five specs.
set -u
BUDGET=${1:-330}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
cp build/r128/moegen build/r128/libmoegen.so build/r128/libmoegen_ref.so build/r128/liblua5.4.so.0 build/r128/libjansson.so.4 build/
timeout 130 stdbuf -oL -eL build/r128/test_gpu --tokens-max 64 qwen3-30b mixtral gpt-oss-20b deepseek-v3-ep8 \
    > "$OUT/w/test_gpu_layer64.log" 2>&1
echo "test_gpu r128 layers <= 64: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 olmoe-1b-7b; do
        for pdl in off on; do
            [ $((SECONDS + 12)) -le $BUDGET ] || break 3
            echo "== $s pdl=$pdl rep=$rep" >> "$OUT/w/pdl.log"
            MOEGEN_PDL=$pdl timeout 20 build/r128/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 \
                --tokens 64 --tokens 512 --iters 20 >> "$OUT/w/pdl.log" 2>&1
        done
    done
    echo "pdl rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |LAYER graph" "$OUT/w/pdl.log" | head -120
