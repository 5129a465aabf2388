#!/usr/bin/env bash
# Run 112 (nineteenth session): row blocks of 192 and 256 (three / four consumer warpgroups) on a GPU for the first
# time. test_gpu, test_bwd_gpu and test_ep_gpu under tests/tune/rowblock.tune (every test shape on them), then the
# layer of Mixtral and the DeepSeek-V3 EP8 rank at 512-2048 tokens (128-512 rows an expert) and Qwen3 at
# 2048-4096 (128-256) under the shipped table and three tables that put those buckets on 192 x 128 (tile grid),
# 192 x 128 (persistent) and 256 x 64 (persistent), interleaved twice.
# carry ["build/r113"] (main 51462aa's moegen, moe_bench, test_gpu, test_bwd_gpu, test_ep_gpu, stripped)
set -u
mkdir -p "$OUT/r" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/r/gpu.txt"
B=build/r113
cp $B/moegen build/moegen
export MOEGEN_TUNING=tests/tune/rowblock.tune
timeout 100 stdbuf -oL -eL $B/test_gpu --tokens-max 2048 tiny odd top1 clamp wide mixtral deepseek-v3-ep8 qwen3-30b \
    > "$OUT/r/test_gpu_rowblock.log" 2>&1
echo "test_gpu rowblock: exit $? ($SECONDS s)" >> "$OUT/r/rc.txt"
timeout 60 stdbuf -oL -eL $B/test_bwd_gpu > "$OUT/r/test_bwd_gpu_rowblock.log" 2>&1
echo "test_bwd_gpu rowblock: exit $? ($SECONDS s)" >> "$OUT/r/rc.txt"
timeout 40 stdbuf -oL -eL $B/test_ep_gpu > "$OUT/r/test_ep_gpu_rowblock.log" 2>&1
echo "test_ep_gpu rowblock: exit $? ($SECONDS s)" >> "$OUT/r/rc.txt"
unset MOEGEN_TUNING
# the A/B tables: the shipped one with these buckets' GEMM fields replaced
python3 - <<'PY'
rep = {("8 2 4096 14336", "512"), ("8 2 4096 14336", "2048"), ("32 8 7168 2048", "512"),
       ("32 8 7168 2048", "2048"), ("128 8 2048 768", "2048"), ("128 8 2048 768", "4096")}
tiles = {"r192t": "192 128 64 4 3 8 tile", "r192p": "192 128 64 4 3 8 persist", "r256p": "256 64 64 4 4 8 persist"}
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
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    case $s in qwen3*) T="--tokens 2048 --tokens 4096" ;; *) T="--tokens 512 --tokens 1024 --tokens 2048" ;; esac
    for b in shipped r192t r192p r256p shipped r192t r192p r256p; do
        if [ $b = shipped ]; then unset MOEGEN_TUNING; else export MOEGEN_TUNING=/tmp/$b.tune; fi
        echo "== $s $b" >> "$OUT/r/bench.log"
        timeout 45 $B/moe_bench examples/specs/$s.moe --graph $T --iters 20 >> "$OUT/r/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/r/rc.txt"
    done
done
unset MOEGEN_TUNING
cat "$OUT/r/rc.txt"
for f in "$OUT"/r/test_*.log; do echo "$f: $(grep -hE "^test_[a-z_]*: [0-9]+ passed" "$f" | tail -1)"; grep -h -m3 FAIL "$f"; done
python3 docs/perf/2026-12-06/ab.py "$OUT/r/bench.log" "LAYER graph" "LAYER eager" gemm_up_swiglu gemm_down
cd "$OUT" && tar czf r.tgz r && rm -rf r
