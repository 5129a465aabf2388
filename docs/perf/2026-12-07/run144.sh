#!/usr/bin/env bash
# Run 144 (written at the end of the twenty-fifth session; NOT run): the fp8 1-token route scatter.
# patches/route_fp8_fuse.diff (branch fp8-route-fuse): an fp8 call of one token quantizes its x row in the route
# kernel (mode 2: phase 2's idle warps, permute_scatter's rule, the scales through a new moe_route_fuse_t.xsc) and
# launches no permute_scatter; the fuse struct grows by a pointer for every spec (the route's later parameters move
# by 8 bytes). CPU-checked: test_route_host 1553/0 (its fp8 case byte for byte against runtime/fp8.c at one token;
# a dropped pair fails it), test_plan, test_runtime, test_emit, test_nvrtc 551/0.
# Build r144 = main + the patch (git apply docs/perf/2026-12-07/patches/route_fp8_fuse.diff; make -j2 all
# build/moe_bench build/tests/test_gpu build/tests/test_quant_gpu build/libmoegen_ref.so build/tests/test_vendored;
# then MOEGEN_UPDATE_GOLDENS=1 build/tests/test_emit and make kernels before committing), and r143 = main as run143.sh.
# Carry ["build/r143", "build/r144"]. Land the patch if (1)-(3) pass and (4) shows the fp8 layer faster at 1 token.
# (1) test_quant_gpu (the fp8 layer at 1 token now takes mode 2); (2) test_gpu every family <= 8 tokens on Qwen3-30B,
# Mixtral, the EP8 rank, a shared-gate and a given-ids spec (the struct's new field moves their later parameters);
# (3) test_vendored (build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe); (4) moe_bench --graph r143 / r144
# on the fp8 Qwen3, Mixtral and EP8 rank at 1 / 2 tokens and the bf16 Qwen3 at 1, interleaved, twice.
set -u
BUDGET=${1:-420}
NEW=${NEW:-r144} BASE=${BASE:-r143}  # the build with the patch, the one without
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use $NEW
timeout ${QT:-200} stdbuf -oL -eL build/$NEW/test_quant_gpu > "$OUT/w/test_quant_gpu_$NEW.log" 2>&1
echo "test_quant_gpu $NEW: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout ${TG:-100} stdbuf -oL -eL build/$NEW/test_gpu --tokens-max 8 qwen3-30b mixtral deepseek-v3-ep8 train_shared given_ids \
    > "$OUT/w/test_gpu_${NEW}_8.log" 2>&1
echo "test_gpu $NEW <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
[ -x build/$NEW/test_vendored ] && timeout 40 build/$NEW/test_vendored examples/specs/qwen3-30b-a3b.moe \
    > "$OUT/w/test_vendored_$NEW.log" 2>&1
echo "test_vendored $NEW: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in fp8/qwen3-30b-a3b-fp8 fp8/mixtral-8x7b-fp8 fp8/deepseek-v3-ep8-fp8 qwen3-30b-a3b; do
        for r in $BASE $NEW; do
            [ $((SECONDS + 15)) -le $BUDGET ] || break 3
            use $r
            echo "== $s $r rep=$rep" >> "$OUT/w/ab.log"
            timeout 15 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --iters 20 \
                >> "$OUT/w/ab.log" 2>&1
        done
    done
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |route at|^(1|2) +(route|permute_scatter|LAYER graph)" "$OUT/w/ab.log" | head -120
