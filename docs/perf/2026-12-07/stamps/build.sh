#!/usr/bin/env bash
# Build the stamped harnesses into build/sb (nvcc here; no GPU needed): base, acq (fence.acq_rel), pf (the down
# gemv's L2 prefetch before its wait) for Qwen3-30B-A3B, and base for Mixtral.
set -eu
S=$(cd "$(dirname "$0")" && pwd); R=$(cd "$S/../../../.." && pwd); T=$(mktemp -d)
cp "$R"/kernels_out/qwen3-30b-a3b/qwen3_30b_a3b.h "$R"/kernels_out/mixtral-8x7b/mixtral_8x7b.h "$T"/
python3 "$S"/instrument.py "$R"/kernels_out/qwen3-30b-a3b/qwen3_30b_a3b.cu "$T"/base.cu
python3 "$S"/instrument.py "$R"/kernels_out/qwen3-30b-a3b/qwen3_30b_a3b.cu "$T"/acq.cu acqrel
python3 "$S"/instrument.py "$R"/kernels_out/qwen3-30b-a3b/qwen3_30b_a3b.cu "$T"/pf.cu dnpf
python3 "$S"/instrument.py "$R"/kernels_out/mixtral-8x7b/mixtral_8x7b.cu "$T"/mix.cu
NV="nvcc -O2 -gencode arch=compute_90a,code=sm_90a -I$T"
for v in base acq pf; do $NV -DSPEC=qwen3_30b_a3b "$S"/harness.cu "$T"/$v.cu -o "$T"/h_$v -lcuda; done
$NV -DSPEC=mixtral_8x7b "$S"/harness.cu "$T"/mix.cu -o "$T"/h_mix -lcuda
rm -rf "$R"/build/sb && mkdir -p "$R"/build/sb && cp "$T"/h_* "$R"/build/sb/ && strip "$R"/build/sb/* && rm -rf "$T"
