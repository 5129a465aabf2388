#!/usr/bin/env bash
# Run 28 (the next session's second device call, after run 27 passed): the timings, one job at a time, ~400 s:
#   - launch overlap: moe_bench --graph at 1..512 tokens, MOEGEN_PDL off and on (and, the seventh session's, the
#     combine not folded into the gemv down GEMM: MOEGEN_COMBINE_FUSE=off), for the four decode specs, and
#     build-old/moe_bench (main de82ab5: the build before the route's three changes — the fused calls' L2 prefetch
#     of the up weights, the batched split-H sums, no fuse ticket for one token block) beside them: carry
#     ["build", "build-old"]; build-old/moe_bench was built at de82ab5 in the sixth session (ignored, kept in the
#     checkout); if it is gone:
#       git worktree add /tmp/old de82ab5 && make -C /tmp/old -j2 all && mkdir -p build-old && cp /tmp/old/build/moe_bench build-old/
#   - the gemv grid's bn 16 against the shipped bn 32 for Qwen3 (tests/tune/gemv.tune vs tuning/h200.tune)
#   (the fp8 GEMMs on two consumer warpgroups, which this script timed first, moved to run30.sh beside the fp8
#   persistent grid, to keep this one under the 600 s a call may take: 16 moe_bench runs of up to 40 s above)
#   - ncu (--clock-control none) of Qwen3's kernels at 1 token (route, the gemv GEMMs, combine)
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8; do
    for t in old off on nocf; do  # nocf: PDL off and the combine not folded into the gemv down GEMM
        echo "== pdl-$t $s" >> "$OUT/pdl_bench.log"
        bin=build/moe_bench; [ $t = old ] && bin=build-old/moe_bench
        pdl=off; [ $t = on ] && pdl=on
        cf=on; [ $t = nocf ] && cf=off
        [ -x $bin ] && MOEGEN_PDL=$pdl MOEGEN_COMBINE_FUSE=$cf timeout 40 $bin examples/specs/$s.moe --graph \
            --tokens 1 --tokens 4 --tokens 8 --tokens 64 --tokens 128 --tokens 512 --iters 20 >> "$OUT/pdl_bench.log" 2>&1
    done
done
for t in shipped gemv; do
    echo "== $t qwen3-30b-a3b" >> "$OUT/gemv_bench.log"
    if [ $t = shipped ]; then tab=tuning/h200.tune; else tab=tests/tune/gemv.tune; fi
    MOEGEN_TUNING=$tab timeout 30 build/moe_bench examples/specs/qwen3-30b-a3b.moe --graph --tokens 1 --tokens 2 \
        --tokens 4 --tokens 8 --tokens 16 --tokens 32 --iters 20 >> "$OUT/gemv_bench.log" 2>&1
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --clock-control none --set full -k 'regex:route|gemv|combine' --launch-skip 12 --launch-count 4 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_qwen3_1tok.log" 2>&1
echo "ncu: exit $?" >> "$OUT/rc.txt"
# route at 64 tokens: 47 us in run 24 against 19 at 8 (where does it go: phase 1, the split sums, phase 2, the plan?)
timeout 40 $NCU --clock-control none --set full -k 'regex:route' --launch-skip 3 --launch-count 1 \
    build/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 64 --iters 1 > "$OUT/ncu_qwen3_route64.log" 2>&1
echo "ncu route 64: exit $?" >> "$OUT/rc.txt"
awk '/^== /{b=$2" "$3} /LAYER graph/{print b, $1, $4, $NF}' "$OUT/pdl_bench.log"
grep -E '^== |gemm_up|gemm_down|LAYER graph' "$OUT/gemv_bench.log"
grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size' "$OUT/ncu_qwen3_1tok.log" | head -60
grep -E '^  [a-z_0-9]+.*\(|Duration|Registers Per|Grid Size|Warp Cycles Per Issued|Stall' "$OUT/ncu_qwen3_route64.log" | head -30
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
