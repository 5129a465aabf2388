#!/usr/bin/env bash
# Run 156 (written at the end of the twenty-seventh session; NOT run): the call to make first next session, ~460 s.
#   fp8route/  run144.sh with NEW=r152 (branch land-route: main 3b6bbbf + patches/route_fp8_fuse.diff, kernels_out and
#              goldens regenerated) and BASE=r151 (main's route): test_quant_gpu (cut at 120 s), test_gpu <= 8 tokens,
#              test_vendored, moe_bench --graph at 1 and 2 tokens. Land the branch (merge, regenerate kernels_out and
#              goldens) if the tests pass and the 1-token fp8 layer is faster.
#   q/         Qwen3's 4096-token bucket on row blocks of 256 and 192 against the shipped ping-pong (run152.sh's q/).
#   ncu/       run153.sh (Nsight Compute of the pair and plain up GEMMs, bf16 and fp8, with L2 byte counts) on r151.
# r151, r152 are in this machine's build/ (mkr.sh copies; rebuild from the branches elsewhere). Carry
# ["build/r151", "build/r152"].
set -u
ROOT=$OUT
OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=120 TG=80 bash docs/perf/2026-12-07/run144.sh 260
OUT=$ROOT/q bash docs/perf/2026-12-07/q4096.sh build/r151 60
OUT=$ROOT/ncu B=build/r151 bash docs/perf/2026-12-07/run153.sh 120
cd "$ROOT" && tar czf run156.tgz --remove-files fp8route q ncu
