#!/usr/bin/env bash
# Run 71 (written in the ninth session, 2026-12-05; only part 5, added in the tenth session, ran: run71/ and its
# README. Parts 1-3 are the ninth session's plan as written, never run). Its part 1 is the
# refused run 70's checks (plus the dx-t16 build); part 2 adds where the 1-token route's time goes. Two calls: `bash run71.sh 1` (items 1-2, ~450 s), then
# `bash run71.sh 2` (items 3-5, ~400 s); `bash run71.sh 3` (optional, ~560 s): the whole test_bwd_gpu on main. Builds to carry (strip --strip-debug each):
#   build/moe_bench, build/tests/test_bwd_gpu   main (f243d83 or later: bwd_dwr with 8 x 4 thread tiles; MOEGEN_LINEINFO)
#   build/old/moe_bench                          main 27cfea5 (before it; git worktree at 27cfea5, make build/moe_bench)
#   build/var/moe_bench                          branch gemv-occ (bf16 gemv in 2-row chunks, three CTAs an SM)
#   build/dx/{moe_bench,test_bwd_gpu}            branch dx-t16 (d6373c4: bwd_dx 16 tokens x 4 columns, on main's dwr)
# The ninth session left these built and stripped in /work/main/build (if it survives; else rebuild as above):
#   carry = ["build/moe_bench", "build/tests/test_bwd_gpu", "build/old", "build/var", "build/dx"] (5.9 MB)
# What it asks:
#   1. the new bwd_dwr on a GPU: test_bwd_gpu's four train specs and its dp x fsdp cases (test_bwd_host already
#      checks the kernel's source bit for bit against the ordered sum on the CPU; this is the whole backward on a GPU)
#   2. faster? moe_bench --backward of Qwen3, Mixtral and the EP8 rank at 4096 / 16384 tokens, old, new and the
#      dx-t16 branch in this call (the "router" stage is bwd_router + bwd_dx + bwd_dwr's two phases); the branch's
#      test_bwd_gpu train specs too
#   3. decode: branch gemv-occ against main, A B A B, Qwen3 and gpt-oss-20b at 1 / 2 / 4 / 8 tokens (graph)
#   4. what bounds the router stage: Nsight Compute (full set, per template line) of bwd_router / bwd_dx /
#      bwd_dwr (Qwen3, 16384 tokens, new), and of the 1-token gemv GEMMs (stalls per line of gemm_gemv.lua)
#   5. where Qwen3's 1-token route spends its 17.5 us (run 69: 8 CTAs, 8.5 cycles a warp instruction): the
#      source page with per-instruction samples and executed counts (csv), SASS and, compiled with
#      MOEGEN_LINEINFO=on (main from the commit that added it), per line of templates/route.lua
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
part=${1:-1}
if [ "$part" = 1 ]; then
v test_bwd_gpu_train 100 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
v test_bwd_gpu_fsdp 60 build/tests/test_bwd_gpu fsdp
v dx_test_bwd_gpu_train 100 build/dx/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/old/moe_bench build/moe_bench build/dx/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 60 $b /tmp/train_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
fi
if [ "$part" = 2 ]; then
for s in qwen3-30b-a3b gpt-oss-20b; do
    for b in build/moe_bench build/var/moe_bench build/moe_bench build/var/moe_bench; do
        echo "== $s $b" >> "$OUT/decode.log"
        timeout 30 $b examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 --iters 20 >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
{ cat examples/specs/qwen3-30b-a3b.moe; echo "training = true"; } > /tmp/train_qwen3-30b-a3b.moe
MOEGEN_LINEINFO=on MOEGEN_CACHE_DIR=/tmp/moegen_cache_li timeout 150 $NCU --set full --import-source yes \
    -k 'regex:bwd_(router|dx|dwr)' --launch-count 4 -o "$OUT/bwd" \
    build/moe_bench /tmp/train_qwen3-30b-a3b.moe --backward --tokens 16384 --iters 1 > "$OUT/ncu_qwen3_bwd_run.log" 2>&1
echo "ncu bwd: exit $?" >> "$OUT/rc.txt"
timeout 60 $NCU --import "$OUT/bwd.ncu-rep" --print-details all > "$OUT/ncu_qwen3_bwd.log" 2>&1
timeout 60 $NCU --import "$OUT/bwd.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_qwen3_bwd_cuda.csv" 2>&1
rm -f "$OUT/bwd.ncu-rep"; gzip -9 "$OUT/ncu_qwen3_bwd_cuda.csv"
MOEGEN_LINEINFO=on MOEGEN_CACHE_DIR=/tmp/moegen_cache_li timeout 90 $NCU --set full --import-source yes \
    -k 'regex:gemv' --launch-count 2 -o "$OUT/gemv1" build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 \
    > "$OUT/ncu_gemv1_run.log" 2>&1
echo "ncu gemv: exit $?" >> "$OUT/rc.txt"
timeout 60 $NCU --import "$OUT/gemv1.ncu-rep" --print-details all > "$OUT/ncu_gemv1.log" 2>&1
timeout 60 $NCU --import "$OUT/gemv1.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_gemv1_cuda.csv" 2>&1
rm -f "$OUT/gemv1.ncu-rep"; gzip -9 "$OUT/ncu_gemv1_cuda.csv"
MOEGEN_LINEINFO=on MOEGEN_CACHE_DIR=/tmp/moegen_cache_li timeout 90 $NCU --set full --import-source yes \
    -k 'regex:_route_' --launch-count 1 -o "$OUT/route1" build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_route1_run.log" 2>&1
