#!/usr/bin/env bash
# Run 113 (nineteenth session): the shipped table with the 192-row entries at 512 tokens (Mixtral, the DeepSeek-V3
# EP8 rank; the old ones moved to a 768 bucket) and MOE_PLAN_MAX_VARIANTS 16 (every bucket kept): test_gpu under it,
# the layer at 512-1024 tokens under it, the table before run 112 (h200_before_run112.tune) and r192p (192 rows from
# 512 to 2047), interleaved twice; then run111.sh's gemv4 work (test_gpu under gemv4.tune, tune, A/B at 1-8
# tokens); then test_bwd_gpu's train_softmax cases (tests/tune/rowblock.tune's dgrads on 256-row blocks).
# carry ["build/r114"] (moegen, moe_bench, test_gpu, test_bwd_gpu of the commit this script was committed with)
set -u
mkdir -p "$OUT/v" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/v/gpu.txt"
B=build/r114
cp $B/moegen build/moegen
timeout 50 stdbuf -oL -eL $B/test_gpu --tokens-max 1024 mixtral deepseek-v3-ep8 > "$OUT/v/test_gpu_shipped.log" 2>&1
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
    for b in old shipped r192p old shipped r192p; do
        case $b in shipped) unset MOEGEN_TUNING ;; old) export MOEGEN_TUNING=docs/perf/2026-12-06/h200_before_run112.tune ;;
                   r192p) export MOEGEN_TUNING=/tmp/r192p.tune ;; esac
        echo "== $s $b" >> "$OUT/v/bench.log"
        timeout 45 $B/moe_bench examples/specs/$s.moe --graph --tokens 640 --tokens 768 --iters 20 >> "$OUT/v/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
    done
done
unset MOEGEN_TUNING
python3 docs/perf/2026-12-06/ab.py "$OUT/v/bench.log" "LAYER graph" gemm_up_swiglu gemm_down > "$OUT/v/ab.txt"
cat "$OUT/v/ab.txt"
timeout 40 stdbuf -oL -eL $B/test_bwd_gpu train_softmax > "$OUT/v/test_bwd_gpu_rowblock.log" 2>&1
echo "test_bwd_gpu train_softmax: exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
sed -i "s|^B=build/r112|B=build/r114|; s|timeout 80 stdbuf|timeout 50 stdbuf|" docs/perf/2026-12-06/run111.sh
SPECS="qwen3-30b-a3b gpt-oss-20b" timeout 150 bash docs/perf/2026-12-06/run111.sh
[ -d "$OUT/g" ] && (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ "${RUN768:-0}" = 1 ] || { cat "$OUT/v/rc.txt"; exit 0; }  # the device time was short: 768 bucket skipped
# the 768 bucket (768-2047 tokens, 192-512 rows an expert; its entries were tuned at 512 tokens): three tiles of
# 128 rows against the shipped entry at 1024 and 1536 tokens
python3 - <<'PY'
rep = {("8 2 4096 14336", "768"), ("32 8 7168 2048", "768")}
tiles = {"t128": "128 256 64 4 2 8 tile", "p128": "128 256 64 3 2 8 persist", "pp128": "128 128 64 4 2 8 pingpong"}
src = open("tuning/h200.tune").read().splitlines()
for name, tile in tiles.items():
    out = []
    for l in src:
        f = l.split()
        if not l.startswith("#") and len(f) > 14 and f[4] == "bf16" and (" ".join(f[:4]), f[6]) in rep:
            l = " ".join(f[:7]) + "  " + tile + "  " + " ".join(f[14:])
        out.append(l)
    open("/tmp/%s.tune" % name, "w").write("\n".join(out) + "\n")
PY
for s in mixtral-8x7b deepseek-v3-ep8; do
    for b in shipped t128 p128 pp128 shipped t128 p128 pp128; do
        if [ $b = shipped ]; then unset MOEGEN_TUNING; else export MOEGEN_TUNING=/tmp/$b.tune; fi
        echo "== $s $b" >> "$OUT/v/bench768.log"
        timeout 30 $B/moe_bench examples/specs/$s.moe --graph --tokens 1024 --tokens 1536 --iters 20 \
            >> "$OUT/v/bench768.log" 2>&1
        echo "$s $b (768 bucket): exit $? ($SECONDS s)" >> "$OUT/v/rc.txt"
    done
done
unset MOEGEN_TUNING
python3 docs/perf/2026-12-06/ab.py "$OUT/v/bench768.log" "LAYER graph" gemm_up_swiglu gemm_down > "$OUT/v/ab768.txt"
cat "$OUT/v/ab768.txt"
cat "$OUT/v/rc.txt"
for f in "$OUT"/v/test_*.log; do echo "$f: $(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1) $(tail -1 "$f")"; grep -h -m3 FAIL "$f"; done
grep -c "m256n64" "$OUT/v/test_bwd_gpu_rowblock.log"
cd "$OUT" && tar czf v.tgz v && rm -rf v
