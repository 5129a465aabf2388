#!/usr/bin/env bash
# Run 114 (nineteenth session): run113.sh cut to the device time left (about 280 s): test_gpu under the shipped table
# (Mixtral, the EP8 rank, <= 1024 tokens), the 192-row crossing at 640 and 768 tokens (the shipped table, the one
# before run 112, r192p), test_bwd_gpu's train_softmax cases (with rowblock.tune's dgrads on 256-row blocks), then
# gemv4 on Qwen3: test_gpu under tests/tune/gemv4.tune (<= 8 tokens) and the layer at 1-8 tokens against the shipped table.
# carry ["build/r114"]; one repeat of each A/B unless REPS_CROSS / REPS_G4 name more (e.g. "old shipped r192p old shipped r192p")
set -u
mkdir -p "$OUT/v" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/v/gpu.txt"
B=build/r114
cp $B/moegen build/moegen
timeout 40 stdbuf -oL -eL $B/test_gpu --tokens-max 1024 mixtral deepseek-v3-ep8 > "$OUT/v/test_gpu_shipped.log" 2>&1
echo "test_gpu shipped: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
python3 - <<'PY'
rep = {("8 2 4096 14336", "512"), ("32 8 7168 2048", "512")}
out = []
for l in open("docs/perf/2026-12-06/h200_before_run112.tune").read().splitlines():
    f = l.split()
    if not l.startswith("#") and len(f) > 14 and f[4] == "bf16" and (" ".join(f[:4]), f[6]) in rep:
        l = " ".join(f[:7]) + "  192 128 64 4 3 8 persist  " + " ".join(f[14:])
    out.append(l)
open("/tmp/r192p.tune", "w").write("\n".join(out) + "\n")
PY
for s in mixtral-8x7b deepseek-v3-ep8; do
    for b in ${REPS_CROSS:-old shipped r192p}; do
        case $b in shipped) unset MOEGEN_TUNING ;; old) export MOEGEN_TUNING=docs/perf/2026-12-06/h200_before_run112.tune ;;
                   r192p) export MOEGEN_TUNING=/tmp/r192p.tune ;; esac
        echo "== $s $b" >> "$OUT/v/bench.log"
        timeout 25 $B/moe_bench examples/specs/$s.moe --graph --tokens 640 --tokens 768 --iters 20 >> "$OUT/v/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
    done
done
unset MOEGEN_TUNING
python3 docs/perf/2026-12-06/ab.py "$OUT/v/bench.log" "LAYER graph" gemm_up_swiglu gemm_down > "$OUT/v/ab.txt"
cat "$OUT/v/ab.txt"
timeout 25 stdbuf -oL -eL $B/test_bwd_gpu train_softmax > "$OUT/v/test_bwd_gpu_rowblock.log" 2>&1
echo "test_bwd_gpu train_softmax: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
MOEGEN_TUNING=tests/tune/gemv4.tune timeout 35 stdbuf -oL -eL $B/test_gpu --tokens-max 8 qwen3-30b \
    > "$OUT/v/test_gpu_gemv4.log" 2>&1
echo "test_gpu gemv4.tune: exit $? ($SECONDS s), $(grep -c gemv4 "$OUT/v/test_gpu_gemv4.log") lines naming gemv4" >> "$OUT/v/rc.txt"
for b in ${REPS_G4:-shipped gemv4}; do
    if [ $b = shipped ]; then unset MOEGEN_TUNING; else export MOEGEN_TUNING=tests/tune/gemv4.tune; fi
    echo "== qwen3-30b-a3b $b" >> "$OUT/v/bench_gemv4.log"
    timeout 25 $B/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 \
        --iters 20 >> "$OUT/v/bench_gemv4.log" 2>&1
    echo "qwen3 $b: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
done
unset MOEGEN_TUNING
python3 docs/perf/2026-12-06/ab.py "$OUT/v/bench_gemv4.log" "LAYER graph" gemm_up_swiglu gemm_down
cat "$OUT/v/rc.txt"
for f in "$OUT"/v/test_*.log; do echo "$f: $(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1) $(tail -1 "$f")"; grep -h -m3 FAIL "$f"; done
