#!/usr/bin/env bash
# Run 96 (fifteenth session): run 95 again with the gathering producer arriving one stage late after cp.async.wait_group + fence.proxy.async (no fence in the consumers: it cost the compute-bound up GEMMs 1.2-2x in run 95), and test_gpu's gathering rule fixed (the fused plan keeps the scatter apart).
# carry ["build/rc", "build/gx"]: build/rc = main bccfe11's moegen + moe_bench (kernels as main before the feature),
# build/gx = the working tree with the feature (moegen, moe_bench, test_gpu, test_vendored, test_vendored_splitk),
# all stripped. (1) test_gpu on four gathering specs at their default tables (every size the test runs), then under
# tests/tune/{tile,persist,pingpong,splitk}.tune up to 600 tokens (each grid's _gx kernel); test_vendored and
# test_vendored_splitk (the vendored launcher's choice); (2) moe_bench --graph rc vs gx, interleaved per spec, at
# 512..16384 tokens; (3) compute-sanitizer memcheck over test_gpu on Qwen3 up to 600 tokens.
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/gx/moegen build/moegen
timeout 170 stdbuf -oL -eL build/gx/test_gpu qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8 > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; tail -n 1 "$OUT/test_gpu.log"; grep -m8 FAIL "$OUT/test_gpu.log"
grep -c "gathers x" "$OUT/test_gpu.log" >> "$OUT/rc.txt"
for g in tile persist pingpong splitk; do
    MOEGEN_TUNING=tests/tune/$g.tune timeout 60 build/gx/test_gpu --tokens-max 600 qwen3-30b-a3b \
        > "$OUT/test_gpu_$g.log" 2>&1
    echo "test_gpu $g: exit $? ($SECONDS s), $(grep -c 'gathers x' "$OUT/test_gpu_$g.log") gathering calls" >> "$OUT/rc.txt"
    tail -n 1 "$OUT/test_gpu_$g.log"; grep -m4 FAIL "$OUT/test_gpu_$g.log"
done
for v in test_vendored test_vendored_splitk; do
    timeout 60 build/gx/$v examples/specs/qwen3-30b-a3b.moe > "$OUT/$v.log" 2>&1; echo "$v: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; tail -n 2 "$OUT/$v.log"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-120b; do
    for b in rc gx; do
        cp build/$b/moegen build/moegen
        echo "== $s $b" >> "$OUT/bench.log"
        timeout 70 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 128 --tokens 512 --tokens 2048 --tokens 4096 \
            --tokens 16384 --iters 20 >> "$OUT/bench.log" 2>&1
        echo "$s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/gx/moegen build/moegen
timeout $((570 - SECONDS)) compute-sanitizer --tool memcheck build/gx/test_gpu --tokens-max 600 qwen3-30b-a3b \
    > "$OUT/memcheck.log" 2>&1
echo "memcheck: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; tail -n 3 "$OUT/memcheck.log"
cat "$OUT/rc.txt"
python3 docs/perf/2026-12-06/ab.py "$OUT/bench.log" "LAYER graph" "LAYER eager" permute_scatter gemm_up_swiglu gemm_down
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
