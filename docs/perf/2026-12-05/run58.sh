#!/usr/bin/env bash
# Run 58 (written 2026-12-05, seventh session; NOT run: no device time left). Main after f7606cb (the wgrads
# persistent with TMA-stored fp32 tiles, GPU-run only as branch wgrad-tma: test_bgemm_gpu, two train specs and
# 347 of the EP cases). The whole check on main's own build, each part with its own limit, ~450 s:
#   - test_bgemm_gpu (its refusal case now includes a wgrad's misaligned out) and its memcheck
#   - test_bwd_gpu: the four train specs, the EP cases, the dp x fsdp cases
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1 t=$2; shift 2; timeout $t "$@" > "$OUT/$log.log" 2>&1; local rc=$?; echo "$log: exit $rc" >> "$OUT/rc.txt"; return $rc; }
v test_bgemm_gpu 60 build/tests/test_bgemm_gpu
v memcheck_bgemm 100 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/test_bgemm_gpu
v test_bwd_gpu_train 130 build/tests/test_bwd_gpu train_softmax train_gptoss train_shared train_relu2
v test_bwd_gpu_ep 200 build/tests/test_bwd_gpu ep
v test_bwd_gpu_fsdp 90 build/tests/test_bwd_gpu fsdp
cat "$OUT/rc.txt"
for f in test_bgemm_gpu memcheck_bgemm test_bwd_gpu_train test_bwd_gpu_ep test_bwd_gpu_fsdp; do
    echo "-- $f: $(tail -n 1 $OUT/$f.log)"; grep -E "FAIL|ERROR SUMMARY" "$OUT/$f.log" | head -5
done
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
