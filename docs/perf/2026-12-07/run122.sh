#!/usr/bin/env bash
# Run 122 (twenty-second session): run121.sh cut to what the last device minutes allow. Builds and carry as
# run121.sh (r121 at 3f10d1e, r119 at 28d72ea, build/sb). (1) test_gpu --family route --tokens-max 8 on eight specs
# that span the few-token path's forms (many tiles; one tile, k split 8 ways; two tiles; the shared gate column;
# router_x; router.hidden; zero experts; groups); (2) the route's timeline old/new, and the down gemv's prefetch
# under PDL; (3) moe_bench --graph at 1 / 8 tokens, r119 against r121 in the same call. Tarball back.
set -u
BUDGET=${1:-200}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r121
timeout 100 stdbuf -oL -eL build/r121/test_gpu --family route --tokens-max 8 qwen3-30b mixtral gpt-oss-20b qwen2-moe \
    router_own_input router_latent zero_experts deepseek-v3-ep8 > "$OUT/w/test_gpu_route8.log" 2>&1
echo "test_gpu route <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_base h_new; do echo "=== $b (PDL off)"; timeout 30 ./$b 20 1 8; done
 for b in h_base h_pf; do echo "=== $b MOEGEN_PDL=on"; MOEGEN_PDL=on timeout 30 ./$b 20 1; done
 for b in h_mix h_mixnew; do echo "=== $b (PDL off)"; timeout 30 ./$b 20 1; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3-ep8; do
    for r in r119 r121 r119 r121; do
        [ $((SECONDS + 15)) -le $BUDGET ] || break 2
        use $r
        echo "== $s $r" >> "$OUT/w/ab.log"
        timeout 20 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --iters 20 >> "$OUT/w/ab.log" 2>&1
    done
    echo "ab $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -v "^\s*$" "$OUT/w/stamps.log" | head -90
grep -E "^== |^1 .*route|^8 .*route|LAYER graph" "$OUT/w/ab.log" | head -100
tar -C "$OUT" -czf "$OUT/run122.tgz" w && rm -rf "$OUT/w"
