#!/usr/bin/env bash
# Run 155 (written in the twenty-seventh session for a later one; NOT run): #17's large-batch entries of the specs
# whose 4096 / 16384 buckets were last tuned (run 92, fourteenth session) before the 192- and 256-row blocks existed
# (nineteenth session): Qwen3-30B-A3B (layer 1.84x its floor at 4096 on an H100, run 151; 256 rows an expert there,
# so a 256-row block reads each expert's weights once per N tile where the shipped 64 x 256 ping-pong reads them four
# times), gpt-oss-120b and DeepSeek-V3. `moegen tune --grid tile,persist,pingpong` at 4096 and 16384 tokens (every
# candidate, the row blocks among them), then moe_bench --graph under the shipped table and under the tuned one, side
# by side. Land an entry only where the layer is faster in moe_bench (tune times the GEMMs alone). Build: main (moegen,
# moe_bench, libs, as mkr.sh makes them). Carry ["build/rNNN"] as B. $1: budget in seconds (default 560).
set -u
BUDGET=${1:-560}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
B=${B:?the build folder, e.g. build/r160}
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/w/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-120b deepseek-v3; do
    [ $((SECONDS + 150)) -le $((BUDGET - 120)) ] || break
    cp tuning/h200.tune "$OUT/w/tune_$s.tune"  # tune -o merges its entries into the shipped table's copy
    timeout 150 $B/moegen tune examples/specs/$s.moe --tokens 4096,16384 --grid tile,persist,pingpong --iters 10 \
        -o "$OUT/w/tune_$s.tune" > "$OUT/w/tune_$s.log" 2>&1
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
for s in qwen3-30b-a3b gpt-oss-120b deepseek-v3; do
    [ -s "$OUT/w/tune_$s.tune" ] && ! cmp -s tuning/h200.tune "$OUT/w/tune_$s.tune" || continue
    for tab in tuning/h200.tune "$OUT/w/tune_$s.tune"; do
        [ $((SECONDS + 40)) -le $BUDGET ] || break 2
        echo "== $s $tab" >> "$OUT/w/ab.log"
        MOEGEN_TUNING=$(realpath "$tab") timeout 40 $B/moe_bench examples/specs/$s.moe --graph --tokens 4096 \
            --tokens 16384 --iters 10 >> "$OUT/w/ab.log" 2>&1
    done
done
cat "$OUT/w/rc.txt"
for s in qwen3-30b-a3b gpt-oss-120b deepseek-v3; do diff tuning/h200.tune "$OUT/w/tune_$s.tune" 2>/dev/null; done
grep -E "^== |^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER graph)" "$OUT/w/ab.log"
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
