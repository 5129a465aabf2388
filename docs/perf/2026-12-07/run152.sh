#!/usr/bin/env bash
# Run 152 (twenty-seventh session): what is left of run 149, on builds of this session's main, in one call of ~300 s
# (bwd/ first, then q/, then fp8route/ with what is left: test_quant_gpu cut at 50 s, test_gpu <= 8 at 40 s).
#   fp8route/  run144.sh with NEW=r152 (branch land-route: main 3b6bbbf + patches/route_fp8_fuse.diff, kernels_out
#              and goldens regenerated) and BASE=r151 (branch fp8-mc, whose route is main's), test_quant_gpu cut at
#              120 s: test_quant_gpu, test_gpu <= 8 tokens, test_vendored, moe_bench --graph at 1 and 2 tokens;
#   q/         Qwen3's 4096-token bucket on row blocks of 256 (256 x 128, two consumers) and 192 (192 x 128, three) against
#              the shipped 64 x 256 ping-pong (tuned before those row blocks existed): moe_bench --graph at 4096 and
#              8192 tokens, q4096_rb256.tune / q4096_rb192.tune, interleaved, twice (r151);
#   bwd/       the weight gradients on a second stream beside the data gradients (r153 = main with
#              MOEGEN_WGRAD_SMS; docs/DESIGN.md, "The backward's second stream"): moe_bench --backward on Qwen3 and
#              Mixtral at 4096 tokens with it off, 33, 66 SMs; then test_bwd_gpu (train cases, examples; its
#              row-block case now expecting rowblock.tune's two GEMM variants) with MOEGEN_WGRAD_SMS=44 for what
#              is left. ("+ef" at 512 tokens, run143.sh, did not fit: a later call.)
# Carry ["build/r151", "build/r152", "build/r153"]. (Never run; its bwd/ part ran as run154.sh, which it now calls,
# and its q/ part is q4096.sh, shared with run156.sh.)
set -u
ROOT=$OUT
OUT=$ROOT/bwd bash docs/perf/2026-12-07/run154.sh   # its bwd/ part, as run 154 ran it
OUT=$ROOT/q bash docs/perf/2026-12-07/q4096.sh build/r151 45
OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=50 TG=40 bash docs/perf/2026-12-07/run144.sh 110
cd "$ROOT" && tar czf run152.tgz --remove-files fp8route q bwd
