#!/usr/bin/env bash
# Run 32 (written in the seventh 2026-12-04 session, which had no GPU): the 51 model families of
# bench/check_models.py on the GPU (41 of them, DeepSeek-V4 among them, checked only on the CPU so far, and the
# script's device packs of the layouts they added: DBRX's W1_SEPARATE with its up tensor, the privacy filter's
# B1_FUSED), through libmoegen.so's generated kernels; ~300-500 s (each family's plan JIT-compiles).
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
bash bench/gpu_check_models.sh --tokens 1,37,512 > "$OUT/run32.txt" 2>&1
echo "check_models gpu: exit $?" | tee -a "$OUT/run32.txt"
grep -E 'FAIL|failed|skipped|^check_models' "$OUT/check_models.gpu.log" | head -40
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt)$'))
