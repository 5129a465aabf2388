#!/usr/bin/env bash
# Run 115 (written in the nineteenth session, run in the twentieth). Build the binaries at the commit
# this script came with (`make gpu-build`; strip moegen, moe_bench, tests/test_gpu, tests/test_bwd_gpu into
# build/r115) and carry ["build/r115"]. Checks what runs 112-114 left unchecked, then times bm 256 on two consumers:
#  1. test_gpu under the shipped table (Mixtral, the EP8 rank at 512..1024 tokens: the 192 x 128 persist entries at
#     512-767 against the reference, through the bucket sweep test_gpu gained in the twentieth session);
#  2. test_gpu under tests/tune/rowblock.tune (256 x 128 on two consumers: clamp, wide, the EP8 rank, gpt-oss-120b);
#  3. the layer at 768, 1024, 1536 tokens (Mixtral, the EP8 rank) and 4096 (Qwen3) under the shipped table and
#     tables putting the 768 (Qwen3: 4096) bucket on 256 x 128 c2 tile / persist, interleaved twice;
#  4. test_bwd_gpu train_softmax (its row-block case: the dgrads on 256-row blocks), budget permitting.
set -u
BUDGET=${1:-400}   # seconds: the benches and test_bwd_gpu are skipped past it
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
B=build/r115
cp $B/moegen build/moegen
timeout $((BUDGET * 3 / 10)) stdbuf -oL -eL $B/test_gpu --tokens-min 512 --tokens-max 1024 mixtral deepseek-v3-ep8 > "$OUT/w/test_gpu_shipped.log" 2>&1
echo "test_gpu shipped: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
MOEGEN_TUNING=tests/tune/rowblock.tune timeout $((BUDGET * 3 / 10)) stdbuf -oL -eL $B/test_gpu --tokens-max 2048 clamp wide \
    deepseek-v3-ep8 gpt-oss-120b > "$OUT/w/test_gpu_rowblock.log" 2>&1
echo "test_gpu rowblock: exit $? ($SECONDS s), $(grep -c m256n128 "$OUT/w/test_gpu_rowblock.log") lines naming m256n128" \
    >> "$OUT/w/rc.txt"
python3 docs/perf/2026-12-06/retile.py /tmp/c2t.tune "256 128 64 4 2 8 tile" "8 2 4096 14336:768" "32 8 7168 2048:768" \
    "128 8 2048 768:4096"
python3 docs/perf/2026-12-06/retile.py /tmp/c2p.tune "256 128 64 3 2 8 persist" "8 2 4096 14336:768" \
    "32 8 7168 2048:768" "128 8 2048 768:4096"
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    case $s in qwen3*) T="--tokens 4096" ;; *) T="--tokens 768 --tokens 1024 --tokens 1536" ;; esac
    for b in shipped c2t c2p shipped c2t c2p; do
        [ $((SECONDS + 35)) -le $BUDGET ] || break 2
        if [ $b = shipped ]; then unset MOEGEN_TUNING; else export MOEGEN_TUNING=/tmp/$b.tune; fi
        echo "== $s $b" >> "$OUT/w/bench.log"
        timeout 35 $B/moe_bench examples/specs/$s.moe --graph $T --iters 20 >> "$OUT/w/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    done
done
unset MOEGEN_TUNING
if [ $((SECONDS + 50)) -le $BUDGET ]; then
    timeout 50 stdbuf -oL -eL $B/test_bwd_gpu train_softmax > "$OUT/w/test_bwd_gpu.log" 2>&1
    echo "test_bwd_gpu train_softmax: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
fi
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1) $(tail -1 "$f")"; grep -h -m3 FAIL "$f"; done
python3 docs/perf/2026-12-06/ab.py "$OUT/w/bench.log" "LAYER graph" gemm_up_swiglu gemm_down
python3 docs/perf/2026-12-06/xfloor.py "$OUT/w/bench.log"
