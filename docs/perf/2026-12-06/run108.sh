#!/usr/bin/env bash
# Run 108 (eighteenth session): run107.sh (the chain with one counter of CTAs done, main 22a5283's code, from
# build/r107, with Nsight Compute of the chained kernel) and then run105.sh (bf16 GEMMs with bk 128, build/bk) in one
# call, each into its own folder of $OUT, tarred (at most 8 files come back).
# carry ["build/r107", "build/bk"]
set -u
O=$OUT
mkdir -p "$O/r107" "$O/r105"
OUT=$O/r107 TGPU_SPECS="qwen3-30b-a3b gpt-oss-20b mixtral-8x7b" TGPU_S=75 SPECS="qwen3-30b-a3b gpt-oss-20b" \
    BUILDS="shipped chain chain3 stream2" bash docs/perf/2026-12-06/run107.sh
OUT=$O/r105 TGPU_S=100 bash docs/perf/2026-12-06/run105.sh
cd "$O" && tar czf r107.tgz r107 && tar czf r105.tgz r105 && rm -rf r107 r105
