#!/usr/bin/env bash
# Run 102 (sixteenth session): the training and fp8 GPU tests on main 4d16cb0 (stop 46's item: test_bwd_gpu under
# the fourteenth session's tuning entries, given more time than run 94's 120 s).
# carry ["build/r101"]
set -u
mkdir -p "$OUT" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/r101/moegen build/moegen
timeout 290 stdbuf -oL -eL build/r101/test_bwd_gpu > "$OUT/test_bwd_gpu.log" 2>&1
echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
timeout 70 stdbuf -oL -eL build/r101/test_quant_gpu > "$OUT/test_quant_gpu.log" 2>&1
echo "test_quant_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"
for f in "$OUT"/test_*.log; do tail -n 1 "$f"; grep -o 'so far [0-9]* passed, [0-9]* failed' "$f" | tail -1; done
grep -h -m5 FAIL "$OUT"/test_*.log
gzip -9 "$OUT"/*.log
