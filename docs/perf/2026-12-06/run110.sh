#!/usr/bin/env bash
# Run 110 (eighteenth session), build/r107 (main 22a5283's binaries). Run 109's tune put gemv3 (3 CTAs an SM) ahead
# of the shipped gemv entries at 1-4 tokens (Qwen3 2-3 %, gpt-oss-20b 8-14 % on the GEMMs + combine). Here: tune the
# five decode specs at 1, 2, 4 tokens over gemv and gemv3 (and, for gpt-oss-120b, whose 1-token entry is a tile one,
# tile too), merged into a copy of the shipped table (new.tune); then the layer replayed from a CUDA graph under the
# shipped table and new.tune, interleaved twice, at 1, 2, 4, 8 tokens, with a third build r111 (main 81e4f1d: the
# few-token route's split sum with its loads batched) under the shipped table; then test_gpu under new.tune and
# test_gpu of r111, at <= 8 tokens.
# carry ["build/r107", "build/r111"]
set -u
mkdir -p "$OUT/n" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/n/gpu.txt"
B=build/r107
cp $B/moegen build/moegen
cp tuning/h200.tune /tmp/new.tune
SPECS=${SPECS:-"qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b"}
for s in $SPECS; do
    g=gemv,gemv3; [ $s = gpt-oss-120b ] && g=gemv,gemv3,tile
    timeout 60 $B/moegen tune examples/specs/$s.moe --tokens 1,2,4 --grid $g --iters 20 -o /tmp/new.tune \
        > "$OUT/n/tune_$s.log" 2>&1
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/n/rc.txt"
done
cp /tmp/new.tune "$OUT/n/new.tune"
for s in $SPECS; do
    for b in shipped new r111 shipped new r111; do
        if [ $b = new ]; then export MOEGEN_TUNING=/tmp/new.tune; else unset MOEGEN_TUNING; fi
        X=$B; [ $b = r111 ] && X=build/r111
        echo "== $s $b" >> "$OUT/n/bench.log"
        timeout 40 $X/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 --iters 20 \
            >> "$OUT/n/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/n/rc.txt"
    done
done
unset MOEGEN_TUNING
MOEGEN_TUNING=/tmp/new.tune timeout 70 stdbuf -oL -eL $B/test_gpu --tokens-max 8 $SPECS > "$OUT/n/test_gpu_new.log" 2>&1
echo "test_gpu new: exit $? ($SECONDS s)" >> "$OUT/n/rc.txt"
cp build/r111/moegen build/moegen
timeout 45 stdbuf -oL -eL build/r111/test_gpu --tokens-max 8 qwen3-30b-a3b deepseek-v3 deepseek-v3-ep8 gpt-oss-20b \
    > "$OUT/n/test_gpu_r111.log" 2>&1
echo "test_gpu r111: exit $? ($SECONDS s)" >> "$OUT/n/rc.txt"
cat "$OUT/n/rc.txt"
diff tuning/h200.tune /tmp/new.tune | grep "^[<>]"
for s in $SPECS; do grep -E "tokens:" "$OUT/n/tune_$s.log"; done
python3 docs/perf/2026-12-06/ab.py "$OUT/n/bench.log" "LAYER graph" gemm_up_swiglu gemm_down route
grep -h "^test_gpu:" "$OUT"/n/test_gpu_*.log; grep -h -m5 FAIL "$OUT"/n/test_gpu_*.log
cd "$OUT" && tar czf n.tgz n && rm -rf n
