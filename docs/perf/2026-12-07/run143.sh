#!/usr/bin/env bash
# Run 143 (written at the end of the twenty-fifth session; NOT run): where else "+ef" (the up GEMM's weights
# evict-first in L2, docs/tuning.md) pays. Run 142 measured it on Mixtral's 512-token bucket (the layer 0.974x);
# run 136 showed evict-first weights on every TMA GEMM 1.2-1.6x slower at 4096-16384 tokens, so the candidates are
# the memory-bound middle: the TMA buckets of 8-2048 tokens of six example specs. For each (spec, bucket) the
# shipped table (tuning/h200.tune) and a copy with "+ef" on that bucket's grid word are timed by moe_bench --graph at
# the bucket's own size (MOEGEN_TUNING), interleaved, twice; an entry is worth marking where the layer is faster by
# >= 1 % in both repeats (then test_gpu --family gemm,layer at that bucket's sizes under the new table).
# Run in the twenty-sixth session on the buckets where #16's 512-token target is missed (EP8 rank, Qwen3, OLMoE,
# gpt-oss-20b at 512) and two neighbours; the full list was more than one call allows.
# Build r143 at main (moegen, moe_bench, tests/test_gpu, libmoegen.so, libmoegen_ref.so stripped, Debian's
# liblua5.4.so.0 and libjansson.so.4 beside them). Carry ["build/r143"]. $1: budget in seconds (default 400).
set -u
BUDGET=${1:-400}
mkdir -p "$OUT/w" "$OUT/w/tables" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=${B:-build/r143}
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# spec file, its shape key (E top_k H F), buckets
cands="deepseek-v3-ep8:32_8_7168_2048:512,768
qwen3-30b-a3b:128_8_2048_768:512,128
olmoe-1b-7b:64_8_2048_1024:512
gpt-oss-20b:32_4_2880_2880:512
mixtral-8x7b:8_2_4096_14336:768"
for rep in 1 2; do
    for c in $cands; do
        s=${c%%:*}; rest=${c#*:}; key=${rest%%:*}; buckets=${rest#*:}
        for b in ${buckets//,/ }; do
            [ $((SECONDS + 25)) -le $BUDGET ] || break 3
            t="$OUT/w/tables/${s}_$b.tune"
            [ -f "$t" ] || awk -v k="${key//_/ } bf16 sm_90a $b" '
                index($0, k " ") == 1 && $14 !~ /\+ef/ && $14 !~ /^(gemv|stream|chain)/ { $14 = $14 "+ef" } { print }' \
                tuning/h200.tune > "$t"
            grep -q "+ef" "$t" || { echo "== $s $b: no TMA entry at that bucket" >> "$OUT/w/ef.log"; continue; }
            for tab in base ef; do
                echo "== $s $b $tab rep=$rep" >> "$OUT/w/ef.log"
                if [ $tab = ef ]; then tt=$t; else tt=$PWD/tuning/h200.tune; fi
                MOEGEN_TUNING=$tt timeout 25 $B/moe_bench examples/specs/$s.moe --graph --tokens $b --iters 20 \
                    >> "$OUT/w/ef.log" 2>&1
            done
        done
    done
done
echo "done ($SECONDS s)" >> "$OUT/w/rc.txt"
cat "$OUT/w/rc.txt"
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$OUT/w/ef.log" | head -200
