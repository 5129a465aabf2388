#!/usr/bin/env bash
# Run 149 (written in the twenty-sixth session for the next one; NOT run): the three measurements that session's
# device time did not reach, in one call, each script in its own folder under $OUT, all tarred at the end.
#   run148.sh 210  the CTA pairs with the default-semantics remote release (r148 = main + patches/mc_release_cta.diff):
#                  moe_bench A/B against the shipped table, the resident-pair count, test_gpu gemm under pairs.tune,
#                  test_vendored_pairs, Nsight Compute of the pair up GEMM;
#   run144.sh 230  the fp8 one-token route scatter (r144 = main 071de38 + patches/route_fp8_fuse.diff) against r143;
#   run143.sh 100  "+ef" at the 512-token buckets of the EP8 rank, Qwen3, OLMoE, gpt-oss-20b (r143 = main 071de38).
# The builds r143, r144, r148 are in build/ on the machine that wrote this (rebuild as each script's header says
# otherwise). Carry ["build/r143", "build/r144", "build/r148"].
set -u
ROOT=$OUT
OUT=$ROOT/pairs bash docs/perf/2026-12-07/run148.sh 210
OUT=$ROOT/fp8route bash docs/perf/2026-12-07/run144.sh 230
OUT=$ROOT/ef bash docs/perf/2026-12-07/run143.sh 100
cd "$ROOT" && tar czf run149.tgz --remove-files pairs fp8route ef
