#!/usr/bin/env bash
# Run 73 (eleventh session, 2026-12-06). One call.
# Carry: ["build/cur", "build/pf", "build/rb", "build/g3", "build/s64", "build/s128"]
#   build/cur/moe_bench                      main f890bce (stripped)
#   build/pf/{moe_bench,test_gpu,moegen}     branch gemv-pf (each gemv CTA bulk-prefetches its weight slab into L2)
#   build/rb/{moe_bench,test_bwd_gpu}        branch router-tc 43ac4bd (the router's backward products on mma.sync)
#   build/g3/{moe_bench,test_gpu,moegen,gemv3.tune}  branch gemv3 (gemv-pf + the gemv3 grid; test_gpu and moegen
#                                            from g3s = gemv3 + rsplit at 64 columns); run under
#                                            MOEGEN_TUNING=build/g3/gemv3.tune (gemv3 at 1 .. 7 tokens)
#   build/s64/moe_bench, build/s128/moe_bench  branch rsplit (gemv-pf + the route's few-token H split at 64 / 128
#                                            columns a block instead of 256)
# Parts (argument: which to run, default "1 2 3"):
#   1. decode A B A B, main against gemv-pf, layer replayed from a graph, 1/2/4/8 tokens, the four specs whose
#      tuning table picks the gemv grid there (decode.log)
#   2. test_gpu at <= 64 tokens on those specs: g3's build under the shipped table (the prefetching gemv:
#      pf_test_gpu.log) and under gemv3.tune (g3_test_gpu.log)
#   3. run72's profile of main's 1-token route per template line (route1_sass.csv.gz + the JIT cubin)
#   4. router-tc: backward A B at 4096 and 16384 tokens (backward.log)
#   5. router-tc: test_bwd_gpu (every train spec, ep, fsdp)
set -u
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt"
parts=${1:-"1 2 3"}
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
for part in $parts; do
if [ "$part" = 1 ]; then
for s in qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8; do
    case $s in qwen3*|gpt*) builds="cur pf g3 s64 s128 cur pf g3 s64 s128" ;; *) builds="cur pf g3 s64" ;; esac
    for b in $builds; do
        echo "== $s $b" >> "$OUT/decode.log"
        [ $b = g3 ] && export MOEGEN_TUNING=build/g3/gemv3.tune || unset MOEGEN_TUNING
        timeout 40 build/$b/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 \
            --iters 20 >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
unset MOEGEN_TUNING
fi
if [ "$part" = 2 ]; then
# g3 holds gemv-pf's kernels: under the shipped table it runs the prefetching gemv, under gemv3.tune gemv3 at 1..7
cp build/g3/moegen build/moegen   # test_gpu's from-folder case runs build/moegen
v pf_test_gpu 100 build/g3/test_gpu --tokens-max 64 qwen3-30b-a3b gpt-oss-20b mixtral-8x7b deepseek-v3-ep8
MOEGEN_TUNING=build/g3/gemv3.tune v g3_test_gpu 100 build/g3/test_gpu --tokens-max 64 qwen3-30b-a3b gpt-oss-20b \
    mixtral-8x7b deepseek-v3-ep8
for f in pf_test_gpu g3_test_gpu; do tail -n 1 "$OUT/$f.log"; grep FAIL "$OUT/$f.log" | head -5; done
fi
if [ "$part" = 3 ]; then
mkdir -p /tmp/mc_li && chmod 700 /tmp/mc_li
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on timeout 120 $NCU --set full --import-source yes --sampling-interval 0 \
    -k 'regex:_route_' --launch-count 3 -o "$OUT/r" build/cur/moe_bench examples/specs/qwen3-30b-a3b.moe \
    --tokens 1 --iters 1 > "$OUT/ncu_run.log" 2>&1
echo "ncu: exit $?" >> "$OUT/rc.txt"
timeout 40 $NCU --import "$OUT/r.ncu-rep" --page source --csv --print-source sass > "$OUT/route1_sass.csv" 2>&1
timeout 40 $NCU --import "$OUT/r.ncu-rep" --print-details all > "$OUT/route1_details.log" 2>&1
rm -f "$OUT/r.ncu-rep"
cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null
gzip -9 "$OUT/route1_sass.csv" "$OUT/route1_details.log" "$OUT"/*.cubin 2>/dev/null
fi
if [ "$part" = 5 ]; then
v rb_test_bwd_gpu 150 build/rb/test_bwd_gpu
v rb_test_bwd_gpu_ep 45 build/rb/test_bwd_gpu ep
v rb_test_bwd_gpu_fsdp 45 build/rb/test_bwd_gpu fsdp
for f in rb_test_bwd_gpu rb_test_bwd_gpu_ep rb_test_bwd_gpu_fsdp; do tail -n 1 "$OUT/$f.log"; grep FAIL "$OUT/$f.log" | head -3; done
fi
if [ "$part" = 4 ]; then
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    for b in cur rb; do
        echo "== $s $b" >> "$OUT/backward.log"
        timeout 60 build/$b/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/backward.log" 2>&1
        echo "bench backward $s $b: exit $?" >> "$OUT/rc.txt"
    done
done
grep -E "^== |router|bwd|BACKWARD|backward" "$OUT/backward.log" | head -60
fi
done
cat "$OUT/rc.txt"
[ -f "$OUT/decode.log" ] && python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" gemm_up_swiglu gemm_down
