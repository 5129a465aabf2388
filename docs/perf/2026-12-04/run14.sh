#!/usr/bin/env bash
# Run 14: the build with the new embedded table (tuning/h200.tune: the variant buckets from runs 11-13) and the
# regenerated kernels_out: test_gpu on the three specs whose entries changed and test_vendored (Qwen3's emitted
# variants), side by side; then the layer under CUDA graphs at 1 .. 2048 tokens and compare_torch --graph.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
env -u MOEGEN_TUNING true
v test_gpu_specs 200 build/tests/test_gpu mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b &
v test_vendored 150 build/tests/test_vendored examples/specs/qwen3-30b-a3b.moe &
wait
cat "$OUT/rc.txt"; for f in "$OUT"/test*.log; do echo "== $(basename $f): $(tail -1 $f)"; done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s" >> "$OUT/decode.log"
    timeout 60 build/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 --tokens 512 \
        --tokens 1024 --tokens 2048 --iters 30 >> "$OUT/decode.log" 2>&1
    timeout 80 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 64 --tokens 512 \
        --iters 20 >> "$OUT/decode_compare.log" 2>&1
done
awk '/^== /{b=$2} /LAYER graph/{print b, $1, $4, $NF}' "$OUT/decode.log"
grep -E 'graph|^compare' "$OUT/decode_compare.log"
