#!/usr/bin/env bash
# Run 36 (2026-12-05, second session's second device call): the timings, one job at a time, each step skipped once
# 540 s have passed (the call's limit is 600):
#   1. run34.sh's benches: moe_bench --graph of the fp8 Mixtral, EP8 and Qwen3 specs at 1, 8, 64, 128 tokens on the
#      default fp8 tile (tuning/h200.tune) and on the fp8 gemv grid (tests/tune/gemv8.tune), their bf16 twins
#   2. run28.sh's launch overlap: moe_bench --graph at 1..512 tokens, build-old (main de82ab5), PDL off, on, and
#      the combine not folded (nocf), for the four decode specs
#   3. run30.sh's backward: moe_bench --backward at 4096 tokens, Mixtral and Qwen3
#   4. run33.sh's fp8 grids: the fp8 specs at 128, 4096, 16384 tokens under h200.tune, fp8.tune, fp8p.tune
# carry ["build", "build-old"]
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
t0=$(date +%s)
left() { [ $(( $(date +%s) - t0 )) -lt 540 ] || { echo "skipped (time): $*" >> "$OUT/rc.txt"; return 1; }; }
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for tab in tuning/h200.tune tests/tune/gemv8.tune; do
        left fp8 $s $tab || continue
        echo "== $tab $s" >> "$OUT/fp8_gemv.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/fp8/$s.moe --graph --tokens 1 --tokens 8 \
            --tokens 64 --tokens 128 --iters 20 >> "$OUT/fp8_gemv.log" 2>&1
    done
done
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b gpt-oss-20b; do
    for t in old off on nocf; do
        left pdl $s $t || continue
        echo "== pdl-$t $s" >> "$OUT/pdl_bench.log"
        bin=build/moe_bench; [ $t = old ] && bin=build-old/moe_bench
        pdl=off; [ $t = on ] && pdl=on
        cf=on; [ $t = nocf ] && cf=off
        MOEGEN_PDL=$pdl MOEGEN_COMBINE_FUSE=$cf timeout 40 $bin examples/specs/$s.moe --graph \
            --tokens 1 --tokens 4 --tokens 8 --tokens 64 --tokens 128 --tokens 512 --iters 20 >> "$OUT/pdl_bench.log" 2>&1
    done
done
for s in mixtral-8x7b qwen3-30b-a3b; do
    left backward $s || continue
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    timeout 60 build/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $s: exit $?" >> "$OUT/rc.txt"
done
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for tab in tuning/h200.tune tests/tune/fp8.tune tests/tune/fp8p.tune; do
        left grids $s $tab || continue
        echo "== $tab $s" >> "$OUT/fp8_grids.log"
        MOEGEN_TUNING=$tab timeout 40 build/moe_bench examples/specs/fp8/$s.moe --tokens 128 --tokens 4096 \
            --tokens 16384 --iters 10 >> "$OUT/fp8_grids.log" 2>&1
    done
done
echo "elapsed $(( $(date +%s) - t0 )) s" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
grep -E '^== |LAYER' "$OUT/fp8_gemv.log" | head -60
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $0}' "$OUT/pdl_bench.log" | head -120
grep -vE '^(plan|gemms)' "$OUT/backward.log" | head -40
grep -E '^== |LAYER' "$OUT/fp8_grids.log" | head -40
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
