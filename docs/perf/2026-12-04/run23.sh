#!/usr/bin/env bash
# Run 23: main after merging h/epbwd (the expert-parallel backward) onto the fp8 EP dispatch: test_bwd_gpu ep (every
# rank of EP meshes on one GPU, the forward's and backward's transfer lists played between unconnected plans), the
# whole test_bwd_gpu and test_bgemm_gpu (launch.c / bgemm.c changed), test_ep_gpu (ep.c merged), side by side.
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
v() { local log=$1; shift; timeout ${V_TIMEOUT:-230} "$@" > "$OUT/$log.log" 2>&1; echo "$log: exit $?" >> "$OUT/rc.txt"; }
v test_bwd_gpu_ep build/tests/test_bwd_gpu ep &
v test_bwd_gpu build/tests/test_bwd_gpu &
v test_bgemm_gpu build/tests/test_bgemm_gpu &
v test_ep_gpu build/tests/test_ep_gpu &
wait
cat "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "== $(basename $f): $(grep -E '^test_[a-z_]+: [0-9]+ passed' $f | tail -1)"; grep -E 'FAIL' $f | head -8; done
