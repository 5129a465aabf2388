#!/usr/bin/env bash
# Run 97 (fifteenth session): the gathered up GEMM's third form — 64 copier threads complete their cp.async on
# `landed` mbarriers (noinc), one arriver thread waits for them, fences the async proxy and arrives on full (run 95:
# a fence in the consumers between wgmma groups cost 1.2-2x; run 96: each copier waiting on its own copies one stage
# late serialized the loads, 1.4-2.8x). carry ["build/rc", "build/gx"]: build/rc = main bccfe11's moegen + moe_bench,
# build/gx = the working tree (moegen, moe_bench, test_gpu), stripped. test_gpu on Qwen3 and Mixtral (their default
# tables: ping-pong _gx kernels from 8 tokens), under tests/tune/tile.tune (bm 128: 16 rows a copier) and
# splitk.tune up to 300 tokens; then moe_bench --graph rc vs gx at 128..16384 tokens.
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/gx/moegen build/moegen
timeout 80 stdbuf -oL -eL build/gx/test_gpu qwen3-30b-a3b mixtral-8x7b > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu.log") gathering calls" >> "$OUT/rc.txt"
tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"
for g in tile splitk; do
    MOEGEN_TUNING=tests/tune/$g.tune timeout 30 build/gx/test_gpu --tokens-max 300 qwen3-30b-a3b > "$OUT/test_gpu_$g.log" 2>&1
    echo "test_gpu $g: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_$g.log") gathering calls" >> "$OUT/rc.txt"
    tail -n 1 "$OUT/test_gpu_$g.log"; grep -m4 FAIL "$OUT/test_gpu_$g.log"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b; do
    for b in rc gx; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/bench.log"
        timeout 40 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 128 --tokens 512 --tokens 2048 \
            --tokens 4096 --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cat "$OUT/rc.txt"
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" permute_scatter gemm_up_swiglu
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
