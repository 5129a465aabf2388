#!/usr/bin/env bash
# Run 129 (twenty-third session; NOT run: no device time left): run128.sh cut to what the route of
# patches/route_slot_cpasync.diff (slot_of by cp.async) needs before it may land: its GPU tests and its timeline. Builds and carry as run128.sh ("build/r129", "build/sb"; r124
# unused here).
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
cp build/r129/moegen build/r129/libmoegen.so build/r129/libmoegen_ref.so build/r129/liblua5.4.so.0 build/r129/libjansson.so.4 build/
timeout 90 stdbuf -oL -eL build/r129/test_gpu --family route --tokens-max 1000 qwen3-30b mixtral deepseek-v3-ep8 \
    gpt-oss-20b > "$OUT/w/test_gpu_route1000.log" 2>&1
echo "test_gpu r129 route <= 1000: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
(cd build/sb && for b in h_125 h_129 h_125 h_129; do echo "=== $b"; timeout 20 ./$b 20 1 8; done) > "$OUT/w/stamps.log" 2>&1
echo "stamps: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
timeout 40 stdbuf -oL -eL build/r129/test_gpu --tokens-max 8 qwen3-30b mixtral > "$OUT/w/test_gpu_layer8.log" 2>&1
echo "test_gpu r129 layers <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "===|tokens|layer|phase1|ticket|partsum|plan" "$OUT/w/stamps.log" | head -50
