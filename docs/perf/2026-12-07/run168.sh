#!/usr/bin/env bash
# Run 168 (twenty-ninth session): the last ~90 s of the session's device time (the rest went to refused starts):
# the sm_80 kernel set on a 9.0 GPU for the first time (MOEGEN_ARCH=sm_80: compute_80 PTX the driver compiles;
# carry ["build/r167"]): test_gpu's Qwen3 and Mixtral cases <= 64 tokens, then test_bwd_gpu's hgrad cases (the sm_80
# dtype-wgrad epilogue), 40 s each.
set -u
mkdir -p "$OUT/t"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
B=build/r167
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/t/gpu.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 40 stdbuf -oL -eL $B/test_gpu --tokens-max 64 qwen3-30b mixtral \
    > "$OUT/t/test_gpu_sm80.log" 2>&1
echo "test_gpu sm_80 (<= 64 tokens): exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
MOEGEN_ARCH=sm_80 MOEGEN_CUDNN=off timeout 40 stdbuf -oL -eL $B/test_bwd_gpu hgrad > "$OUT/t/test_bwd_gpu_sm80.log" 2>&1
echo "test_bwd_gpu sm_80 hgrad: exit $? ($SECONDS s)" >> "$OUT/t/rc.txt"
cat "$OUT/t/gpu.txt" "$OUT/t/rc.txt"
for f in "$OUT"/t/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -m8 -E "FAIL|error" "$f"; done
