#!/usr/bin/env bash
# Run 123 (twenty-second session): the route's tickets as atom.acq_rel and slot_of in shared memory (main f47b0f3,
# build r123 as r121's), against r121 (3f10d1e). Carry ["build/r121", "build/r123", "build/sb"] (sb: h_new from
# 3f10d1e's vendored source, h_123 from f47b0f3's, stamped). (1) test_gpu --family route --tokens-max 64 on four
# specs (every fused call: the split ticket at 1-8 tokens, the fused ticket across 2 token blocks at 33-64);
# (2) the route's timeline h_new against h_123; (3) moe_bench --graph at 1 / 8 / 64 tokens, r121 against r123.
set -u
BUDGET=${1:-150}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r123
timeout 70 stdbuf -oL -eL build/r123/test_gpu --family route --tokens-max 64 qwen3-30b mixtral deepseek-v3-ep8 \
    zero_experts > "$OUT/w/test_gpu_route64.log" 2>&1
echo "test_gpu route <= 64: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_new h_123 h_new h_123; do echo "=== $b"; timeout 20 ./$b 20 1; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b; do
    for r in r121 r123 r121 r123; do
        [ $((SECONDS + 12)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 20 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -v "^\s*$" "$OUT/w/stamps.log" | grep -E "===|tokens|phase|ticket|partsum|plan|rows|end|layer" | head -60
grep -E "^== |^1 .*route|^8 .*route|^64 .*route|LAYER graph" "$OUT/w/ab.log" | head -60
tar -C "$OUT" -czf "$OUT/run123.tgz" w && rm -rf "$OUT/w"