echo "ncu route: exit $?" >> "$OUT/rc.txt"
timeout 60 $NCU --import "$OUT/route1.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_route1_sass.csv" 2>&1
timeout 60 $NCU --import "$OUT/route1.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_route1_cuda.csv" 2>&1
timeout 60 $NCU --import "$OUT/route1.ncu-rep" --print-details all > "$OUT/ncu_route1.log" 2>&1
rm -f "$OUT/route1.ncu-rep"; gzip -9 "$OUT/ncu_route1_sass.csv" "$OUT/ncu_route1_cuda.csv"
fi
if [ "$part" = 5 ]; then   # (tenth session, after five refused starts) part 1's checks and branch route-tail's in one call, most
    # important first (a call cut at its limit still returns what $OUT holds)
v test_bwd_gpu_train 100 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
v test_bwd_gpu_fsdp 60 build/tests/test_bwd_gpu fsdp
timeout 30 build/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --no-flush --tokens 1 --tokens 8 --iters 20 \
    > "$OUT/decode_noflush.log" 2>&1
echo "decode no-flush: exit $?" >> "$OUT/rc.txt"
# main, route-tail's first commit (rt: the fused tail without fences or L2 round trips) and its second (rt2: less
# code on the few-token path), through moe_bench --templates
for s in qwen3-30b-a3b qwen3-30b-a3b gpt-oss-20b; do
    for t in main rt rt2; do
        [ $s = gpt-oss-20b ] && [ $t = rt ] && continue
        echo "== $s $t" >> "$OUT/rt_decode.log"
        if [ $t != main ]; then a="--templates build/$t/templates"; else a=""; fi
        timeout 60 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 4 --tokens 8 --iters 20 $a \
            >> "$OUT/rt_decode.log" 2>&1
        echo "rt decode $s $t: exit $?" >> "$OUT/rc.txt"
    done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --cache-control none --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    -k 'regex:_route_' --launch-count 3 build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 \
    > "$OUT/ncu_route1_warm.log" 2>&1
echo "ncu route warm: exit $?" >> "$OUT/rc.txt"
MOEGEN_LINEINFO=on MOEGEN_CACHE_DIR=/tmp/moegen_cache_li timeout 90 $NCU --set full --import-source yes \
    -k 'regex:_route_' --launch-count 1 -o "$OUT/route1" build/moe_bench examples/specs/qwen3-30b-a3b.moe \
    --tokens 1 --iters 1 > "$OUT/ncu_route1_run.log" 2>&1
echo "ncu route: exit $?" >> "$OUT/rc.txt"
timeout 40 $NCU --import "$OUT/route1.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_route1_sass.csv" 2>&1
timeout 40 $NCU --import "$OUT/route1.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_route1_cuda.csv" 2>&1
timeout 40 $NCU --import "$OUT/route1.ncu-rep" --print-details all > "$OUT/ncu_route1.log" 2>&1
rm -f "$OUT/route1.ncu-rep"; gzip -9 "$OUT/ncu_route1_sass.csv" "$OUT/ncu_route1_cuda.csv"
v rt_test_gpu 150 build/rt/test_gpu --tokens-max 64 qwen3-30b-a3b zero_experts given_ apply_input shared1   # rt2's build
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in build/old/moe_bench build/moe_bench build/dx/moe_bench; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 40 $b /tmp/train_$s.moe --backward --tokens 16384 --iters 5 >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
v dx_test_bwd_gpu_train 60 build/dx/test_bwd_gpu train_softmax train_shared
fi
if [ "$part" = 3 ]; then   # optional: the whole test_bwd_gpu (every example spec as a training spec, the EP meshes
                          # one GPU hosts, dp x fsdp) on main's build: #19's "checked on the H200" for this build
v test_bwd_gpu_all 560 build/tests/test_bwd_gpu
fi
cat "$OUT/rc.txt"
for f in test_bwd_gpu_train test_bwd_gpu_fsdp dx_test_bwd_gpu_train test_bwd_gpu_all rt_test_gpu; do [ -f "$OUT/$f.log" ] && echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep FAIL "$OUT/$f.log" 2>/dev/null | head -5; done
grep -E '^== |^(4096|16384) |router|dys  ' "$OUT/backward.log" 2>/dev/null
grep -E '^== |gemm_|LAYER graph' "$OUT/decode.log" 2>/dev/null
grep -E '^== |^[0-9]+ +(route|LAYER graph)' "$OUT/rt_decode.log" 2>/dev/null
grep -E 'Duration|SM Active Cycles|Elapsed Cycles' "$OUT"/ncu_route1_*.log 2>/dev/null
grep -E '^  [a-z].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Grid Size|Registers Per|Achieved Occupancy' \
    "$OUT/ncu_qwen3_bwd.log" 2>/dev/null | head -60
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt|gz)$' | grep -v logs.tar.gz))
