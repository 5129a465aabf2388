#!/usr/bin/env bash
# Run 22: main after merging h/fp8ep (fp8 with expert parallelism): the fp8 EP cases and the bf16 EP regression
# (test_ep_gpu), the single-device quantizing scatter now through quantize_row (test_quant_gpu), the vendored fp8
# launcher, side by side (correctness only).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout 250 "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v test_ep_gpu build/tests/test_ep_gpu &
v test_quant_gpu build/tests/test_quant_gpu &
v test_vendored_fp8 build/tests/test_vendored_fp8 examples/specs/fp8/qwen3-30b-a3b-fp8.moe &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^test_[a-z_]+: [0-9]+ passed' $f | tail -1)"; grep -E 'FAIL' $f | head -5; done
