#!/usr/bin/env bash
# Run 111 (written in the eighteenth session, NOT run: its device time was spent). The gemv4 grid (four CTAs an
# SM, rows one at a time: templates/gemm_gemv.lua) on a GPU for the first time: test_gpu under tests/tune/gemv4.tune
# (the shipped table with the four decode specs' calls of 1..7 tokens on gemv4) at <= 8 tokens, then `moegen tune`
# at 1, 2, 4 tokens over gemv, gemv3 and gemv4 merged into a copy of the shipped table (g4.tune), then the layer
# replayed from a CUDA graph under the shipped table, g4.tune and gemv4.tune, interleaved twice.
# carry ["build/r112"] (main's moegen, moe_bench, tests/test_gpu after the gemv4 commit, stripped)
set -u
mkdir -p "$OUT/g" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/g/gpu.txt"
B=build/r112
cp $B/moegen build/moegen
cp tuning/h200.tune /tmp/g4.tune
SPECS=${SPECS:-"qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b"}
MOEGEN_TUNING=tests/tune/gemv4.tune timeout 80 stdbuf -oL -eL $B/test_gpu --tokens-max 8 $SPECS \
    > "$OUT/g/test_gpu_gemv4.log" 2>&1
echo "test_gpu gemv4.tune: exit $? ($SECONDS s), $(grep -c gemv4 "$OUT/g/test_gpu_gemv4.log") lines naming gemv4" \
    >> "$OUT/g/rc.txt"
for s in $SPECS; do
    timeout 60 $B/moegen tune examples/specs/$s.moe --tokens 1,2,4 --grid gemv,gemv3,gemv4 --iters 20 -o /tmp/g4.tune \
        > "$OUT/g/tune_$s.log" 2>&1
    echo "tune $s: exit $? ($SECONDS s)" >> "$OUT/g/rc.txt"
done
cp /tmp/g4.tune "$OUT/g/g4.tune"
for s in $SPECS; do
    for b in shipped g4 gemv4 shipped g4 gemv4; do
        case $b in shipped) unset MOEGEN_TUNING ;; g4) export MOEGEN_TUNING=/tmp/g4.tune ;;
                   gemv4) export MOEGEN_TUNING=tests/tune/gemv4.tune ;; esac
        echo "== $s $b" >> "$OUT/g/bench.log"
        timeout 40 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 --iters 20 \
            >> "$OUT/g/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/g/rc.txt"
    done
done
unset MOEGEN_TUNING
cat "$OUT/g/rc.txt"
diff tuning/h200.tune /tmp/g4.tune | grep "^[<>]"
for s in $SPECS; do grep -E "gemv4|tokens:" "$OUT/g/tune_$s.log"; done
grep -h "^test_gpu:" "$OUT/g/test_gpu_gemv4.log"; grep -h -m5 FAIL "$OUT/g/test_gpu_gemv4.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/g/bench.log" "LAYER graph" gemm_up_swiglu gemm_down route
cd "$OUT" && tar czf g.tgz g && rm -rf g
