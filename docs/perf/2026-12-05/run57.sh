#!/usr/bin/env bash
# Run 57 (2026-12-05, seventh session; the command as given to the device, saved here): the last 3 minutes of
# device time on run 56's build (branch wgrad-tma, build/tm2): test_bwd_gpu on two train specs, then its EP cases
# for as long as the time allowed (70 s: no verdict on the cases it did not reach).
. bench/gpu_env.sh; export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 75 build/tm2/test_bwd_gpu train_softmax train_gptoss > $OUT/tm2_bwd_train.log 2>&1; echo "train: $?"
tail -1 $OUT/tm2_bwd_train.log; grep FAIL $OUT/tm2_bwd_train.log | head -3
timeout 70 build/tm2/test_bwd_gpu ep > $OUT/tm2_bwd_ep.log 2>&1; echo "ep: $?"
tail -2 $OUT/tm2_bwd_ep.log; grep FAIL $OUT/tm2_bwd_ep.log | head -3
