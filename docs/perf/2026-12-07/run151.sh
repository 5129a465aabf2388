#!/usr/bin/env bash
# Run 151 (twenty-seventh session): the CTA pairs again and for fp8, and the weight gradients staged whole, in one
# call. r151 = branch fp8-mc: main 3b6bbbf + patches/mc_release_cta.diff (the pairs' remote release with
# mbarrier.arrive's default semantics) + CTA pairs for the fp8 GEMMs (persist+mc on e4m3 entries; consume_fp8
# releases through the pair release); r150 = branch wgrad-bn128 (the wgrads 128 x 128, 4 stages, the fp32 tile
# staged whole and stored in one TMA pass). Carry ["build/r150", "build/r151"].
#   pairs/   run148.sh with B=build/r151 (200 s): bf16 pairs A/B against the shipped table, the resident-pair count,
#            test_gpu gemm under pairs.tune, test_vendored_pairs, Nsight Compute of the pair up GEMM;
#   fp8mc/   test_quant_gpu under tests/tune/fp8pairs.tune (100 s, cut there) and moe_bench on the fp8 Mixtral, EP8
#            rank and Qwen3 at 2048 / 4096 / 16384 tokens, the shipped table against fp8mc.tune (its e4m3 2048 and
#            4096 entries persist+mc; the EP8 rank's and Qwen3's 4096 entries are tile in the shipped table);
#   wgrad/   run150.sh's backward A/B with r151 as the base (main's backward) and r150, test_bgemm_gpu on r150.
set -u
ROOT=$OUT
OUT=$ROOT/pairs B=build/r151 bash docs/perf/2026-12-07/run148.sh 190
mkdir -p "$ROOT/fp8mc/w"; O=$ROOT/fp8mc/w; T0=$SECONDS
export LD_LIBRARY_PATH=$PWD/build/r151 MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
cp build/r151/moegen build/r151/libmoegen.so build/r151/libmoegen_ref.so build/r151/liblua5.4.so.0 \
    build/r151/libjansson.so.4 build/
MOEGEN_TUNING=$PWD/docs/perf/2026-12-07/fp8pairs.tune timeout 100 stdbuf -oL -eL build/r151/test_quant_gpu \
    > "$O/test_quant_gpu_fp8pairs.log" 2>&1
echo "test_quant_gpu (fp8pairs.tune): exit $? ($((SECONDS - T0)) s)" >> "$O/rc.txt"
for s in mixtral-8x7b-fp8 deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
    for tab in base mc; do
        [ $((SECONDS - T0)) -le 150 ] || break 2
        if [ $tab = mc ]; then tt=$PWD/docs/perf/2026-12-07/fp8mc.tune; else tt=$PWD/tuning/h200.tune; fi
        echo "== $s $tab" >> "$O/bench.log"
        MOEGEN_TUNING=$tt timeout 40 build/r151/moe_bench examples/specs/fp8/$s.moe --tokens 2048 --tokens 4096 \
            --tokens 16384 --iters 10 >> "$O/bench.log" 2>&1
        echo "bench $s $tab: exit $? ($((SECONDS - T0)) s)" >> "$O/rc.txt"
    done
done
cat "$O/rc.txt"; tail -1 "$O/test_quant_gpu_fp8pairs.log"; grep -m5 FAIL "$O/test_quant_gpu_fp8pairs.log"
grep -E "^== |CTA pairs|^[0-9]+ +(gemm_up_swiglu|gemm_down|LAYER)" "$O/bench.log" | head -80
OUT=$ROOT/wgrad BASE=r151 bash docs/perf/2026-12-07/run150.sh 200
cd "$ROOT" && tar czf run151.tgz --remove-files pairs fp8mc wgrad
