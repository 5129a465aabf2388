#!/usr/bin/env bash
# Run 107 (seventeenth session; written, not run): run106.sh at main 1b8cc4f (the chain with one counter of CTAs
# done), from build/r107, ending with Nsight Compute of the chained kernel at 1 Qwen3 token (NCU=0 skips it). Its
# other env (TGPU_SPECS, TGPU_S, SPECS, BUILDS) as run106.sh's; the command planned is in the perf README.
# carry ["build/r107"]
BUILD=build/r107 NCU=${NCU:-1} exec bash docs/perf/2026-12-06/run106.sh "$@"
