#!/usr/bin/env bash
# Run 121 (twenty-second session): the few-token route (logits from register-fed mma, main 3f10d1e) on a GPU.
# Builds: r121 at 3f10d1e (moegen, moe_bench, test_gpu, libmoegen.so, libmoegen_ref.so stripped, Debian's
# liblua5.4.so.0 and libjansson.so.4), r119 at 28d72ea (the same, before it), and the stamped vendored harnesses in
# build/sb (docs/perf/2026-12-07/stamps: h_base/h_acq/h_pf/h_mix from 251dc8b's sources, h_new/h_newacq/h_mixnew
# from 3f10d1e's). Carry ["build/r121", "build/r119", "build/sb"]. $1: the budget in seconds (default 420).
# (1) test_gpu --family route --tokens-max 8 (every case's few-token calls: the new path against the reference),
# then Qwen3's and Mixtral's whole layers to 16 tokens; (2) the route's timeline, old against new, and the down
# gemv's L2 prefetch under PDL; (3) moe_bench --graph at 1 / 2 / 8 tokens, r119 against r121 in the same call, four
# specs; (4) compare_torch's peers at 1..1024 tokens (run120's step). Everything under $OUT/w, returned as a tarball.
set -u
BUDGET=${1:-420}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r121
timeout 120 stdbuf -oL -eL build/r121/test_gpu --family route --tokens-max 8 > "$OUT/w/test_gpu_route8.log" 2>&1
echo "test_gpu route <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 90 stdbuf -oL -eL build/r121/test_gpu --tokens-max 16 qwen3-30b mixtral > "$OUT/w/test_gpu_layer16.log" 2>&1
echo "test_gpu layers <= 16: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_base h_new h_acq h_newacq; do echo "=== $b (PDL off)"; timeout 40 ./$b 20 1 2 8; done
 for b in h_base h_pf h_new; do echo "=== $b MOEGEN_PDL=on"; MOEGEN_PDL=on timeout 40 ./$b 20 1 8; done
 for b in h_mix h_mixnew; do echo "=== $b (PDL off)"; timeout 40 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b; do
    for r in r119 r121 r119 r121; do
        [ $((SECONDS + 30)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 30 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 8 --iters 20 \
            >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
use r121
export LD_LIBRARY_PATH=$PWD/build/r121${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $((SECONDS + 80)) -le $BUDGET ] || break
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 80 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 128 --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -v "^\s*$" "$OUT/w/stamps.log" | head -120
grep -E "^== |^1 .*route|^8 .*route|LAYER graph" "$OUT/w/ab.log" | head -100
tar -C "$OUT" -czf "$OUT/run121.tgz" w && rm -rf "$OUT/w"
