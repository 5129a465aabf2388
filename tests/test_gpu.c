/* test_gpu.c — every kernel and the whole layer on the GPU against the CPU
 * reference (tests/support/ref.c), on fresh random inputs, outputs poisoned first.
 *
 * Without a driver or GPU every case reports itself skipped, with the
 * reason. The seed is printed; MOEGEN_TEST_SEED=N repeats a run. Cases
 * name their spec, token count and routing load:
 *   random  router weights random
 *   skew    one hot expert takes every token, a quarter of experts get none
 *   one     top-1 routing with every token on one expert
 *   permuted-slots  random routing, but the experts' weights stored in a
 *           random slot order given to the plan as its routing table, so
 *           the kernels must find each expert's weights through the table
 * Checks per run, one case per kernel family ("gemm_up: odd/bf16/random/T700";
 * on a sample of tokens where the CPU reference is slow):
 *   route            same expert sets as the reference (near-ties allowed),
 *                    weights, on up to 512 tokens (the first and last 64,
 *                    the rest random); counts equal the histogram of the
 *                    routing over every token
 *   permute_plan     offsets aligned and consistent, tile table exact
 *   permute_scatter  row map a bijection into each expert's rows
 *   gemm_up          SwiGLU rows vs the reference (given the GPU's routing)
 *   gemm_down        down-projection rows vs the reference
 *   combine          y vs the weighted sum of the GPU's own down rows, every
 *                    token; every output element written (no poison left)
 *   layer            y vs the reference; a token count above the spec's
 *                    capacity refused
 *   swiglu           the cuDNN path's activation kernel run alone (through
 *                    the plan's launcher) on random rows vs the reference's
 *                    activation; it writes min(offsets[E], cap) rows, no more
 *   pack             the device-side weight pack (moe_plan_pack_async) of
 *                    every checkpoint layout equals the host pack byte for
 *                    byte (all experts, a subset of slots, one expert at a
 *                    time, captured in a CUDA graph and replayed;
 *                    destination poisoned first); then the layer's
 *                    weights are packed on the device from gpt-oss's layouts
 *                    (one expert at a time, into the plan's slots) and every
 *                    forward of the case runs on them, checked against the
 *                    reference as `layer` is. Specs whose W1 is over 1 GB
 *                    keep the host-packed weights (byte check: over 64 MB
 *                    skipped)
 * Always, whatever the filter: the forward returns MOE_OK without a fault,
 * and route's expert indices are in range (every family reads them); the
 * route path each call takes (moe_plan_route_fuse: the permute plan, and
 * for the smallest calls the scatter, in route's last block up to 64
 * tokens; separate launches above, or everywhere with
 * MOEGEN_ROUTE_FUSE=off) is the one the rule gives and is printed, so the
 * permute_plan and permute_scatter checks above check whichever kernel
 * wrote the plan and the rows.
 *
 * Usage: test_gpu [--family LIST] [--cudnn] [--tokens-max N] [--tokens-min N] [SPEC-FILTER...]
 *   --family LIST  only these families' checks (comma-separated; a prefix
 *                  names several: "permute", "gemm"); the forward runs whole
 *   --cudnn        only the cuDNN cases (below)
 *   --tokens-max N only the calls of at most N tokens of each case (e.g. 64:
 *                  every case's fused-route calls, moe_plan_route_fuse)
 *   --tokens-min N only the calls of at least N tokens (with --tokens-max: a
 *                  band of call sizes, e.g. one tuning bucket's variant)
 *   SPEC-FILTER    only the cases whose spec (path or text) contains it; the
 *                  cuDNN cases run when no filter is given
 *   e.g. build/tests/test_gpu --family gemm_up examples/
 * Besides its listed calls, each case runs one call at the bucket of every
 * GEMM variant of its plan that none of them runs (the shipped table's
 * entries for an example spec, MOEGEN_TUNING's otherwise; not where cuDNN
 * takes a stage: that plan runs the capacity's variant at every size).
 * Tolerance: normalized L2 error <= 1.5e-2 for bf16, 4e-3 for fp16. */
#define _GNU_SOURCE
#include "check.h"
#include "cudnn.h"
#include "driver.h"
#include "launch_geom.h"
#include "moe.h"
#include "moe_impl.h" /* white box: the plan's launcher, for the families run alone */
#include "moe_internal.h"
#include "ref.h"
#include "spec.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MODE_RANDOM, MODE_SKEW, MODE_ONE, MODE_PERM };
static const char *const mode_names[] = {"random", "skew", "one", "permuted-slots"};

typedef struct {
    const char *spec;      /* a path, or inline spec text when it contains '=' */
    int mode;
    int tokens[8];
    int ntokens;
    int from_dir;          /* load kernels from a `moegen compile` folder, no NVRTC at run time */
    int cudnn;             /* moe_options.cudnn (MOE_CUDNN_DEFAULT: $MOEGEN_CUDNN decides); see cudnn_expect */
    int graph;             /* capture each forward into a CUDA graph, give it new x, replay (see run_tokens) */
    const char *tuning;    /* moe_options.tuning_path (and moegen compile --tuning); NULL: the default table */
} gpu_case_t;

/* A table with several token buckets for tiny, odd (and test_bwd_gpu's
 * train_softmax): one plan, several GEMM variants, each call on its own. */
#define VARIANTS_TUNE "tests/tune/variants.tune"
/* Every GEMM with 2 k tiles or more on the split-K grid (splitkS): odd's up
 * GEMM 16 ways and down 10, clamp's 3 and 2 (4 k tiles in 3 uneven
 * shares), tiny_fp16's up 3 (two consumer warpgroups, fp16), top1's 4. */
#define SPLITK_TUNE "tests/tune/splitk.tune"
/* Both GEMMs of every test shape on the gemv grid at every size
 * (templates/gemm_gemv.lua): bn 8..256 (8 and 16: warps sharing a group's K), unroll 1, 2, 4, bm 64 and 128,
 * partial last slices, K staged in one pass and (longk) several. */
#define GEMV_TUNE "tests/tune/gemv.tune"

static const char *const tiny_spec =
    "name = 'tiny' experts = 8 top_k = 2 hidden = 72 ffn = 40 tokens = 4096\n";
static const char *const tiny_fp16_spec =
    "name = 'tiny_fp16' experts = 8 top_k = 2 hidden = 136 ffn = 56 tokens = 1024 dtype = 'fp16'\n";
static const char *const top1_spec =
    "name = 'top1' experts = 16 top_k = 1 hidden = 256 ffn = 264 tokens = 2048\n";
static const char *const odd_spec =
    "name = 'odd' experts = 12 top_k = 3 hidden = 1536 ffn = 640 tokens = 2048\n"
    "router = { score = 'sigmoid', bias = true, groups = 4, topk_groups = 3, scale = 1.5 }\n";
static const char *const clamp_spec =
    "name = 'clamp' experts = 6 top_k = 2 hidden = 200 ffn = 88 tokens = 512 ffn_bias = true\n"
    "router = { logit_bias = true }\n"
    "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n";
static const char *const geglu_spec =
    "name = 'geglu' experts = 6 top_k = 2 hidden = 200 ffn = 88 tokens = 512\n"
    "activation = { kind = 'geglu', limit = 7.0, up_offset = 1 }\n";

/* K longer than the gemv kernels' staged columns (MOE_GEMV_KC = 4096) in
 * both GEMMs, neither a multiple of it nor of 256: two staging passes
 * with tails (tests/tune/gemv.tune) */
static const char *const longk_spec =
    "name = 'longk' experts = 6 top_k = 2 hidden = 4360 ffn = 4112 tokens = 512\n";

static const char *const wide_spec =
    "name = 'wide' experts = 384 top_k = 8 hidden = 64 ffn = 32 tokens = 600\n";

/* Shared experts (shared.ffn = m·ffn: m always-on slots after the routed
 * experts): ungated with m = 1 (DeepSeek's form) and m = 2 under grouped
 * sigmoid routing; gated by sigmoid(x·w_gate) with m = 2 under softmax
 * (Qwen2-MoE's form), with m = 1 in fp16, and with 256 experts, where the
 * gate's logit column (257) needs a second n8 tile pass past the experts.
 * shared_groups and shared_gated have H >= 512, so few tokens split route
 * over H (the tickets after every slot's count, the gate's column in the
 * partial logits): up to 2048 tokens (64 blocks of 32) it splits. */
static const char *const shared1_spec =
    "name = 'shared1' experts = 8 top_k = 2 hidden = 136 ffn = 40 tokens = 1024 shared = { ffn = 40 }\n";
static const char *const shared_groups_spec =
    "name = 'shared_groups' experts = 16 top_k = 4 hidden = 1024 ffn = 64 tokens = 1024\n"
    "router = { score = 'sigmoid', bias = true, groups = 4, topk_groups = 2, scale = 2.5 }\n"
    "shared = { ffn = 128 }\n";
static const char *const shared_gated_spec =
    "name = 'shared_gated' experts = 8 top_k = 2 hidden = 768 ffn = 40 tokens = 2048 router = { renormalize = false }\n"
    "shared = { ffn = 80, gate = 'sigmoid' }\n";
static const char *const shared_gated_fp16_spec =
    "name = 'shared_gated_fp16' experts = 6 top_k = 2 hidden = 200 ffn = 88 tokens = 512 dtype = 'fp16'\n"
    "shared = { ffn = 88, gate = 'sigmoid' }\n";
static const char *const shared_input_spec = /* Llama 4's form: the routed weight scales the input, the shared
                                               expert takes x unscaled with weight 1 */
    "name = 'shared_input' experts = 16 top_k = 1 hidden = 512 ffn = 128 tokens = 2048\n"
    "router = { score = 'sigmoid', renormalize = false, apply = 'input' } shared = { ffn = 256 }\n";
static const char *const shared_wide_spec =
    "name = 'shared_wide' experts = 256 top_k = 8 hidden = 64 ffn = 32 tokens = 600\n"
    "shared = { ffn = 64, gate = 'sigmoid' }\n";

/* Route, scatter and combine at large token counts and odd shapes (issue
 * #17): token counts that are not a multiple of route's 32-token block,
 * top_k 1, 2 and 8, 8 to 1024 experts, and each of route's logit tilings
 * (gen/family_route.c): few experts (k steps split 8 ways, 128-column
 * stages), an odd number of n8 tiles per warp (the gate's column, 40
 * experts), one pass over 384 grouped experts, three passes (512 experts and
 * a gate) and eight (1024 experts, 32-column stages); H not a multiple of
 * 16 (a k16 step half past H). H and F stay small so that the CPU side is
 * quick at 16384 tokens. */
static const char *const big_e8k1_spec =
    "name = 'big_e8k1' experts = 8 top_k = 1 hidden = 264 ffn = 32 tokens = 16384\n";
static const char *const big_e40k8_spec =
    "name = 'big_e40k8' experts = 40 top_k = 8 hidden = 520 ffn = 48 tokens = 16384 router = { renormalize = false }\n";
static const char *const big_gate_spec =
    "name = 'big_gate' experts = 128 top_k = 2 hidden = 200 ffn = 32 tokens = 16384\n"
    "shared = { ffn = 32, gate = 'sigmoid' }\n";
static const char *const big_e384_spec =
    "name = 'big_e384' experts = 384 top_k = 8 hidden = 136 ffn = 32 tokens = 16384\n"
    "router = { score = 'sigmoid', bias = true, groups = 8, topk_groups = 4, renormalize = true, scale = 2.5 }\n";
static const char *const big_e512_spec =
    "name = 'big_e512' experts = 512 top_k = 8 hidden = 64 ffn = 32 tokens = 4096\n"
    "shared = { ffn = 32, gate = 'sigmoid' }\n";
static const char *const big_e1024_spec =
    "name = 'big_e1024' experts = 1024 top_k = 2 hidden = 96 ffn = 32 tokens = 4096\n";

static const gpu_case_t cases[] = {
    {wide_spec, MODE_RANDOM, {1, 600}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {tiny_spec, MODE_RANDOM, {1, 7, 100, 333, 4096}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {tiny_spec, MODE_SKEW, {1, 65, 1000}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {odd_spec, MODE_RANDOM, {1, 700}, 2, 1, MOE_CUDNN_DEFAULT, 0, NULL},
    {odd_spec, MODE_PERM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {clamp_spec, MODE_PERM, {512}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {tiny_fp16_spec, MODE_RANDOM, {3, 513}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {top1_spec, MODE_ONE, {1, 129, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {odd_spec, MODE_RANDOM, {1, 257, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {odd_spec, MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {clamp_spec, MODE_RANDOM, {5, 512}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {geglu_spec, MODE_RANDOM, {5, 512}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/mixtral-8x7b.moe", MODE_RANDOM, {1, 128, 1000, 4096, 16384}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", MODE_RANDOM, {1, 128, 1000, 4096, 16383, 16384}, 6, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", MODE_SKEW, {777}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/deepseek-v3-ep8.moe", MODE_RANDOM, {1, 128, 4096}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/gpt-oss-120b.moe", MODE_RANDOM, {1, 128, 1000, 4096, 16384}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/deepseek-v3.moe", MODE_RANDOM, {1, 128, 4096, 16383, 16384}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/olmoe-1b-7b.moe", MODE_RANDOM, {1, 128, 1000}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/qwen3-235b-a22b.moe", MODE_RANDOM, {1, 128, 1000}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/gpt-oss-20b.moe", MODE_RANDOM, {1, 128, 1000}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* router.group_topk (1: a group scores its maximum) and top_k not a multiple of topk_groups,
     * in each of route's three group layouts */
    {"tests/specs/group_top1.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/group_nondiv.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/group_slots.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/group_12e.moe", MODE_RANDOM, {1, 257, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/group_12e.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* router.apply = "input": the weight scales the expert's input (scatter), combine sums with weight 1 */
    {"tests/specs/sqrtsoftplus.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL}, /* DeepSeek-V4 */
    {"tests/specs/softcap.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},      /* Laguna's cap */
    {"tests/specs/sparsemixer.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},  /* Phi-3.5-MoE */
    /* LongCat-Flash's zero experts: fused scatter (1, 5), fused plan (40), separate (333, 2048), skewed */
    {"tests/specs/zero_experts.moe", MODE_RANDOM, {1, 5, 40, 333, 2048}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/zero_experts.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* every entry a zero expert: no routed row, no tile; y = Σ_k w·x (the fused scatter at 1 and 5) */
    {"tests/specs/zero_experts.moe", MODE_ONE, {1, 5, 40, 333}, 4, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/apply_input.moe", MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/apply_input.moe", MODE_SKEW, {500}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/apply_input_k2.moe", MODE_RANDOM, {1, 129, 1024}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/apply_input_k2.moe", MODE_PERM, {700}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* given routing: DeepSeek-V4's hash layers (the caller's ids, the scores' weights) and a server's own
     * router (ids and weights), fused (1, 5: scatter; 40: plan) and not, skewed, replayed from a graph */
    {"tests/specs/given_ids.moe", MODE_RANDOM, {1, 5, 40, 333, 2048}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/given_ids.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {"tests/specs/given_weights.moe", MODE_RANDOM, {1, 5, 40, 333, 1024}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/given_weights.moe", MODE_SKEW, {1, 64}, 2, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* Gemma 4's router: its own input (router_x, steered in SKEW) and per-expert scales; GeGLU experts */
    {"tests/specs/router_own_input.moe", MODE_RANDOM, {1, 7, 64, 500, 2048}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/router_own_input.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* a latent MoE's router (router.hidden): router_x and router_w 1024 wide, x and the experts 256; sigmoid top-22 */
    {"tests/specs/router_latent.moe", MODE_RANDOM, {1, 7, 64, 500, 2048}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/router_latent.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* fp32 router weights (ERNIE 4.5's, LongCat-Flash's): router_w fp32, split into three parts in the route */
    {"tests/specs/router_fp32.moe", MODE_RANDOM, {1, 7, 64, 500, 2048}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/router_fp32.moe", MODE_SKEW, {300}, 1, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* Step-3.7-Flash's clamped layers: min(silu(gate), L) in every GEMM epilogue (a training plan's forward),
     * the shared expert's slots at their own L; HY-V4's: the shared expert unclamped */
    {"tests/specs/train_clamp_after.moe", MODE_RANDOM, {1, 7, 64, 333, 1024}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/shared_unclamped.moe", MODE_RANDOM, {1, 7, 64, 333, 1024}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"tests/specs/shared_unclamped.moe", MODE_RANDOM, {1, 64}, 2, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* NemotronH's non-gated relu2 experts (up_proj as the gate rows) and its relu2 shared expert */
    {"tests/specs/train_relu2.moe", MODE_RANDOM, {1, 7, 64, 333, 1024}, 5, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/nemotron-3-nano-30b-a3b.moe", MODE_RANDOM, {1, 128, 1000}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* captured and replayed as servers run decode steps */
    {tiny_spec, MODE_RANDOM, {1, 7, 64, 500, 4096}, 5, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {odd_spec, MODE_SKEW, {3, 300}, 2, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", MODE_RANDOM, {1, 128}, 2, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* the fused route (moe_plan_route_fuse) at 1, 5, 8 and 64 tokens (Qwen3 at 1 and 4, Mixtral up to 8,
     * DeepSeek-V3-EP8 at 1 scatter in route too; the rest up to 64 the plan only), separate launches at 65
     * and 200; eager (Qwen3; the others' eager calls of 1 token above) and replayed from CUDA graphs, every
     * family checked in both; MOEGEN_ROUTE_FUSE=off runs them all separate */
    {"examples/specs/qwen3-30b-a3b.moe", MODE_RANDOM, {1, 4, 5, 8, 64, 65, 200}, 7, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", MODE_RANDOM, {1, 4, 5, 8, 64, 65, 200}, 7, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {"examples/specs/mixtral-8x7b.moe", MODE_RANDOM, {1, 5, 8, 9, 64, 65, 200}, 7, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {"examples/specs/deepseek-v3-ep8.moe", MODE_SKEW, {1, 2, 5, 8, 64, 65, 200}, 7, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    /* shared experts (shared1 from a compiled folder too) */
    {shared1_spec, MODE_RANDOM, {1, 7, 333, 1024}, 4, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared1_spec, MODE_SKEW, {65, 1000}, 2, 1, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_groups_spec, MODE_RANDOM, {1, 257, 1024}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_groups_spec, MODE_PERM, {333}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_gated_spec, MODE_RANDOM, {1, 100, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_gated_spec, MODE_RANDOM, {1, 100}, 2, 0, MOE_CUDNN_DEFAULT, 1, NULL},
    {shared_gated_fp16_spec, MODE_RANDOM, {3, 512}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_wide_spec, MODE_RANDOM, {1, 600}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared_input_spec, MODE_RANDOM, {1, 333, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/llama-4-scout.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/deepseek-v2-lite.moe", MODE_RANDOM, {1, 37, 512, 4096}, 4, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/qwen2-moe-57b-a14b.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/glm-4.5-air.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/kimi-k2.moe", MODE_RANDOM, {1, 512}, 2, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* the example specs whose rules the tests/specs cases above hold apart (sqrt(softplus), hash routing's given
     * ids, the router's own input with per-expert scales, zero experts), whole */
    {"examples/specs/deepseek-v4.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/deepseek-v4-hash.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/gemma4-26b-a4b.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/longcat-flash.moe", MODE_RANDOM, {1, 37, 512}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* large token counts and odd shapes (above) */
    {big_e8k1_spec, MODE_RANDOM, {16384, 16381, 33}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e8k1_spec, MODE_SKEW, {16384}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e40k8_spec, MODE_RANDOM, {16384, 12345, 1}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_gate_spec, MODE_RANDOM, {16383, 4097, 5}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e384_spec, MODE_RANDOM, {16384, 9999, 2}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e384_spec, MODE_PERM, {16383}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e512_spec, MODE_RANDOM, {4096, 4001, 3}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {big_e1024_spec, MODE_RANDOM, {4096, 3001, 1}, 3, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    /* GEMM variants per call size (docs/DESIGN.md): one plan, each call of
     * these token counts on the variant of its bucket (tiny: 1, 64, 500,
     * 2048; odd: 1, 256, 1024), the bucket edges on both sides, the
     * capacity; eager, replayed from CUDA graphs (one per size, as servers
     * capture), from a compiled folder, permuted slots, skewed routing */
    {tiny_spec, MODE_RANDOM, {1, 7, 64, 500, 2048, 4096}, 6, 0, MOE_CUDNN_DEFAULT, 0, VARIANTS_TUNE},
    {tiny_spec, MODE_SKEW, {63, 65, 499, 501, 2047}, 5, 0, MOE_CUDNN_DEFAULT, 0, VARIANTS_TUNE},
    {tiny_spec, MODE_RANDOM, {1, 7, 64, 500, 4096}, 5, 0, MOE_CUDNN_DEFAULT, 1, VARIANTS_TUNE},
    {odd_spec, MODE_PERM, {1, 255, 256, 1023, 1024, 2048}, 6, 0, MOE_CUDNN_DEFAULT, 0, VARIANTS_TUNE},
    {odd_spec, MODE_RANDOM, {3, 300, 1500}, 3, 1, MOE_CUDNN_DEFAULT, 0, VARIANTS_TUNE},
    {odd_spec, MODE_SKEW, {2, 257, 2048}, 3, 0, MOE_CUDNN_DEFAULT, 1, VARIANTS_TUNE},
    /* split-K GEMMs (docs/DESIGN.md): the partials summed by the last CTA of each tile, its ticket reset
     * (the down GEMM takes the tickets the up GEMM left: wrong sums if a reset were missed); eager and
     * replayed from CUDA graphs, skewed routing (empty experts, ragged tiles), a compiled folder */
    {odd_spec, MODE_RANDOM, {1, 7, 64, 300}, 4, 0, MOE_CUDNN_DEFAULT, 1, SPLITK_TUNE},
    {odd_spec, MODE_SKEW, {2, 64, 1500}, 3, 0, MOE_CUDNN_DEFAULT, 0, SPLITK_TUNE},
    {clamp_spec, MODE_RANDOM, {1, 33, 512}, 3, 0, MOE_CUDNN_DEFAULT, 1, SPLITK_TUNE},
    {tiny_fp16_spec, MODE_SKEW, {1, 100, 1024}, 3, 0, MOE_CUDNN_DEFAULT, 0, SPLITK_TUNE},
    {top1_spec, MODE_ONE, {1, 129}, 2, 1, MOE_CUDNN_DEFAULT, 0, SPLITK_TUNE},
    /* gemv GEMMs (docs/DESIGN.md, "The GEMM grids"): 1, 7, 64, 300 tokens, so a tile's rows run in
     * chunks of 1, 2, 4 and 8 and whole 64- and 128-row tiles loop over 8-row chunks; eager and
     * replayed from CUDA graphs, skewed routing (empty experts, ragged tiles), one-hot, fp16, the
     * clamped SwiGLU with biases, GeGLU, K in several staging passes, a compiled folder */
    {odd_spec, MODE_RANDOM, {1, 7, 64, 300}, 4, 0, MOE_CUDNN_DEFAULT, 1, GEMV_TUNE},
    {odd_spec, MODE_SKEW, {2, 64, 1500}, 3, 0, MOE_CUDNN_DEFAULT, 0, GEMV_TUNE},
    {tiny_spec, MODE_RANDOM, {1, 7, 64, 300}, 4, 0, MOE_CUDNN_DEFAULT, 0, GEMV_TUNE},
    {clamp_spec, MODE_RANDOM, {1, 7, 33, 512}, 4, 0, MOE_CUDNN_DEFAULT, 1, GEMV_TUNE},
    {geglu_spec, MODE_RANDOM, {1, 7, 64, 300}, 4, 0, MOE_CUDNN_DEFAULT, 0, GEMV_TUNE},
    {tiny_fp16_spec, MODE_SKEW, {1, 7, 100, 1024}, 4, 0, MOE_CUDNN_DEFAULT, 0, GEMV_TUNE},
    {top1_spec, MODE_ONE, {1, 7, 129}, 3, 1, MOE_CUDNN_DEFAULT, 0, GEMV_TUNE},
    {wide_spec, MODE_RANDOM, {1, 7, 64, 600}, 4, 0, MOE_CUDNN_DEFAULT, 1, GEMV_TUNE},
    {longk_spec, MODE_RANDOM, {1, 7, 64}, 3, 0, MOE_CUDNN_DEFAULT, 1, GEMV_TUNE},
};

/* The cuDNN path (README, "cuDNN"): run by `test_gpu --cudnn` too, once per
 * cuDNN the GPU machine has. With cudnn = on a case either takes cuDNN for
 * both stages and passes the same checks as the generated kernels, or is
 * refused with the reason that cudnn_expect predicts from the loaded
 * version. */
static const gpu_case_t cudnn_cases[] = {
    {tiny_spec, MODE_RANDOM, {1, 100, 4096}, 3, 0, MOE_CUDNN_ON, 0, NULL},
    {top1_spec, MODE_ONE, {1, 129, 2048}, 3, 0, MOE_CUDNN_ON, 0, NULL},
    {odd_spec, MODE_SKEW, {1, 300, 2048}, 3, 0, MOE_CUDNN_ON, 0, NULL},
    {odd_spec, MODE_PERM, {333}, 1, 0, MOE_CUDNN_ON, 0, NULL},
    {clamp_spec, MODE_RANDOM, {512}, 1, 0, MOE_CUDNN_ON, 0, NULL},
    {geglu_spec, MODE_RANDOM, {512}, 1, 0, MOE_CUDNN_ON, 0, NULL},
    {tiny_fp16_spec, MODE_RANDOM, {513}, 1, 0, MOE_CUDNN_ON, 0, NULL},
    {"examples/specs/mixtral-8x7b.moe", MODE_RANDOM, {1, 128, 4096}, 3, 0, MOE_CUDNN_ON, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", MODE_RANDOM, {1, 128, 4096}, 3, 0, MOE_CUDNN_ON, 0, NULL},
    {"examples/specs/deepseek-v3-ep8.moe", MODE_RANDOM, {128}, 1, 0, MOE_CUDNN_AUTO, 0, NULL},
    {tiny_spec, MODE_RANDOM, {100}, 1, 0, MOE_CUDNN_OFF, 0, NULL},
    {tiny_spec, MODE_RANDOM, {100}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {"examples/specs/mixtral-8x7b.moe", MODE_RANDOM, {128}, 1, 0, MOE_CUDNN_DEFAULT, 0, NULL},
    {shared1_spec, MODE_RANDOM, {100}, 1, 0, MOE_CUDNN_ON, 0, NULL},   /* refused: the shared expert is not in the graph */
    /* several GEMM variants: a plan whose stages take cuDNN runs the capacity's at every size */
    {tiny_spec, MODE_RANDOM, {1, 100, 4096}, 3, 0, MOE_CUDNN_ON, 0, VARIANTS_TUNE},
};

/* The cuDNN this process loads ($MOEGEN_CUDNN_PATH, else the default
 * search), the same one every plan gets: its version, 0 if none loads. */
static int cudnn_env_off(void) {
    const char *e = getenv("MOEGEN_CUDNN");
    return e && strcmp(e, "off") == 0;
}

static int cudnn_loaded_version(char *why, size_t n) {
    if (cudnn_env_off()) { /* nothing may load it, this test included */
        snprintf(why, n, "MOEGEN_CUDNN=off");
        return 0;
    }
    const char *path = getenv("MOEGEN_CUDNN_PATH");
    int v = 0;
    if (moe_cudnn_load(path && *path ? path : NULL, &v, why, n))
        return 0;
    snprintf(why, n, "loaded");
    return v;
}

/* ---- random data, filled by several threads ----------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct {
    uint16_t *dst;
    size_t begin, end;
    float scale;
    uint64_t seed;
    moe_dtype_t dt;
} fill_job_t;

static void *fill_worker(void *arg) {
    fill_job_t *j = arg;
    uint64_t s = j->seed ^ (j->begin * 0x2545f4914f6cdd1dULL);
    for (size_t i = j->begin; i < j->end; i++) {
        uint64_t r = splitmix(&s);
        float u = (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
        j->dst[i] = moe_float_to_half(u * j->scale, j->dt);
    }
    return NULL;
}

/* dst[i] = uniform(-scale, scale) in dtype. */
static void fill_random(uint16_t *dst, size_t n, float scale, uint64_t seed, moe_dtype_t dt) {
    enum { MAXT = 32 };
    long nt = sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > MAXT)
        nt = MAXT;
    if (n < (1u << 20))
        nt = 1;
    pthread_t th[MAXT];
    fill_job_t jobs[MAXT];
    for (long t = 0; t < nt; t++) {
        jobs[t] = (fill_job_t){dst, n * (size_t)t / (size_t)nt, n * (size_t)(t + 1) / (size_t)nt, scale, seed, dt};
        pthread_create(&th[t], NULL, fill_worker, &jobs[t]);
    }
    for (long t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
}

/* ---- device helpers ----------------------------------------------------- */

static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, moe_cu_error_string(r));
    return 0;
}

static CUdeviceptr dev_upload(const void *host, size_t bytes) {
    CUdeviceptr d = 0;
    if (!bytes)
        return 0;
    if (!cu_ok(moe_cu.cuMemAlloc(&d, bytes), "cuMemAlloc"))
        return 0;
    if (host && !cu_ok(moe_cu.cuMemcpyHtoD(d, host, bytes), "cuMemcpyHtoD")) {
        moe_cu.cuMemFree(d);
        return 0;
    }
    return d;
}

static double rel_l2(double num, double den) { return den > 0 ? sqrt(num / den) : sqrt(num); }

/* ---- one case ------------------------------------------------------------ */

static char tmpdir[256];

static const char *spec_path_for(const char *spec, char *buf, size_t n) {
    if (!strchr(spec, '='))
        return spec;
    static int counter;
    snprintf(buf, n, "%s/case%d.moe", tmpdir, counter++);
    FILE *f = fopen(buf, "w");
    if (f) {
        fputs(spec, f);
        fclose(f);
    }
    return buf;
}

/* The guard after the workspace (test_gpu's run_tokens): its bytes, and
 * their poison (the workspace's is 0xff). */
#define WS_GUARD 4096
#define WS_GUARD_BYTE 0xa5

typedef struct {
    moe_spec_t s;
    uint16_t *x, *wr, *w1, *w2, *b1, *b2, *w1p, *b1p;
    uint16_t *ws1, *ws2, *wsg;   /* the shared expert, unsplit (spec shared.ffn): [2F_s, H], [H, F_s], [H] */
    float *sel_bias, *logit_bias;
    int *gids;      /* router.select = "given": the caller's ids [T, K] (some out of range: dropped) */
    float *gw;      /* router.score = "given": the caller's weights [T, K] */
    uint16_t *rx;   /* router.input = "separate": the router's own input [T, HR] (router.hidden, else H) */
    float *es;      /* router.expert_scale: fp32 [E] */
    float *wr32;    /* router.weight_dtype = "fp32": the router weight [NS, H], wr's values moved off the dtype's grid */
    CUdeviceptr dx, dwr, dw1p, dw2, db1p, db2, dsel, dlogit, dy, dws, dwsg, dgids, dgw, drx, des;
    size_t ws_bytes;   /* dws: moe_plan_workspace_size at the capacity, then WS_GUARD guard bytes */
    size_t ws_at, ws_call; /* this call's workspace: its exact size, ending where ws_bytes ends */
    int *slot;      /* the plan's slot of each expert (MODE_PERM), NULL = identity */
    int device_packed; /* the device weights were packed on the device (the pack case) */
    int all_zero;      /* every entry routed to a zero expert (MODE_ONE with zero experts): no tile */
} layer_t;

static void layer_free(layer_t *L) {
    free(L->x); free(L->wr); free(L->w1); free(L->w2); free(L->b1); free(L->b2); free(L->w1p); free(L->b1p);
    free(L->ws1); free(L->ws2); free(L->wsg);
    free(L->sel_bias); free(L->logit_bias); free(L->slot); free(L->gids); free(L->gw); free(L->rx); free(L->es);
    free(L->wr32);
    CUdeviceptr d[] = {L->dx, L->dwr, L->dw1p, L->dw2, L->db1p, L->db2, L->dsel, L->dlogit, L->dy, L->dws, L->dwsg,
                       L->dgids, L->dgw, L->drx, L->des};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i])
            moe_cu.cuMemFree(d[i]);
}

/* Random inputs of one case. SKEW and ONE steer routing through the first
 * 8 hidden dimensions: x is biased positive there, the hot expert's router
 * row strongly positive, dead experts' rows strongly negative. A shared
 * expert's unsplit weights are random too, and moe_plan_pack_shared puts
 * them in the device weights' slots E.. (ES slots in all). */
static int layer_init(layer_t *L, const moe_plan *plan, int mode, uint64_t seed) {
    const moe_spec_t *s = &L->s;
    size_t E = s->experts, H = s->hidden, F = s->ffn, T = s->tokens;
    size_t ES = (size_t)moe_spec_slots(s), FS = (size_t)s->shared.ffn;
    size_t NS = (size_t)moe_spec_scored(s); /* router rows and biases: the zero experts' too */
    const size_t HR = (size_t)moe_spec_router_hidden(s); /* the router's width: wr [NS, HR], rx [T, HR] */
    moe_dtype_t dt = s->dtype;
    L->x = malloc(T * H * 2);
    L->wr = malloc(NS * HR * 2);
    L->w1 = malloc(E * 2 * F * H * 2);
    L->w1p = malloc(ES * 2 * F * H * 2);
    L->w2 = malloc(ES * H * F * 2);
    L->sel_bias = malloc(NS * 4);
    L->logit_bias = malloc(NS * 4);
    L->b1 = malloc(E * 2 * F * 2);
    L->b1p = malloc(E * 2 * F * 2);
    L->b2 = malloc(E * H * 2);
    if (!L->x || !L->wr || !L->w1 || !L->w1p || !L->w2 || !L->b1 || !L->b1p || !L->b2)
        return 0;
    fill_random(L->x, T * H, 1.0f, seed + 1, dt);
    /* the router's own input (router.input = "separate"): rows of its own, steered as x is below */
    const int own = s->router.input == MOE_ROUTER_INPUT_SEPARATE;
    if (own && !(L->rx = malloc(T * HR * 2)))
        return 0;
    if (own)
        fill_random(L->rx, T * HR, 1.0f, seed + 11, dt);
    uint16_t *steer = own ? L->rx : L->x;   /* the rows the logits read, SH wide */
    const size_t SH = own ? HR : H;
    fill_random(L->wr, NS * HR, 1.0f / sqrtf((float)HR) * 4.0f, seed + 2, dt);
    fill_random(L->w1, E * 2 * F * H, 2.0f / sqrtf((float)H), seed + 3, dt);
    fill_random(L->w2, E * H * F, 2.0f / sqrtf((float)F), seed + 4, dt);
    fill_random(L->b1, E * 2 * F, 0.5f, seed + 5, dt);
    fill_random(L->b2, E * H, 0.5f, seed + 6, dt);
    uint64_t r = seed + 7;
    for (size_t e = 0; e < NS; e++) {
        L->sel_bias[e] = (float)((splitmix(&r) >> 40) / 16777216.0 - 0.5) * 0.2f;
        L->logit_bias[e] = (float)((splitmix(&r) >> 40) / 16777216.0 - 0.5) * 2.0f;
    }
    if (mode == MODE_ONE && s->zero_experts && H >= 8) {
        /* every entry a zero expert: the routed experts' rows dead and their selection bias -1, so no
         * token has a routed row and the call no tile (the FFN's GEMMs run empty, combine sums x rows) */
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < 8; h++)
                steer[t * SH + h] = moe_float_to_half(1.0f + 0.25f * moe_half_to_float(steer[t * SH + h], dt), dt);
        L->all_zero = 1;
        for (size_t e = 0; e < E; e++) {
            L->sel_bias[e] = -1.0f;
            for (size_t h = 0; h < 8; h++)
                L->wr[e * HR + h] = moe_float_to_half(-3.0f, dt);
        }
    } else if ((mode == MODE_SKEW || mode == MODE_ONE) && H >= 8) {
        size_t hot = splitmix(&r) % E;
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < 8; h++)
                steer[t * SH + h] = moe_float_to_half(1.0f + 0.25f * moe_half_to_float(steer[t * SH + h], dt), dt);
        for (size_t e = 0; e < E; e++) {
            int dead = mode == MODE_ONE ? e != hot : (e % 4 == 3 && e != hot);
            float v = e == hot ? 3.0f : dead ? -3.0f : 0.0f;
            if (v != 0.0f)
                for (size_t h = 0; h < 8; h++)
                    L->wr[e * HR + h] = moe_float_to_half(v, dt);
        }
    }
    if (s->router.select == MOE_SELECT_GIVEN) {
        /* the caller's ids: uniform over the experts (repeats within a token allowed; SKEW: every fourth
         * token's all on one expert), about one in 16 out of range (-1, E, 2^30: dropped, counted); its
         * weights (score "given") in (0, 1] */
        const size_t K = (size_t)s->top_k;
        L->gids = malloc(T * K * sizeof(int));
        L->gw = malloc(T * K * sizeof(float));
        if (!L->gids || !L->gw)
            return 0;
        const size_t hot = splitmix(&r) % E;
        for (size_t i = 0; i < T * K; i++) {
            const uint64_t u = splitmix(&r);
            L->gids[i] = (u & 15) == 0 ? ((u >> 4) % 3 == 0 ? -1 : (u >> 4) % 3 == 1 ? (int)E : 1 << 30)
                         : mode != MODE_RANDOM && (i / K) % 4 == 0 ? (int)hot : (int)((u >> 8) % E);
            L->gw[i] = (float)((splitmix(&r) >> 40) / 16777216.0) + 1e-3f;
        }
        L->dgids = dev_upload(L->gids, T * K * sizeof(int));
        L->dgw = dev_upload(L->gw, T * K * sizeof(float));
        if (!L->dgids || !L->dgw)
            return 0;
    }
    if (s->router.expert_scale) { /* Gemma 4's per_expert_scale: in [0.25, 1.75) */
        if (!(L->es = malloc(E * sizeof(float))))
            return 0;
        for (size_t e = 0; e < E; e++)
            L->es[e] = 0.25f + 1.5f * (float)((splitmix(&r) >> 40) / 16777216.0);
        if (!(L->des = dev_upload(L->es, E * sizeof(float))))
            return 0;
    }
    if (own && !(L->drx = dev_upload(L->rx, T * HR * 2)))
        return 0;
    if (moe_plan_pack_w1(plan, L->w1, L->w1p) != MOE_OK || moe_plan_pack_b1(plan, L->b1, L->b1p) != MOE_OK)
        return 0;
    if (FS) {
        L->ws1 = malloc(2 * FS * H * 2);
        L->ws2 = malloc(H * FS * 2);
        L->wsg = malloc(H * 2);
        if (!L->ws1 || !L->ws2 || !L->wsg)
            return 0;
        fill_random(L->ws1, 2 * FS * H, 2.0f / sqrtf((float)H), seed + 8, dt);
        fill_random(L->ws2, H * FS, 2.0f / sqrtf((float)FS), seed + 9, dt);
        fill_random(L->wsg, H, 2.0f / sqrtf((float)H), seed + 10, dt); /* gate logits of a few units */
        if (moe_plan_pack_shared(plan, L->ws1, L->ws2, L->w1p, L->w2) != MOE_OK)
            return 0;
        L->dwsg = dev_upload(L->wsg, H * 2);
        if (!L->dwsg)
            return 0;
    }
    L->ws_bytes = moe_plan_workspace_size(plan, (int)T);
    L->dx = dev_upload(L->x, T * H * 2);
    if (s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32) { /* each weight 1 + u·2^-10 times the half: the parts
                                                              * past the dtype's carry it */
        if (!(L->wr32 = malloc(NS * HR * 4)))
            return 0;
        uint64_t q = seed + 12;
        for (size_t i = 0; i < NS * HR; i++)
            L->wr32[i] = moe_half_to_float(L->wr[i], dt) *
                         (1.0f + (float)((splitmix(&q) >> 40) / 16777216.0 - 0.5) * 0x1p-9f);
    }
    L->dwr = L->wr32 ? dev_upload(L->wr32, NS * HR * 4) : dev_upload(L->wr, NS * HR * 2);
    L->dw1p = dev_upload(L->w1p, ES * 2 * F * H * 2);
    L->dw2 = dev_upload(L->w2, ES * H * F * 2);
    L->db1p = dev_upload(L->b1p, E * 2 * F * 2);
    L->db2 = dev_upload(L->b2, E * H * 2);
    L->dsel = dev_upload(L->sel_bias, NS * 4);
    L->dlogit = dev_upload(L->logit_bias, NS * 4);
    L->dy = dev_upload(NULL, T * H * 2);
    L->dws = dev_upload(NULL, L->ws_bytes + WS_GUARD);
    L->ws_at = 0, L->ws_call = L->ws_bytes;
    free(L->w1p);
    L->w1p = NULL;
    return L->dx && L->dwr && L->dw1p && L->dw2 && L->db1p && L->db2 && L->dsel && L->dlogit && L->dy && L->dws;
}

/* Store expert g's weights at slot perm[g] on the device and give the plan
 * that table (MODE_PERM). The host copies keep the global order, so the
 * reference is unchanged. */
static int permute_slots(moe_plan *plan, layer_t *L, uint64_t seed) {
    const moe_spec_t *s = &L->s;
    size_t E = s->experts, H = s->hidden, F = s->ffn;
    int *perm = malloc(sizeof(int) * E);
    uint16_t *w1p = malloc(E * 2 * F * H * 2);
    if (!perm || !w1p)
        return 0;
    for (size_t e = 0; e < E; e++)
        perm[e] = (int)e;
    uint64_t r = seed;
    for (size_t e = E - 1; e > 0; e--) {
        size_t j = splitmix(&r) % (e + 1);
        int t = perm[e];
        perm[e] = perm[j];
        perm[j] = t;
    }
    int ok = moe_plan_pack_w1(plan, L->w1, w1p) == MOE_OK;
    for (size_t g = 0; g < E && ok; g++) {
        size_t d = (size_t)perm[g];
        ok = cu_ok(moe_cu.cuMemcpyHtoD(L->dw1p + d * 2 * F * H * 2, w1p + g * 2 * F * H, 2 * F * H * 2), "w1p") &&
             cu_ok(moe_cu.cuMemcpyHtoD(L->dw2 + d * H * F * 2, L->w2 + g * H * F, H * F * 2), "w2") &&
             cu_ok(moe_cu.cuMemcpyHtoD(L->db1p + d * 2 * F * 2, L->b1p + g * 2 * F, 2 * F * 2), "b1p") &&
             cu_ok(moe_cu.cuMemcpyHtoD(L->db2 + d * H * 2, L->b2 + g * H, H * 2), "b2");
    }
    moe_status st = ok ? moe_plan_set_slot_table(plan, perm) : MOE_ERR_CUDA;
    CHECKF(st == MOE_OK, "moe_plan_set_slot_table: %s", moe_last_error());
    if (E > 1) { /* a repeated slot is refused, and the table is left as it was */
        int keep = perm[1];
        perm[1] = perm[0];
        CHECK(moe_plan_set_slot_table(plan, perm) == MOE_ERR_INVALID_ARG);
        perm[1] = keep;
        CHECK(moe_plan_set_slot_table(plan, perm) == MOE_OK);
    }
    L->slot = perm;
    free(w1p);
    return ok && st == MOE_OK;
}

/* Region `name` of the workspace of a call of T tokens (at L->ws_at), read
 * back (caller frees). */
static void *region(const moe_plan *plan, const layer_t *L, int T, const char *name, size_t *bytes) {
    size_t off, n;
    if (moe_plan_workspace_region_at(plan, T, name, &off, &n) != MOE_OK)
        return NULL;
    void *h = malloc(n ? n : 1);
    if (h && !cu_ok(moe_cu.cuMemcpyDtoH(h, L->dws + L->ws_at + off, n), name)) {
        free(h);
        return NULL;
    }
    if (bytes)
        *bytes = n;
    return h;
}

/* The workspace of a call of T tokens: exactly moe_plan_workspace_size(plan,
 * T) bytes placed at the end of the capacity's, so that a byte written past
 * what that size promises lands in the guard after it (or faults). */
static int ws_place(const moe_plan *plan, layer_t *L, int T) {
    L->ws_call = moe_plan_workspace_size(plan, T);
    CHECKF(L->ws_call > 0 && L->ws_call <= L->ws_bytes && L->ws_call % 256 == 0,
           "moe_plan_workspace_size(%d) = %zu, at the capacity %zu", T, L->ws_call, L->ws_bytes);
    if (!L->ws_call || L->ws_call > L->ws_bytes)
        return 0;
    L->ws_at = L->ws_bytes - L->ws_call;
    return 1;
}

/* Poison the whole allocation: the bytes before the call's workspace and
 * the workspace 0xff, the guard after it WS_GUARD_BYTE. */
static int ws_poison(const layer_t *L) {
    return cu_ok(moe_cu.cuMemsetD8(L->dws, 0xff, L->ws_bytes), "poison workspace") &&
           cu_ok(moe_cu.cuMemsetD8(L->dws + L->ws_bytes, WS_GUARD_BYTE, WS_GUARD), "poison the guard");
}

/* Bytes written outside the call's workspace since ws_poison: in the guard
 * after it, and in the (at most 64 MB) just before it. */
static size_t ws_outside_writes(const layer_t *L) {
    const size_t before = L->ws_at < ((size_t)64 << 20) ? L->ws_at : ((size_t)64 << 20);
    uint8_t *h = malloc(before + WS_GUARD);
    if (!h || (before && !cu_ok(moe_cu.cuMemcpyDtoH(h, L->dws + L->ws_at - before, before), "read before it")) ||
        !cu_ok(moe_cu.cuMemcpyDtoH(h + before, L->dws + L->ws_bytes, WS_GUARD), "read the guard")) {
        free(h);
        return (size_t)-1;
    }
    size_t n = 0;
    for (size_t i = 0; i < before; i++)
        n += h[i] != 0xff;
    for (size_t i = 0; i < WS_GUARD; i++)
        n += h[before + i] != WS_GUARD_BYTE;
    free(h);
    return n;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* ---- the families ----------------------------------------------------------
 *
 * Every forward is checked kernel family by kernel family, each family a
 * case of its own ("gemm_up: odd/bf16/random/T700"), and `--family NAME`
 * runs only the named families' checks. The forward itself always runs
 * whole (a family reads what the one before it wrote), and what every
 * family depends on is always checked: the forward returned MOE_OK without
 * a fault, and route's expert indices are in range. */
enum { FAM_ROUTE, FAM_PERMUTE_PLAN, FAM_PERMUTE_SCATTER, FAM_GEMM_UP, FAM_GEMM_DOWN, FAM_COMBINE, FAM_LAYER,
       FAM_SWIGLU, FAM_PACK, FAM_COUNT };
static const char *const family_names[FAM_COUNT] = {"route", "permute_plan", "permute_scatter", "gemm_up",
                                                    "gemm_down", "combine", "layer", "swiglu", "pack"};
static unsigned families_on = (1u << FAM_COUNT) - 1;
static int tokens_max = 0; /* --tokens-max: 0 = every call */
static int tokens_min = 0; /* --tokens-min: 0 = every call */

static int family_on(int f) { return (families_on >> f) & 1u; }

/* Select the families a --family argument names: a comma-separated list,
 * each item a family's name or its start ("permute" = both permute
 * kernels, "gemm" = both GEMMs) or a longer name that starts with one
 * ("gemm_up_swiglu" = gemm_up). Returns 0 for an item naming none. */
static int select_families(const char *list, unsigned *set) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        unsigned hit = 0;
        size_t n = strlen(item);
        for (int f = 0; f < FAM_COUNT; f++) {
            size_t m = strlen(family_names[f]);
            if (n > 0 && (strncmp(family_names[f], item, n) == 0 || (n > m && strncmp(item, family_names[f], m) == 0 &&
                                                                     item[m] == '_')))
                hit |= 1u << f;
        }
        if (!hit)
            return 0;
        *set |= hit;
    }
    return 1;
}

/* CASE("family: label") for family f, in a buffer of the caller's. */
static void family_case(char *buf, size_t n, int f, const char *label) {
    snprintf(buf, n, "%s: %s", family_names[f], label);
    CASE(buf);
}

/* route: the same expert sets as the reference on the sampled tokens
 * (near-ties allowed) and the same weights; counts equal the histogram of
 * the routing over all tokens. */
static void check_route(const layer_t *L, int T, const int *idx, const float *w, const int *counts,
                        const int *sample, int ns) {
    const moe_spec_t *s = &L->s;
    const int E = s->experts, K = s->top_k, H = s->hidden;
    const int KE = moe_spec_entries(s), ES = moe_spec_slots(s); /* GPU: [T, KE] entries over ES slots */
    const int NS = moe_spec_scored(s), NI = ES + s->zero_experts; /* scored experts; index bound (zero experts) */
    uint16_t *xs = malloc((size_t)ns * H * 2);
    int *ridx = malloc(sizeof(int) * (size_t)ns * K), *gidx = malloc(sizeof(int) * (size_t)ns * K);
    float *rw = malloc(sizeof(float) * (size_t)ns * K), *sc = malloc(sizeof(float) * (size_t)ns * NS);
    int *hist = calloc((size_t)NI, sizeof(int));
    float *gref = malloc(sizeof(float) * (size_t)ns);
    CHECK(xs && ridx && gidx && rw && sc && hist && gref);
    if (!xs || !ridx || !gidx || !rw || !sc || !hist || !gref)
        goto done;
    for (int i = 0; i < ns; i++)
        memcpy(xs + (size_t)i * H, L->x + (size_t)sample[i] * H, (size_t)H * 2);
    const size_t HR = (size_t)moe_spec_router_hidden(&L->s);   /* router_x's width */
    uint16_t *srx = L->rx ? malloc((size_t)ns * HR * 2) : NULL;   /* the router's own input, sampled */
    CHECK(!L->rx || srx);
    for (int i = 0; srx && i < ns; i++)
        memcpy(srx + (size_t)i * HR, L->rx + (size_t)sample[i] * HR, HR * 2);
    const int given = s->router.select == MOE_SELECT_GIVEN;
    int *sids = given ? malloc(sizeof(int) * (size_t)ns * K) : NULL;   /* the caller's ids (and weights) */
    float *sw = given ? malloc(sizeof(float) * (size_t)ns * K) : NULL;  /* of the sampled tokens */
    for (int i = 0; given && sids && sw && i < ns; i++) {
        memcpy(sids + (size_t)i * K, L->gids + (size_t)sample[i] * K, sizeof(int) * (size_t)K);
        memcpy(sw + (size_t)i * K, L->gw + (size_t)sample[i] * K, sizeof(float) * (size_t)K);
    }
    CHECK(!given || (sids && sw));
    moe_ref_inputs_t in = {.x = xs, .wr = L->wr, .sel_bias = L->sel_bias, .logit_bias = L->logit_bias,
                           .tokens = ns, .given_ids = sids, .given_w = sw, .router_x = srx, .expert_scale = L->es,
                           .wr32 = L->wr32};
    CHECK(moe_ref_route(s, &in, ridx, rw, sc) == 0);
    for (int i = 0; i < ns; i++)
        memcpy(gidx + (size_t)i * K, idx + (size_t)sample[i] * KE, sizeof(int) * (size_t)K);
    if (given) { /* entry for entry: the caller's id (a dropped one at expert 0), its weight */
        int same = 1;
        double gerr = 0;
        for (long i = 0; i < (long)ns * K; i++) {
            same &= gidx[i] == ridx[i];
            const double d = fabs(w[(size_t)sample[i / K] * KE + i % K] - rw[i]);
            gerr = d > gerr ? d : gerr;
        }
        CHECKF(same, "route: the entries' experts are not the caller's ids");
        CHECKF(gerr <= 1e-4 * s->router.scale + 1e-4, "route: given-routing weights differ by %g", gerr);
    }
    free(sids), free(sw), free(srx);
    int bad = -1;
    /* sparsemixer routes on the logits rounded to the dtype (bf16: 8 bits), and an fp32 logit within its
     * accumulation error of a rounding boundary may round either way on the GPU and in the reference (double
     * sums): its selection ties are a bf16 step wide, its weights a step of the dtype apart, and a logit that
     * rounds the other way at the band's edge moves a weight by more (a few tokens) */
    const int in_dtype = s->router.score == MOE_SCORE_SPARSEMIXER;
    int agree = given || moe_ref_route_agree(s, ridx, gidx, sc, ns, in_dtype ? 4e-2f : 2e-4f, &bad);
    CHECKF(agree, "route: token %d selects different experts than the reference", bad >= 0 ? sample[bad] : -1);
    double werr = 0;
    int wild = 0; /* in_dtype: tokens whose weights differ by more than a dtype step */
    for (int i = 0; i < ns && !given; i++) { /* given routing: checked entry for entry above */
        int off = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < K; j++)
                if (gidx[(size_t)i * K + j] == ridx[(size_t)i * K + k]) {
                    double d = fabs(w[(size_t)sample[i] * KE + j] - rw[(size_t)i * K + k]);
                    if (in_dtype && d > 8e-3)
                        off = 1;
                    else if (d > werr)
                        werr = d;
                }
        wild += off;
    }
    CHECKF(werr <= (in_dtype ? 8e-3 : 1e-4 * s->router.scale + 1e-4), "route weights differ by %g", werr);
    CHECKF(wild <= (ns + 127) / 128, "route: %d of %d tokens' sparsemixer weights differ by more than a bf16 step "
           "(a logit rounded across the band's edge)", wild, ns);
    if (KE > K) { /* the shared expert's entries: slots E.. in order, weight g(x) (1, or the sigmoid gate) */
        moe_ref_inputs_t sin = {.x = xs, .ws1 = L->ws1, .ws2 = L->ws2, .wsg = L->wsg, .tokens = ns};
        int sh_ok = 1;
        double gerr = 0;
        CHECK(moe_ref_shared(s, &sin, NULL, 0, gref, NULL, NULL) == 0); /* g alone: no FFN computed */
        for (int i = 0; i < ns; i++)
            for (int j = K; j < KE; j++) {
                sh_ok &= idx[(size_t)sample[i] * KE + j] == E + j - K;
                double d = fabs(w[(size_t)sample[i] * KE + j] - gref[i]);
                if (d > gerr)
                    gerr = d;
            }
        CHECKF(sh_ok, "route: the shared expert's entries are not slots %d..%d in order", E, ES - 1);
        CHECKF(gerr <= 1e-4, "route: the shared expert's weights differ from g(x) by %g", gerr);
    }
    for (long i = 0; i < (long)T * KE; i++) /* indices are in range: checked before any family */
        hist[idx[i]]++;
    int cnt_ok = 1;
    for (int e = 0; e < ES; e++) /* the slots' counts; a zero expert (index >= ES) counts in none */
        cnt_ok &= hist[e] == counts[e];
    CHECKF(cnt_ok, "counts differ from the histogram of topk_idx");
done:
    free(xs); free(ridx); free(gidx); free(rw); free(sc); free(hist); free(gref);
}

/* permute_plan: offsets are the aligned prefix sums of counts, the tile
 * table lists every expert's row blocks (at its weight slot) in order; the
 * shared expert's slots last, at their own index. */
static void check_permute_plan(const layer_t *L, int align_m, const int *counts, const int *offsets,
                               const int *ntiles, const int *tiles) {
    const int E = moe_spec_slots(&L->s), ER = L->s.experts;
    int off_ok = offsets[0] == 0;
    long long total = 0;
    int tile_ok = 1, t = 0;
    CHECK(align_m > 0);
    for (int e = 0; e < E && align_m > 0; e++) {
        int padded = (counts[e] + align_m - 1) / align_m * align_m;
        off_ok &= offsets[e] == total;
        total += padded;
        for (int j = 0; j * align_m < counts[e]; j++, t++) {
            int rows = counts[e] - j * align_m < align_m ? counts[e] - j * align_m : align_m;
            if (t >= *ntiles)
                tile_ok = 0;
            else
                tile_ok &= tiles[4 * t] == (L->slot && e < ER ? L->slot[e] : e) && tiles[4 * t + 1] == offsets[e] + j * align_m &&
                           tiles[4 * t + 2] == rows;
        }
    }
    off_ok &= offsets[E] == total;
    CHECKF(off_ok, "offsets are not the aligned prefix sums of counts");
    CHECKF(*ntiles == t, "num_tiles %d, expected %d", *ntiles, t);
    CHECKF(tile_ok, "tile table differs from the expected one");
}

/* permute_scatter: row_of maps the slots (t, k) one to one into each
 * expert's rows; a zero expert's entries (index >= slots) to row
 * offsets[slots] + t, which holds x[t] bit for bit (obuf: the xs region
 * after the down GEMM, which leaves that row alone). */
static void check_permute_scatter(const layer_t *L, int T, int align_m, const int *idx, const int *counts,
                                  const int *offsets, const int *row_of, const uint16_t *obuf, size_t obuf_bytes,
                                  const int *src_of) {
    const int E = moe_spec_slots(&L->s), K = moe_spec_entries(&L->s); /* the shared expert's slots included */
    const int H = L->s.hidden;
    long long total = 0; /* the rows permute_plan lays out */
    for (int e = 0; e < E && align_m > 0; e++)
        total += (counts[e] + align_m - 1) / align_m * align_m;
    char *used = calloc((size_t)(total > 0 ? total : 1), 1);
    int map_ok = used != NULL, zero_ok = 1, zeros = 0, src_ok = 1;
    for (long i = 0; i < (long)T * K && map_ok; i++) {
        int e = idx[i], r = row_of[i];
        if (e >= E) { /* a zero expert: x[t]'s row past every slot's */
            const long t = i / K;
            zeros++;
            zero_ok &= r == offsets[E] + t && (size_t)(r + 1) * H * 2 <= obuf_bytes &&
                       !memcmp(obuf + (size_t)r * H, L->x + (size_t)t * H, (size_t)H * 2);
            continue;
        }
        if (r < 0 || r >= total || r < offsets[e] || r >= offsets[e] + counts[e] || used[r])
            map_ok = 0;
        else
            used[r] = 1;
        if (src_of && map_ok && src_of[r] != i / K) /* the gathered up GEMM's token of the row */
            src_ok = 0;
    }
    CHECKF(map_ok, "row_of is not a bijection into each expert's rows");
    CHECKF(src_ok, "src_of[row_of[t, k]] is not t (the gathered up GEMM's row tokens)");
    CHECKF(zero_ok, "a zero expert's entry is not at row offsets[slots] + t holding x[t] (%d zero entries)", zeros);
    CHECKF(!L->all_zero || (zeros == T * K && offsets[E] == 0), "%d of %d entries to zero experts, offsets[slots] %d: "
           "this case routes every entry to one", zeros, T * K, offsets[E]);
    if (L->s.zero_experts)
        fprintf(stderr, "  permute_scatter: %d of %ld entries chose a zero expert\n", zeros, (long)T * K);
    free(used);
}

/* combine: y[t] = sum_k topk_w[t, k] * obuf[row_of[t, k]] over the GPU's
 * own down-projection rows (weight 1 with router.apply = "input"), every
 * token; and every y element written. */
static void check_combine(const layer_t *L, int T, const float *w, const int *row_of, const uint16_t *obuf,
                          size_t obuf_bytes, const uint16_t *y, double tol) {
    const moe_spec_t *s = &L->s;
    const int K = moe_spec_entries(s), H = s->hidden; /* routed, then the shared expert's entries */
    const moe_dtype_t dt = s->dtype;
    const long long rows = (long long)(obuf_bytes / ((size_t)H * 2));
    int rows_ok = 1;
    for (long i = 0; i < (long)T * K; i++)
        rows_ok &= row_of[i] >= 0 && row_of[i] < rows;
    CHECKF(rows_ok, "row_of points outside the rows buffer (%lld rows)", rows);
    if (!rows_ok)
        return;
    int all_finite = 1;
    for (size_t i = 0; i < (size_t)T * H; i++)
        if (!isfinite(moe_half_to_float(y[i], dt))) {
            all_finite = 0;
            break;
        }
    CHECKF(all_finite, "some y element was never written (poison left) or is not finite");
    double num = 0, den = 0;
    float *acc = malloc(sizeof(float) * (size_t)H);
    CHECK(acc != NULL);
    for (int t = 0; t < T && acc && all_finite; t++) {
        for (int h = 0; h < H; h++)
            acc[h] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float wk = s->router.apply == MOE_APPLY_INPUT ? 1.0f : w[(size_t)t * K + k];
            const uint16_t *o = obuf + (size_t)row_of[(size_t)t * K + k] * H;
            for (int h = 0; h < H; h++)
                acc[h] = fmaf(wk, moe_half_to_float(o[h], dt), acc[h]);
        }
        for (int h = 0; h < H; h++) {
            double g = moe_half_to_float(y[(size_t)t * H + h], dt), r = acc[h];
            num += (g - r) * (g - r);
            den += r * r;
        }
    }
    double err = rel_l2(num, den);
    CHECKF(err <= tol, "combine error %.3e > %.1e (against the sum of the GPU's own rows)", err, tol);
    free(acc);
}

/* swiglu (the cuDNN path's activation, run alone here): the plan's kernel
 * on random packed rows u [cap, 2F] (gate and up in granules of 8) against
 * the reference's activation, rounded; rows = min(offsets[E], cap), so
 * once with offsets[E] below cap (the rows past it must stay poisoned) and
 * once above. The second half of the rows belongs to the last routed slot,
 * or to the shared expert's first (its own activation, if it has one). */
static void check_swiglu(const moe_plan *plan, const layer_t *L, uint64_t seed) {
    const moe_spec_t *s = &L->s;
    const moe_launcher_t *l = &plan->launcher;
    const int E = moe_spec_slots(s), F = s->ffn; /* the kernel reads offsets[slots] (a shared expert's included) */
    const moe_dtype_t dt = s->dtype;
    const double tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    const long long cap = 37;
    CHECKF(l->swiglu_fn != NULL, "the plan's module has no %s", l->swiglu ? l->swiglu->name : "swiglu kernel");
    if (!l->swiglu_fn)
        return;
    size_t un = (size_t)cap * 2 * F, hn = (size_t)cap * F;
    uint16_t *u = malloc(un * 2), *h = malloc(hn * 2);
    int *offsets = malloc(sizeof(int) * (size_t)(E + 1));
    CUdeviceptr du = 0, dh = 0, doff = 0;
    CHECK(u && h && offsets);
    if (!u || !h || !offsets)
        goto done;
    fill_random(u, un, 8.0f, seed, dt); /* past the clamp of the specs with activation.limit = 7 */
    du = dev_upload(u, un * 2);
    dh = dev_upload(NULL, hn * 2);
    doff = dev_upload(NULL, sizeof(int) * (size_t)(E + 1));
    CHECK(du && dh && doff);
    if (!du || !dh || !doff)
        goto done;
    const int routed[2] = {29, 100}; /* offsets[E]: below cap, then above */
    /* the rows' slots: the first half slot 0's, the rest the last routed expert's, or with a shared expert
     * its first slot's, whose rows run its own activation where it has one (shared.limit, shared.unclamped) */
    const int Er = s->experts;
    moe_spec_t shared_spec = *s;
    shared_spec.activation = moe_spec_shared_activation(s);
    for (int pass = 0; pass < 2; pass++) {
        for (int e = 0; e <= E; e++)
            offsets[e] = e == 0 ? 0 : e == E ? routed[pass] : e <= Er ? routed[pass] / 2 : routed[pass];
        const long long shared_row0 = E > Er ? offsets[Er] : cap;
        const long long rows = routed[pass] < cap ? routed[pass] : cap;
        CHECK(cu_ok(moe_cu.cuMemcpyHtoD(doff, offsets, sizeof(int) * (size_t)(E + 1)), "offsets"));
        CHECK(cu_ok(moe_cu.cuMemsetD8(dh, 0xff, hn * 2), "poison h"));
        unsigned g[3];
        moe_family_grid(l->swiglu, s, 0, cap, g);
        long long capv = cap;
        void *args[] = {&du, &dh, &doff, &capv};
        CUresult r = moe_cu.cuLaunchKernel(l->swiglu_fn, g[0], g[1], g[2], (unsigned)l->swiglu->threads, 1, 1,
                                           (unsigned)l->swiglu->smem, NULL, args, NULL);
        CHECKF(r == CUDA_SUCCESS, "launching %s: %s", l->swiglu->name, moe_cu_error_string(r));
        r = r == CUDA_SUCCESS ? moe_cu.cuCtxSynchronize() : r;
        CHECKF(r == CUDA_SUCCESS, "%s faulted: %s", l->swiglu->name, moe_cu_error_string(r));
        if (r != CUDA_SUCCESS || !cu_ok(moe_cu.cuMemcpyDtoH(h, dh, hn * 2), "h"))
            goto done;
        double num = 0, den = 0;
        int finite = 1, untouched = 1;
        for (long long row = 0; row < cap; row++)
            for (int j = 0; j < F / 8; j++)
                for (int k = 0; k < 8; k++) {
                    const uint16_t got = h[(size_t)row * F + 8 * j + k];
                    if (row >= rows) {
                        untouched &= got == 0xffff;
                        continue;
                    }
                    const float gate = moe_half_to_float(u[(size_t)row * 2 * F + 16 * j + k], dt);
                    const float up = moe_half_to_float(u[(size_t)row * 2 * F + 16 * j + 8 + k], dt);
                    const moe_spec_t *as = row >= shared_row0 ? &shared_spec : s;
                    double want = moe_half_to_float(moe_float_to_half(moe_ref_activation(as, gate, up), dt), dt);
                    double have = moe_half_to_float(got, dt);
                    finite &= isfinite(have);
                    num += (have - want) * (have - want);
                    den += want * want;
                }
        double err = rel_l2(num, den);
        fprintf(stderr, "  %-40s swiglu rows %lld of cap %lld: error %.2e\n", s->name, rows, cap, err);
        CHECKF(finite, "NaN/Inf (poison) in the rows the swiglu kernel must write");
        CHECKF(untouched, "the swiglu kernel wrote rows past min(offsets[E], cap) = %lld", rows);
        CHECKF(err <= tol, "swiglu error %.3e > %.1e", err, tol);
    }
done:
    if (du)
        moe_cu.cuMemFree(du);
    if (dh)
        moe_cu.cuMemFree(dh);
    if (doff)
        moe_cu.cuMemFree(doff);
    free(u);
    free(h);
    free(offsets);
}

/* ---- pack: the device-side weight pack ----------------------------------- */

#define PACK_POISON 0xffffu /* NaN in bf16 and fp16; cuMemsetD8(0xff) writes it */

/* Elements of one source tensor of layout ly (each of the two of a
 * _SEPARATE layout, *two set) and of one packed slot, for spec s. */
static void pack_sizes(const moe_spec_t *s, moe_layout ly, size_t *src, size_t *slot, int *two) {
    const size_t E = s->experts, F = s->ffn, H = s->hidden;
    *two = ly == MOE_LAYOUT_W1_SEPARATE || ly == MOE_LAYOUT_W1_SEPARATE_T || ly == MOE_LAYOUT_B1_SEPARATE;
    if (ly <= MOE_LAYOUT_W1_SEPARATE_T)
        *slot = 2 * F * H, *src = *two ? E * F * H : E * 2 * F * H;
    else if (ly <= MOE_LAYOUT_B1_SEPARATE)
        *slot = 2 * F, *src = *two ? E * F : E * 2 * F;
    else if (ly <= MOE_LAYOUT_W2_T)
        *slot = H * F, *src = E * H * F;
    else
        *slot = H, *src = E * H;
}

/* Random 16-bit words, never 0 and never the poison. */
static void fill_words(uint16_t *p, size_t n, uint64_t *r) {
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)splitmix(r);
        p[i] = v == 0 || v == PACK_POISON ? 0x3f80 : v;
    }
}

/* a's source pointers moved on by g experts (a tensor per expert) */
static void pack_shift(moe_pack_args *a, long long g) {
    for (int i = 0; i < 2; i++)
        if (a->src[i].ptr)
            a->src[i].ptr = (const uint16_t *)a->src[i].ptr + g * a->src[i].expert;
}

/* The device pack of a, captured on a stream of its own into a CUDA graph,
 * the destination poisoned again after the capture, replayed once: so what
 * dst holds after it is the replay's. Returns 1 when every call worked. */
static int pack_replayed(const moe_plan *plan, const moe_pack_args *a, CUdeviceptr dst, size_t bytes) {
    CUstream gs = NULL;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    int ok = cu_ok(moe_cu.cuStreamCreate(&gs, CU_STREAM_NON_BLOCKING), "stream") &&
             cu_ok(moe_cu.cuStreamBeginCapture(gs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture");
    if (ok) {
        moe_status st = moe_plan_pack_async(plan, a, (void *)(uintptr_t)dst, gs);
        CHECKF(st == MOE_OK, "moe_plan_pack_async under capture: %s", moe_last_error());
        ok = cu_ok(moe_cu.cuStreamEndCapture(gs, &g), "end capture") && st == MOE_OK &&
             cu_ok(moe_cu.cuGraphInstantiateWithFlags(&ge, g, 0), "instantiate") &&
             cu_ok(moe_cu.cuMemsetD8(dst, 0xff, bytes), "poison") &&
             cu_ok(moe_cu.cuCtxSynchronize(), "poison") && /* gs does not wait for the legacy stream */
             cu_ok(moe_cu.cuGraphLaunch(ge, gs), "replay") &&
             cu_ok(moe_cu.cuStreamSynchronize(gs), "replay");
    }
    if (ge)
        moe_cu.cuGraphExecDestroy(ge);
    if (g)
        moe_cu.cuGraphDestroy(g);
    if (gs)
        moe_cu.cuStreamDestroy(gs);
    return ok;
}

/* Every layout: random sources packed on the host and on the device (all
 * experts; slots 1..E-1 from the first E-1 experts; one expert at a time
 * into slot E-1-g; all experts captured in a CUDA graph and replayed),
 * into poisoned buffers of E slots, equal byte for byte (poison included);
 * and the device call's refusals. */
static void check_pack_bytes(const moe_plan *plan, const layer_t *L, uint64_t seed) {
    const moe_spec_t *s = &L->s;
    const int E = s->experts;
    uint64_t r = seed;
    for (int ly = 0; ly < MOE_LAYOUT_COUNT; ly++) {
        size_t nsrc, nslot;
        int two;
        pack_sizes(s, (moe_layout)ly, &nsrc, &nslot, &two);
        const size_t ndst = nslot * (size_t)E;
        uint16_t *hs[2] = {malloc(nsrc * 2), two ? malloc(nsrc * 2) : NULL}, *hd = malloc(ndst * 2),
                 *got = malloc(ndst * 2);
        CUdeviceptr ds[2] = {0, 0}, dd = dev_upload(NULL, ndst * 2);
        int ok = hs[0] && (!two || hs[1]) && hd && got && dd;
        for (int i = 0; i < 1 + two && ok; i++) {
            fill_words(hs[i], nsrc, &r);
            ok = (ds[i] = dev_upload(hs[i], nsrc * 2)) != 0;
        }
        CHECKF(ok, "layout %d: cannot set up (host or device memory)", ly);
        static const char *const variants[] = {"all experts", "slots 1..E-1", "an expert at a time",
                                               "all experts, a CUDA graph replayed"};
        for (int variant = 0; variant < 4 && ok; variant++) {
            for (size_t i = 0; i < ndst; i++)
                hd[i] = PACK_POISON;
            ok = cu_ok(moe_cu.cuMemsetD8(dd, 0xff, ndst * 2), "poison");
            const int calls = variant == 2 ? E : 1;
            for (int c = 0; c < calls && ok; c++) {
                const int first = variant == 1 ? 1 : variant == 2 ? E - 1 - c : 0;
                const int count = variant == 1 ? E - 1 : variant == 2 ? 1 : E;
                moe_pack_args ha, da;
                ok = moe_plan_pack_layout(plan, (moe_layout)ly, hs[0], hs[1], first, count, &ha) == MOE_OK &&
                     moe_plan_pack_layout(plan, (moe_layout)ly, (void *)(uintptr_t)ds[0],
                                          two ? (void *)(uintptr_t)ds[1] : NULL, first, count, &da) == MOE_OK;
                if (variant == 2)
                    pack_shift(&ha, c), pack_shift(&da, c);
                ok = ok && moe_plan_pack(plan, &ha, hd) == MOE_OK &&
                     (variant == 3 ? pack_replayed(plan, &da, dd, ndst * 2)
                                   : moe_plan_pack_async(plan, &da, (void *)(uintptr_t)dd, NULL) == MOE_OK);
                CHECKF(ok, "layout %d variant %d: %s", ly, variant, moe_last_error());
            }
            CUresult sr = moe_cu.cuCtxSynchronize();
            CHECKF(sr == CUDA_SUCCESS, "pack kernel fault: %s", moe_cu_error_string(sr));
            ok = ok && sr == CUDA_SUCCESS && cu_ok(moe_cu.cuMemcpyDtoH(got, dd, ndst * 2), "download");
            size_t bad = 0, at = 0;
            for (size_t i = 0; ok && i < ndst; i++)
                if (got[i] != hd[i] && !bad++)
                    at = i;
            CHECKF(ok && bad == 0, "layout %d (%s): %zu of %zu words differ from the host pack, the first at %zu "
                   "(device %04x, host %04x)", ly, variants[variant], bad, ndst, at, ok ? got[at] : 0, hd[at]);
        }
        if (ok && ly == 0) { /* refusals: nothing launched, the destination untouched */
            moe_pack_args a;
            /* slots 1..S: one past the plan's last slot (S counts a shared expert's slots too) */
            moe_plan_pack_layout(plan, MOE_LAYOUT_W1_FUSED, (void *)(uintptr_t)ds[0], NULL, 1, moe_spec_slots(s), &a);
            CHECK(moe_plan_pack_async(plan, &a, (void *)(uintptr_t)dd, NULL) == MOE_ERR_INVALID_ARG);
            a.first = 0, a.src[1].ptr = NULL;
            CHECK(moe_plan_pack_async(plan, &a, (void *)(uintptr_t)dd, NULL) == MOE_ERR_INVALID_ARG);
            CHECK(moe_plan_pack_async(plan, &a, NULL, NULL) == MOE_ERR_INVALID_ARG);
        }
        for (int i = 0; i < 2; i++)
            if (ds[i])
                moe_cu.cuMemFree(ds[i]);
        if (dd)
            moe_cu.cuMemFree(dd);
        free(hs[0]), free(hs[1]), free(hd), free(got);
    }
}

/* Repack the layer's device weights on the device from gpt-oss's layouts
 * (gate_up_proj [E, H, 2F] interleaved, its bias [E, 2F] interleaved,
 * down_proj [E, F, H], b2 [E, H]) built on the host from the plain
 * weights, one expert at a time into the plan's slot of that expert, and
 * the shared expert's slots E .. E+m-1 from its unsplit gate/up [2F_s, H]
 * and down [H, F_s] (strided views), over poisoned buffers. Returns 1 when
 * the weights were repacked. */
static int pack_layer_on_device(const moe_plan *plan, layer_t *L) {
    const moe_spec_t *s = &L->s;
    const size_t E = s->experts, F = s->ffn, H = s->hidden, ES = (size_t)moe_spec_slots(s), FS = s->shared.ffn;
    uint16_t *gu = malloc(E * H * 2 * F * 2), *down = malloc(E * F * H * 2), *bi = malloc(E * 2 * F * 2);
    int ok = gu && down && bi;
    for (size_t e = 0; e < E && ok; e++) {
        for (size_t f = 0; f < F; f++) {
            for (size_t h = 0; h < H; h++) {
                gu[(e * H + h) * 2 * F + 2 * f] = L->w1[(e * 2 * F + f) * H + h];
                gu[(e * H + h) * 2 * F + 2 * f + 1] = L->w1[(e * 2 * F + F + f) * H + h];
                down[(e * F + f) * H + h] = L->w2[(e * H + h) * F + f];
            }
            bi[e * 2 * F + 2 * f] = L->b1[e * 2 * F + f];
            bi[e * 2 * F + 2 * f + 1] = L->b1[e * 2 * F + F + f];
        }
    }
    CUdeviceptr dgu = ok ? dev_upload(gu, E * H * 2 * F * 2) : 0, ddown = ok ? dev_upload(down, E * F * H * 2) : 0,
                dbi = ok ? dev_upload(bi, E * 2 * F * 2) : 0, db2 = ok ? dev_upload(L->b2, E * H * 2) : 0;
    CUdeviceptr dws1 = ok && FS ? dev_upload(L->ws1, 2 * FS * H * 2) : 0,
                dws2 = ok && FS ? dev_upload(L->ws2, H * FS * 2) : 0;
    ok = ok && dgu && ddown && dbi && db2 && (!FS || (dws1 && dws2)) &&
         cu_ok(moe_cu.cuMemsetD8(L->dw1p, 0xff, ES * 2 * F * H * 2), "poison") &&
         cu_ok(moe_cu.cuMemsetD8(L->dw2, 0xff, ES * H * F * 2), "poison") &&
         cu_ok(moe_cu.cuMemsetD8(L->db1p, 0xff, E * 2 * F * 2), "poison") &&
         cu_ok(moe_cu.cuMemsetD8(L->db2, 0xff, E * H * 2), "poison");
    CUstream st = NULL;
    ok = ok && cu_ok(moe_cu.cuStreamCreate(&st, 0), "cuStreamCreate");
    const struct { moe_layout ly; CUdeviceptr src, dst; } t[4] = {
        {MOE_LAYOUT_W1_INTERLEAVED_T, dgu, L->dw1p}, {MOE_LAYOUT_B1_INTERLEAVED, dbi, L->db1p},
        {MOE_LAYOUT_W2_T, ddown, L->dw2}, {MOE_LAYOUT_B2, db2, L->db2}};
    for (size_t g = 0; g < E && ok; g++)
        for (int i = 0; i < 4 && ok; i++) {
            moe_pack_args a;
            const int slot = L->slot ? L->slot[g] : (int)g;
            ok = moe_plan_pack_layout(plan, t[i].ly, (void *)(uintptr_t)t[i].src, NULL, slot, 1, &a) == MOE_OK;
            pack_shift(&a, (long long)g);
            ok = ok && moe_plan_pack_async(plan, &a, (void *)(uintptr_t)t[i].dst, st) == MOE_OK;
            CHECKF(ok, "expert %zu, layout %d: %s", g, (int)t[i].ly, moe_last_error());
        }
    if (ok && FS) { /* the shared expert: m experts of the unsplit tensors' views */
        moe_pack_args a;
        const int m = (int)(ES - E);
        ok = moe_plan_pack_layout(plan, MOE_LAYOUT_W1_SEPARATE, (void *)(uintptr_t)dws1,
                                  (const uint16_t *)(uintptr_t)dws1 + FS * H, (int)E, m, &a) == MOE_OK &&
             moe_plan_pack_async(plan, &a, (void *)(uintptr_t)L->dw1p, st) == MOE_OK &&
             moe_plan_pack_layout(plan, MOE_LAYOUT_W2, (void *)(uintptr_t)dws2, NULL, (int)E, m, &a) == MOE_OK;
        a.src[0].expert = (int64_t)F, a.src[0].row = (int64_t)FS, a.src[0].col = 1;
        ok = ok && moe_plan_pack_async(plan, &a, (void *)(uintptr_t)L->dw2, st) == MOE_OK;
        CHECKF(ok, "the shared expert's slots: %s", moe_last_error());
    }
    if (st) {
        CUresult sr = moe_cu.cuStreamSynchronize(st);
        CHECKF(sr == CUDA_SUCCESS, "pack kernel fault: %s", moe_cu_error_string(sr));
        ok = ok && sr == CUDA_SUCCESS;
        moe_cu.cuStreamDestroy(st);
    }
    CUdeviceptr d[] = {dgu, ddown, dbi, db2, dws1, dws2};
    for (int i = 0; i < 6; i++)
        if (d[i])
            moe_cu.cuMemFree(d[i]);
    free(gu), free(down), free(bi);
    return ok;
}

/* The forward of a, captured on a stream of its own into a CUDA graph and
 * replayed once after the capture: between the two, x gets new values (every
 * element negated, here and in L's host copy, so the reference follows) and
 * y and the workspace are poisoned again, so the checks that follow see
 * only what the replay computed from the new x. Returns the forward's
 * status (MOE_ERR_CUDA when a graph call fails). */
static moe_status forward_replayed(const moe_plan *plan, layer_t *L, const moe_forward_args *a, int T) {
    const size_t H = L->s.hidden;
    CUstream gs = NULL;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    moe_status st = MOE_ERR_CUDA;
    if (!cu_ok(moe_cu.cuStreamCreate(&gs, CU_STREAM_NON_BLOCKING), "stream") ||
        !cu_ok(moe_cu.cuStreamBeginCapture(gs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture"))
        goto out;
    st = moe_forward(plan, a, gs);
    if (!cu_ok(moe_cu.cuStreamEndCapture(gs, &g), "end capture") || st != MOE_OK) {
        st = st != MOE_OK ? st : MOE_ERR_CUDA;
        goto out;
    }
    st = MOE_ERR_CUDA;
    if (!cu_ok(moe_cu.cuGraphInstantiateWithFlags(&ge, g, 0), "instantiate"))
        goto out;
    for (size_t i = 0; i < (size_t)T * H; i++)
        L->x[i] ^= 0x8000; /* -x, in bf16 and fp16 alike */
    if (!cu_ok(moe_cu.cuMemcpyHtoD(L->dx, L->x, (size_t)T * H * 2), "new x") ||
        !cu_ok(moe_cu.cuMemsetD8(L->dy, 0xff, (size_t)L->s.tokens * H * 2), "poison y") ||
        !ws_poison(L) || !cu_ok(moe_cu.cuCtxSynchronize(), "poison") || /* gs does not wait for the legacy stream */
        !cu_ok(moe_cu.cuGraphLaunch(ge, gs), "replay") || !cu_ok(moe_cu.cuStreamSynchronize(gs), "replay"))
        goto out;
    st = MOE_OK;
out:
    if (ge)
        moe_cu.cuGraphExecDestroy(ge);
    if (g)
        moe_cu.cuGraphDestroy(g);
    if (gs)
        moe_cu.cuStreamDestroy(gs);
    return st;
}

/* Whether a planned up GEMM is a gathering one: its name ends "_gx" (gen/family_gemm.c spells it). */
static int gathering_name(const char *name) {
    const size_t n = strlen(name);
    return n > 3 && !strcmp(name + n - 3, "_gx");
}

/* One forward at T tokens (replayed from a CUDA graph when graph is set),
 * then every selected family's checks. */
static void run_tokens(const moe_plan *plan, layer_t *L, int T, uint64_t *rng, const char *label, int graph) {
    const moe_spec_t *s = &L->s;
    const int K = s->top_k, H = s->hidden, F = s->ffn;
    /* the kernels' entries per token and weight slots: the shared expert's included */
    const int KE = moe_spec_entries(s), ES = moe_spec_slots(s), FS = s->shared.ffn;
    const moe_dtype_t dt = s->dtype;
    const double tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    static char fcase[FAM_COUNT][240]; /* CASE keeps a pointer */
    moe_plan_info info = MOE_PLAN_INFO_INIT;
    moe_plan_get_info(plan, &info);
    /* the GEMM variant this call runs: the largest bucket <= T, else the
     * first (the capacity's where cuDNN takes a stage); its row block is
     * what permute_plan aligned to */
    int variant = moe_plan_variant_for(plan, T), align = 0, bucket = 0, want = 0;
    const char *vup = "", *vdown = "";
    CHECKF(moe_plan_variant(plan, variant, &bucket, &align, &vup, &vdown) == MOE_OK, "moe_plan_variant(%d): %s",
           variant, moe_last_error());
    for (int i = 1, n = moe_plan_variant_count(plan); i < n; i++) {
        int b = 0;
        moe_plan_variant(plan, i, &b, NULL, NULL, NULL);
        want = b <= T ? i : want;
    }
    if (moe_cudnn_workspace(plan->cudnn) > 0)
        want = moe_plan_variant_count(plan) - 1;
    CHECKF(variant == want, "T = %d runs variant %d (bucket %d); the largest bucket <= T is variant %d", T,
           variant, bucket, want);
    if (moe_plan_variant_count(plan) > 1)
        fprintf(stderr, "  %-40s variant %d (bucket %d, bm %d): %s, %s\n", label, variant, bucket, align, vup, vdown);
    { /* the route path: fused up to 64 tokens (the scatter too within one block's warps and 128 KB of
       * rows; with fp8 weights at one token alone, not with router.apply = input or given ids), unless
       * MOEGEN_ROUTE_FUSE=off */
        const char *fe = getenv("MOEGEN_ROUTE_FUSE");
        const int on = !(fe && !strcmp(fe, "off")) && s->mesh.size[MOE_AXIS_EP] == 1;
        const int rw = plan->launcher.kernels[MOE_K_ROUTE].threads / 32;
        const int fused = !on || T > 64 ? MOE_ROUTE_SEPARATE
                          : T <= rw && (long long)T * KE * H * 2 <= 128 * 1024 &&
                                    (!moe_spec_fp8(s) || (T == 1 && s->router.apply != MOE_APPLY_INPUT &&
                                                          s->router.select != MOE_SELECT_GIVEN))
                              ? MOE_ROUTE_FUSED_SCATTER
                              : MOE_ROUTE_FUSED_PLAN;
        const int path = moe_plan_route_fuse(plan, T);
        static const char *const path_names[] = {"separate", "fused plan", "fused plan+scatter"};
        CHECKF(info.route_fuse == on, "moe_plan_info.route_fuse = %d with MOEGEN_ROUTE_FUSE=%s", info.route_fuse,
               fe ? fe : "(unset)");
        CHECKF(path == fused, "T = %d routes by path %d; the rule says %d", T, path, fused);
        if (path >= 0 && path <= 2)
            fprintf(stderr, "  %-40s route: %s\n", label, path_names[path]);
    }
    if (s->zero_experts) { /* the router's tensors span the zero experts too (moe.h; runtime/abi.c) */
        int rank = 0, brank = 0;
        int64_t d[4] = {0}, bd[4] = {0};
        CHECK(moe_plan_tensor(plan, "router_w", &rank, d, NULL) == MOE_OK &&
              moe_plan_tensor(plan, "router_bias", &brank, bd, NULL) == MOE_OK);
        CHECKF(rank == 2 && d[0] == moe_spec_scored(s) && d[1] == H && brank == (s->router.bias ? 1 : 0) &&
                   (!s->router.bias || bd[0] == moe_spec_scored(s)),
               "moe_plan_tensor: router_w rank %d [%lld, %lld], router_bias rank %d [%lld]; want [%d, %d], [%d]", rank,
               (long long)d[0], (long long)d[1], brank, (long long)bd[0], moe_spec_scored(s), H, moe_spec_scored(s));
    }
    { /* launch overlap on sm_90a: every call with MOEGEN_PDL=on, none with off, else (auto) the calls whose
       * variant's tuning entry says +pdl; moe_plan_info.pdl the mode where some call has it, else 0 */
        const char *pe = getenv("MOEGEN_PDL");
        const int sm90 = plan->launcher.arch == MOE_ARCH_SM90A;
        const int mode = !sm90 ? 0 : !pe || !*pe || !strcmp(pe, "auto") ? 2 : !strcmp(pe, "on");
        int any = 0;
        for (int v = 0; v < plan->pd.nvariants; v++)
            any |= mode == 1 || (mode == 2 && plan->pd.variants[v].pdl);
        const int last = plan->pd.nvariants - 1;
        CHECKF(info.pdl == (any ? mode : 0) &&
                   plan->launcher.pdl == (mode == 1 || (mode == 2 && plan->pd.variants[last].pdl)),
               "moe_plan_info.pdl = %d (launcher %d) with MOEGEN_PDL=%s on %s", info.pdl, plan->launcher.pdl,
               pe ? pe : "(unset)", moe_arch_name(plan->launcher.arch));
        for (int t = 1; t <= s->tokens; t = t < 16 ? t + 1 : 2 * t) {
            moe_launcher_t l;
            moe_plan_launcher_for(plan, t, 0, &l);
            const int v = moe_plan_variant_for(plan, t), want = mode == 1 || (mode == 2 && plan->pd.variants[v].pdl);
            CHECKF(moe_plan_pdl(plan, t) == want && l.pdl == want, "%d tokens (variant %d): moe_plan_pdl %d, "
                   "launcher %d, want %d", t, v, moe_plan_pdl(plan, t), l.pdl, want);
        }
    }
    { /* moe_plan_info.gather: MOEGEN_GATHER's mode (2 auto, 1 on, 0 off) where some variant's up GEMM on this
       * device is a gathering one (its name ends "_gx"), else 0 */
        const char *ge = getenv("MOEGEN_GATHER");
        const int mode = !ge || !*ge || !strcmp(ge, "auto") ? 2 : !strcmp(ge, "on");
        int gx = 0; /* the last variant's kernels are the launcher's */
        for (int v = 0; v < plan->pd.nvariants; v++)
            gx |= gathering_name(plan->pd.variants[v].kernels[plan->launcher.arch][MOE_K_GEMM_UP].name);
        CHECKF(info.gather == (gx ? mode : 0), "moe_plan_info.gather = %d with MOEGEN_GATHER=%s (a gathering up GEMM: %d)",
               info.gather, ge ? ge : "(unset)", gx);
    }

    /* poison outputs and the whole workspace; the call's own is exactly
     * moe_plan_workspace_size(plan, T) bytes, at the end of the capacity's */
    if (!ws_place(plan, L, T))
        return;
    CHECK(cu_ok(moe_cu.cuMemsetD8(L->dy, 0xff, (size_t)s->tokens * H * 2), "poison y"));
    CHECK(ws_poison(L));
    moe_forward_args a = {.tokens = T, .x = (void *)L->dx,
                          .router_w = s->router.score == MOE_SCORE_GIVEN ? NULL : (void *)L->dwr,
                          .topk_ids = (const int *)L->dgids, .topk_weights = (const float *)L->dgw,
                          .router_x = (const void *)L->drx, .router_expert_scale = (const float *)L->des,
                          .router_bias = s->router.bias ? (float *)L->dsel : NULL,
                          .router_logit_bias = s->router.logit_bias ? (float *)L->dlogit : NULL,
                          .w1p = (void *)L->dw1p, .b1p = s->ffn_bias ? (void *)L->db1p : NULL,
                          .w2 = (void *)L->dw2, .b2 = s->ffn_bias ? (void *)L->db2 : NULL,
                          .y = (void *)L->dy, .workspace = (void *)(L->dws + L->ws_at),
                          .shared_gate = s->shared.gate == MOE_SHARED_GATE_SIGMOID ? (void *)L->dwsg : NULL};
    /* the gathered up GEMM (docs/DESIGN.md): MOEGEN_GATHER not off, a spec that allows it, a scatter apart from
     * route (the plan may be fused), an sm_90a TMA up GEMM (its name spells it "_gx"), under auto a size that
     * launch_geom.h's rule allows, not cuDNN's */
    const int gathered = moe_forward_gathers(plan, &a);
    {
        const char *up = vup; /* the variant's up GEMM */
        const int want = plan->gather && moe_spec_gather(s) && moe_plan_route_fuse(plan, T) < MOE_ROUTE_FUSED_SCATTER &&
                         gathering_name(up) &&
                         (plan->gather == 1 || moe_gather_tokens(T, KE, ES, F)); /* MOEGEN_GATHER=on, or auto */
        if (!moe_cudnn_workspace(plan->cudnn)) /* with cuDNN on, its policy decides the up stage */
            CHECKF(gathered == want, "T = %d: moe_forward_gathers %d, expected %d (up GEMM %s)", T, gathered, want,
                   up);
        else
            CHECKF(!gathered || want, "T = %d: moe_forward_gathers %d (up GEMM %s)", T, gathered, up);
        if (gathered)
            fprintf(stderr, "  %-40s up GEMM gathers x (scatter: maps only)\n", label);
    }
    /* the chain (docs/DESIGN.md): the variant's up GEMM on the chain grid (its name spells it; test_gpu plans for
     * one device), not a training plan, not cuDNN's up stage */
    {
        const int chained = moe_forward_chains(plan, &a);
        const int want = strstr(vup, "_sm90a_chain_") && !s->training;
        if (!moe_cudnn_workspace(plan->cudnn))
            CHECKF(chained == want, "T = %d: moe_forward_chains %d, expected %d (up GEMM %s)", T, chained, want, vup);
        else
            CHECKF(!chained || want, "T = %d: moe_forward_chains %d (up GEMM %s)", T, chained, vup);
        if (chained)
            fprintf(stderr, "  %-40s chained: the up GEMM's grid runs the down GEMM and the combine\n", label);
    }
    moe_status st = graph ? forward_replayed(plan, L, &a, T) : moe_forward(plan, &a, NULL);
    CHECKF(st == MOE_OK, "forward%s: %s: %s", graph ? " (CUDA graph)" : "", moe_status_string(st), moe_last_error());
    CUresult sr = moe_cu.cuCtxSynchronize();
    CHECKF(sr == CUDA_SUCCESS, "kernel fault: %s", moe_cu_error_string(sr));
    if (st != MOE_OK || sr != CUDA_SUCCESS)
        return;
    if (s->router.select == MOE_SELECT_GIVEN && family_on(FAM_ROUTE)) { /* the dropped ids, counted */
        long long want = 0, got = -1;
        for (long long i = 0; i < (long long)T * s->top_k; i++)
            want += L->gids[i] < 0 || L->gids[i] >= s->experts;
        const moe_status re = moe_plan_routing_errors(plan, a.workspace, NULL, &got);
        CHECKF(got == want && (re == MOE_OK) == (want == 0), "moe_plan_routing_errors: %lld dropped ids, %lld given "
               "(status %s)", got, want, moe_status_string(re));
    }
    if (family_on(FAM_LAYER)) {
        char wc[240];
        family_case(wc, sizeof wc, FAM_LAYER, label);
        size_t out = ws_outside_writes(L);
        CHECKF(out == 0, "the forward of %d tokens wrote %zu bytes outside its workspace of "
               "moe_plan_workspace_size = %zu bytes (placed at the end of %zu, a %d-byte guard after it)", T, out,
               L->ws_call, L->ws_bytes, WS_GUARD);
    }

    int *idx = region(plan, L, T, "topk_idx", NULL);
    float *w = region(plan, L, T, "topk_w", NULL);
    int *counts = region(plan, L, T, "counts", NULL);
    int *offsets = region(plan, L, T, "offsets", NULL);
    int *ntiles = region(plan, L, T, "num_tiles", NULL);
    int *tiles = region(plan, L, T, "tiles", NULL);
    int *row_of = region(plan, L, T, "row_of", NULL);
    uint16_t *hbuf = region(plan, L, T, "hbuf", NULL);
    size_t obuf_bytes = 0;
    uint16_t *obuf = region(plan, L, T, "xs", &obuf_bytes);
    int *src_of = gathered ? region(plan, L, T, "src_of", NULL) : NULL; /* what the scatter wrote instead of xs */
    uint16_t *y = malloc((size_t)T * H * 2);
    int *sample = NULL;
    char *picked = NULL;
    CHECK(y && cu_ok(moe_cu.cuMemcpyDtoH(y, L->dy, (size_t)T * H * 2), "y"));
    if (!idx || !w || !counts || !offsets || !ntiles || !tiles || !row_of || !hbuf || !obuf || !y ||
        (gathered && !src_of))
        goto done;

    /* what every family reads: route's expert indices, in range */
    {
        family_case(fcase[FAM_ROUTE], sizeof fcase[FAM_ROUTE], FAM_ROUTE, label);
        int valid = 1;
        for (long i = 0; i < (long)T * KE; i++) /* a zero expert's index follows the slots */
            if (idx[i] < 0 || idx[i] >= ES + s->zero_experts) {
                valid = 0;
                break;
            }
        CHECKF(valid, "route wrote an expert index out of range");
        if (!valid)
            goto done;
    }

    /* the sample: first, last, and random tokens (drawn whatever families
     * run, so a seed repeats the same sample) */
    int S = T < 40 ? T : 40;
    sample = malloc(sizeof(int) * (size_t)S);
    picked = calloc((size_t)T, 1);
    if (!sample || !picked) {
        CHECKF(0, "out of memory");
        goto done;
    }
    int ns = 0;
    sample[ns++] = 0;
    picked[0] = 1;
    if (T > 1) {
        sample[ns++] = T - 1;
        picked[T - 1] = 1;
    }
    while (ns < S) {
        int t = (int)(splitmix(rng) % (uint64_t)T);
        if (!picked[t]) {
            picked[t] = 1;
            sample[ns++] = t;
        }
    }
    qsort(sample, (size_t)ns, sizeof *sample, cmp_int);

    uint64_t rseed = splitmix(rng); /* drawn whatever families run, as the sample is */
    if (family_on(FAM_ROUTE)) {
        /* route's own sample, larger: the first and last 64 tokens (whole
         * 32-token blocks, the last one partial) and random ones, 512 in all */
        const int RS = T < 512 ? T : 512;
        int *rsample = malloc(sizeof(int) * (size_t)RS), nr = 0;
        char *rpicked = calloc((size_t)T, 1);
        if (!rsample || !rpicked) {
            CHECKF(0, "out of memory");
            free(rsample), free(rpicked);
            goto done;
        }
        for (int t = 0; t < T && nr < RS; t++)
            if (t < 64 || t >= T - 64) {
                rpicked[t] = 1;
                rsample[nr++] = t;
            }
        while (nr < RS) {
            int t = (int)(splitmix(&rseed) % (uint64_t)T);
            if (!rpicked[t]) {
                rpicked[t] = 1;
                rsample[nr++] = t;
            }
        }
        qsort(rsample, (size_t)nr, sizeof *rsample, cmp_int);
        family_case(fcase[FAM_ROUTE], sizeof fcase[FAM_ROUTE], FAM_ROUTE, label);
        check_route(L, T, idx, w, counts, rsample, nr);
        free(rsample), free(rpicked);
    }
    if (family_on(FAM_PERMUTE_PLAN)) {
        family_case(fcase[FAM_PERMUTE_PLAN], sizeof fcase[FAM_PERMUTE_PLAN], FAM_PERMUTE_PLAN, label);
        check_permute_plan(L, align, counts, offsets, ntiles, tiles);
    }
    if (family_on(FAM_PERMUTE_SCATTER)) {
        family_case(fcase[FAM_PERMUTE_SCATTER], sizeof fcase[FAM_PERMUTE_SCATTER], FAM_PERMUTE_SCATTER, label);
        check_permute_scatter(L, T, align, idx, counts, offsets, row_of, obuf, obuf_bytes, src_of);
    }
    if (family_on(FAM_COMBINE)) {
        family_case(fcase[FAM_COMBINE], sizeof fcase[FAM_COMBINE], FAM_COMBINE, label);
        check_combine(L, T, w, row_of, obuf, obuf_bytes, y, tol);
    }
    /* the FFN families and the layer: the reference given the GPU's routing,
     * on the sample */
    if (family_on(FAM_GEMM_UP) || family_on(FAM_GEMM_DOWN) || family_on(FAM_LAYER) || family_on(FAM_PACK)) {
        family_case(fcase[FAM_LAYER], sizeof fcase[FAM_LAYER], FAM_LAYER, label);
        moe_ref_inputs_t in = {.x = L->x, .wr = L->wr, .w1 = L->w1, .w2 = L->w2, .b1 = L->b1, .b2 = L->b2,
                               .sel_bias = L->sel_bias, .logit_bias = L->logit_bias, .tokens = T,
                               .ws1 = L->ws1, .ws2 = L->ws2, .wsg = L->wsg};
        float *yref = malloc(sizeof(float) * (size_t)T * H);
        uint16_t *href = malloc((size_t)T * K * F * 2), *oref = malloc((size_t)T * K * H * 2);
        /* the reference takes the routed entries only ([T, top_k]) and computes the shared expert itself */
        int *ridx = KE > K ? malloc(sizeof(int) * (size_t)T * K) : idx;
        float *rw = KE > K ? malloc(sizeof(float) * (size_t)T * K) : w;
        uint16_t *hsref = FS ? malloc((size_t)T * FS * 2) : NULL, *osref = FS ? malloc((size_t)T * H * 2) : NULL;
        int rc = yref && href && oref && ridx && rw && (!FS || (hsref && osref)) ? 0 : -1;
        for (long long i = 0; rc == 0 && KE > K && i < (long long)T * K; i++) {
            ridx[i] = idx[i / K * KE + i % K];
            rw[i] = w[i / K * KE + i % K];
        }
        if (rc == 0)
            rc = moe_ref_ffn(s, &in, ridx, rw, sample, ns, yref, href, oref);
        if (rc == 0 && FS)
            rc = moe_ref_shared(s, &in, sample, ns, NULL, hsref, osref);
        CHECK(rc == 0);
        double hn = 0, hd = 0, on = 0, od = 0, yn = 0, yd = 0, ymax = 0;
        int finite_h = 1, finite_o = 1;
        for (int i = 0; i < ns && rc == 0; i++) {
            int tt = sample[i];
            /* the shared expert's slots: slot j's h columns are hs columns jF..; the
             * sum of its m down rows is os (each row rounded on the GPU, os once) */
            for (int j = 0; j < KE - K; j++) {
                long long row = row_of[(long long)tt * KE + K + j];
                for (int f = 0; f < F; f++) {
                    double g = moe_half_to_float(hbuf[row * F + f], dt);
                    double r = moe_half_to_float(hsref[(size_t)tt * FS + (size_t)j * F + f], dt);
                    hn += (g - r) * (g - r);
                    hd += r * r;
                    finite_h &= isfinite(g);
                }
            }
            for (int h = 0; h < H && KE > K; h++) {
                double g = 0, r = moe_half_to_float(osref[(size_t)tt * H + h], dt);
                for (int j = 0; j < KE - K; j++)
                    g += moe_half_to_float(obuf[(long long)row_of[(long long)tt * KE + K + j] * H + h], dt);
                on += (g - r) * (g - r);
                od += r * r;
                finite_o &= isfinite(g);
            }
            for (int k = 0; k < K; k++) {
                long long slot = (long long)tt * K + k, row = row_of[(long long)tt * KE + k];
                if (idx[(long long)tt * KE + k] >= ES) /* a zero expert: no GEMM rows (its x row: permute_scatter) */
                    continue;
                for (int f = 0; f < F; f++) {
                    double g = moe_half_to_float(hbuf[row * F + f], dt), r = moe_half_to_float(href[slot * F + f], dt);
                    hn += (g - r) * (g - r);
                    hd += r * r;
                    finite_h &= isfinite(g);
                }
                for (int h = 0; h < H; h++) {
                    double g = moe_half_to_float(obuf[row * H + h], dt), r = moe_half_to_float(oref[slot * H + h], dt);
                    on += (g - r) * (g - r);
                    od += r * r;
                    finite_o &= isfinite(g);
                }
            }
            for (int h = 0; h < H; h++) {
                double g = moe_half_to_float(y[(size_t)tt * H + h], dt), r = yref[(size_t)tt * H + h];
                yn += (g - r) * (g - r);
                yd += r * r;
                if (fabs(g - r) > ymax)
                    ymax = fabs(g - r);
            }
        }
        double eh = rel_l2(hn, hd), eo = rel_l2(on, od), ey = rel_l2(yn, yd);
        fprintf(stderr, "  %-40s T=%-5d gemm_up %.2e  gemm_down %.2e  layer %.2e (max abs %.3g)\n", label, T, eh, eo,
                ey, ymax);
        if (rc == 0 && family_on(FAM_GEMM_UP)) {
            family_case(fcase[FAM_GEMM_UP], sizeof fcase[FAM_GEMM_UP], FAM_GEMM_UP, label);
            CHECKF(finite_h, "NaN/Inf (poison) in the sampled gemm_up rows");
            CHECKF(eh <= tol, "gemm_up_swiglu error %.3e > %.1e", eh, tol);
        }
        if (rc == 0 && family_on(FAM_GEMM_DOWN)) {
            family_case(fcase[FAM_GEMM_DOWN], sizeof fcase[FAM_GEMM_DOWN], FAM_GEMM_DOWN, label);
            CHECKF(finite_o, "NaN/Inf (poison) in the sampled gemm_down rows");
            CHECKF(eo <= tol, "gemm_down error %.3e > %.1e", eo, tol);
        }
        if (rc == 0 && family_on(FAM_LAYER)) {
            family_case(fcase[FAM_LAYER], sizeof fcase[FAM_LAYER], FAM_LAYER, label);
            CHECKF(ey <= tol, "layer error %.3e > %.1e", ey, tol);
        }
        if (rc == 0 && family_on(FAM_PACK) && L->device_packed) { /* the layer on weights packed on the device */
            family_case(fcase[FAM_PACK], sizeof fcase[FAM_PACK], FAM_PACK, label);
            CHECKF(ey <= tol, "layer error %.3e > %.1e on weights packed on the device", ey, tol);
        }
        free(yref); free(href); free(oref); free(hsref); free(osref);
        if (KE > K) {
            free(ridx);
            free(rw);
        }
    }
done:
    free(sample); free(picked);
    free(idx); free(w); free(counts); free(offsets); free(ntiles); free(tiles); free(row_of); free(hbuf); free(obuf); free(src_of);
    free(y);
}

/* What a plan of case c must have decided, given the cuDNN this process
 * holds: st and the stage paths with their reasons. Returns 1 when the
 * case goes on to the forward checks (the plan exists). */
static int cudnn_expect(const gpu_case_t *c, const moe_spec_t *s, moe_status st, moe_plan *plan) {
    char why[1024];
    const int v = cudnn_loaded_version(why, sizeof why);
    const char *env = getenv("MOEGEN_CUDNN");
    int mode = c->cudnn != MOE_CUDNN_DEFAULT ? c->cudnn : env && *env ? moe_cudnn_parse_mode(env) : MOE_CUDNN_AUTO;
    /* the one version table says whether this spec's graphs are known to work with v */
    int known = v > 0 && moe_cudnn_spec_fits(s, 1, MOE_STAGE_UP, why, sizeof why);
    for (int i = 0; i < MOE_STAGE_COUNT && known; i++)
        known &= moe_cudnn_graph_known(i, MOE_ARCH_SM90A, s->dtype, v, why, sizeof why);
    if (mode == MOE_CUDNN_ON && !known) {
        CHECKF(st == MOE_ERR_UNSUPPORTED && strstr(moe_last_error(), "cannot take cuDNN"),
               "cuDNN %d, on, not known to work: expected MOE_ERR_UNSUPPORTED with the reason, got %s: %s", v,
               moe_status_string(st), moe_last_error());
        fprintf(stderr, "  %-40s refused as expected: %s\n", s->name, moe_last_error());
        if (st == MOE_OK)
            moe_plan_destroy(plan);
        return 0;
    }
    CHECKF(st == MOE_OK, "moe_plan_create (cuDNN %s, version %d): %s: %s", moe_cudnn_mode_name(mode), v,
           moe_status_string(st), moe_last_error());
    if (st != MOE_OK)
        return 0;
    moe_plan_info info = MOE_PLAN_INFO_INIT;
    moe_plan_get_info(plan, &info);
    CHECKF(info.cudnn_version == (mode == MOE_CUDNN_OFF || !moe_cudnn_spec_fits(s, 1, 0, why, sizeof why) ? 0 : v),
           "moe_plan_info.cudnn_version %d, loaded %d, mode %s", info.cudnn_version, v, moe_cudnn_mode_name(mode));
    for (int i = 0; i < MOE_STAGE_COUNT; i++) {
        int at = -1;
        const char *reason = NULL;
        CHECK(moe_plan_stage_path(plan, i, &at, &reason) == MOE_OK);
        fprintf(stderr, "  %-40s stage %d: %s: %s\n", s->name, i, at == MOE_PATH_CUDNN ? "cuDNN" : "generated",
                reason ? reason : "(null)");
        CHECKF(reason && reason[0], "stage %d has no reason", i);
        if (!reason)
            continue;
        if (mode == MOE_CUDNN_ON) {
            CHECKF(at == MOE_PATH_CUDNN && strstr(reason, "self-check passed"), "on, cuDNN %d: stage %d: %s", v, i,
                   reason);
        } else if (mode == MOE_CUDNN_OFF) {
            CHECKF(at == MOE_PATH_GENERATED && strstr(reason, "off"), "off: stage %d: %s", i, reason);
        } else {
            /* auto: on sm_90a both stages are known slower through cuDNN */
            CHECKF(at == MOE_PATH_GENERATED, "auto, cuDNN %d: stage %d took %d: %s", v, i, at, reason);
            if (known)
                CHECKF(strstr(reason, "known slower"), "auto, cuDNN %d: stage %d: %s", v, i, reason);
        }
    }
    return 1;
}

/* Build (not run) both stages' graphs with the loaded cuDNN, bypassing the
 * version table, and hold the table to the outcome: a version it lists
 * must finalize, one it rejects must not (else the table is stale). */
static void cudnn_probe(int v, const char *cache) {
    char buf[512];
    const char *path = spec_path_for(tiny_spec, buf, sizeof buf);
    moe_options o = {.cache_dir = cache, .cudnn = MOE_CUDNN_OFF};
    moe_plan *plan = NULL;
    CASE("cuDNN probe: the version table matches what this cuDNN builds");
    if (moe_plan_create(&plan, path, &o) != MOE_OK) {
        CHECKF(0, "moe_plan_create: %s", moe_last_error());
        return;
    }
    const char *lib = getenv("MOEGEN_CUDNN_PATH");
    for (int stage = 0; stage < MOE_STAGE_COUNT; stage++) {
        char report[1024], why[512];
        int built = moe_cudnn_probe(moe_plan_desc(plan), stage, lib && *lib ? lib : NULL, report, sizeof report) == 0;
        int listed = moe_cudnn_graph_known(stage, MOE_ARCH_SM90A, MOE_DTYPE_BF16, v, why, sizeof why);
        fprintf(stderr, "  probe stage %d: %s\n", stage, report);
        CHECKF(built == listed, "cuDNN %d %s the stage-%d graph but the version table says %s: update the table in "
               "runtime/cudnn_policy.c", v, built ? "builds" : "does not build", stage, listed ? "it works" : why);
    }
    moe_plan_destroy(plan);
}

static void run_case(const gpu_case_t *c, uint64_t seed, const char *cache) {
    char buf[512];
    const char *path = spec_path_for(c->spec, buf, sizeof buf);
    layer_t L;
    memset(&L, 0, sizeof L);
    moe_diag_t d;
    if (moe_spec_load(&L.s, path, NULL, NULL, 0, &d)) {
        CASE(path);
        CHECKF(0, "%s", d.msg);
        return;
    }
    char label[160];
    snprintf(label, sizeof label, "%s/%s/%s%s%s", L.s.name, moe_dtype_name(L.s.dtype), mode_names[c->mode],
             c->from_dir ? "/from_dir" : "", c->graph ? "/graph" : "");
    CASE(label);
    moe_options o = {.cache_dir = cache, .cudnn = c->cudnn, .tuning_path = c->tuning};
    moe_plan *plan = NULL;
    moe_status st;
    if (c->from_dir) {
        char dir[400], cmd[1200];
        snprintf(dir, sizeof dir, "%s/compiled_%s%s", tmpdir, L.s.name, c->tuning ? "_variants" : "");
        snprintf(cmd, sizeof cmd, "build/moegen compile %s -o %s --set arch=sm_90a,sm_80%s%s", path, dir,
                 c->tuning ? " --tuning " : "", c->tuning ? c->tuning : "");
        CHECKF(system(cmd) == 0, "%s failed", cmd);
        st = moe_plan_create_from_dir(&plan, dir, &o);
    } else {
        st = moe_plan_create(&plan, path, &o);
    }
    if (c >= cudnn_cases && c < cudnn_cases + sizeof cudnn_cases / sizeof *cudnn_cases) {
        if (!cudnn_expect(c, &L.s, st, plan))
            return;
    } else {
        CHECKF(st == MOE_OK, "moe_plan_create: %s: %s", moe_status_string(st), moe_last_error());
    }
    if (st != MOE_OK)
        return;
    { /* moe_plan_get_info for a caller built against an older moe.h (no mesh
       * fields): the fields it has are filled, nothing past its struct_size */
        moe_plan_info bufs[2], full = MOE_PLAN_INFO_INIT, got;
        unsigned char *buf = (unsigned char *)bufs;
        memset(bufs, 0xAB, sizeof bufs);
        size_t older = offsetof(moe_plan_info, world);
        bufs[0].struct_size = older;
        CHECK(moe_plan_get_info(plan, &bufs[0]) == MOE_OK && moe_plan_get_info(plan, &full) == MOE_OK);
        memcpy(&got, buf, sizeof got);
        int untouched = 1;
        for (size_t i = older; i < sizeof bufs; i++)
            untouched &= buf[i] == 0xAB;
        CHECKF(untouched && got.struct_size == older && got.experts == full.experts && got.hidden == full.hidden &&
                   strcmp(got.name, full.name) == 0,
               "moe_plan_get_info with struct_size %zu wrote past it or left fields out", older);
    }
    /* which GEMMs ran (the tile and grid a MOEGEN_TUNING table chose; each
     * call's variant is printed by run_tokens) */
    fprintf(stderr, "  %-40s %s, %s (%d GEMM variants)\n", label, plan->launcher.kernels[MOE_K_GEMM_UP].name,
            plan->launcher.kernels[MOE_K_GEMM_DOWN].name, moe_plan_variant_count(plan));
    if (c->tuning && strcmp(c->tuning, SPLITK_TUNE) == 0 && plan->launcher.arch == MOE_ARCH_SM90A)
        CHECKF(strstr(plan->launcher.kernels[MOE_K_GEMM_UP].name, "_sm90a_tma_splitk"),
               "%s: the up GEMM is not on the split-K grid", plan->launcher.kernels[MOE_K_GEMM_UP].name);
    if (c->tuning && strcmp(c->tuning, GEMV_TUNE) == 0 && plan->launcher.arch == MOE_ARCH_SM90A)
        for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++)
            CHECKF(plan->launcher.kernels[k].tile.gemv, "%s: not on the gemv grid", plan->launcher.kernels[k].name);
    if (c->tuning && strcmp(c->tuning, VARIANTS_TUNE) == 0) /* the table's buckets for the spec, equal neighbours merged */
        CHECKF(moe_plan_variant_count(plan) >= 3, "%d GEMM variants from %s; 3 or more planned",
               moe_plan_variant_count(plan), c->tuning);
    if (!layer_init(&L, plan, c->mode, seed) || (c->mode == MODE_PERM && !permute_slots(plan, &L, seed ^ 77))) {
        CHECKF(0, "cannot set up inputs (host or device memory, or the slot table)");
    } else {
        if (c->mode == MODE_PERM && c->cudnn == MOE_CUDNN_ON) {
            int at = -1;
            const char *reason = "";
            moe_plan_stage_path(plan, MOE_STAGE_UP, &at, &reason);
            CHECKF(at == MOE_PATH_GENERATED && strstr(reason, "not the identity"),
                   "a permuted slot table must move the stages off cuDNN: %s", reason);
        }
        if (family_on(FAM_PACK)) {
            char pc[240];
            family_case(pc, sizeof pc, FAM_PACK, label);
            const double w1_bytes = 4.0 * L.s.experts * L.s.ffn * L.s.hidden;
            if (w1_bytes <= 64.0 * (1 << 20))
                check_pack_bytes(plan, &L, seed ^ 0x9a);
            else
                SKIP("the byte-for-byte check of every layout: W1 is %.0f MB (over 64 MB)", w1_bytes / (1 << 20));
            if (w1_bytes <= 1024.0 * (1 << 20)) {
                L.device_packed = pack_layer_on_device(plan, &L);
                CHECKF(L.device_packed, "the layer's weights were not packed on the device");
            } else {
                SKIP("the layer on device-packed weights: W1 is %.0f MB (over 1 GB)", w1_bytes / (1 << 20));
            }
            CASE(label);
        }
        uint64_t rng = seed ^ 0x5eed;
        /* the case's calls, then one call at each GEMM variant's bucket that none of them runs (the
         * variants of the table in use: an example spec's shipped entries, or MOEGEN_TUNING's), so every
         * variant a plan holds is checked against the reference */
        int calls[8 + MOE_PLAN_MAX_VARIANTS], ncalls = 0;
        for (int i = 0; i < c->ntokens; i++)
            calls[ncalls++] = c->tokens[i];
        const int nv = moe_cudnn_workspace(plan->cudnn) ? 0 : moe_plan_variant_count(plan);
        for (int v = 1; v < nv; v++) {
            int b = 0, hit = 0;
            moe_plan_variant(plan, v, &b, NULL, NULL, NULL);
            for (int i = 0; i < c->ntokens; i++)
                hit |= moe_plan_variant_for(plan, c->tokens[i]) == v;
            if (!hit && b >= 1 && b <= L.s.tokens && ncalls < (int)(sizeof calls / sizeof *calls))
                calls[ncalls++] = b;
        }
        for (int i = 0; i < ncalls; i++) {
            if ((tokens_max > 0 && calls[i] > tokens_max) || calls[i] < tokens_min)
                continue;
            char l2[200];
            snprintf(l2, sizeof l2, "%s/T%d%s", label, calls[i], i < c->ntokens ? "" : " (a bucket's variant)");
            CASE(l2);
            run_tokens(plan, &L, calls[i], &rng, l2, c->graph);
        }
        /* capacity: one token more than the spec allows is refused */
        const moe_spec_t *s = &L.s;
        moe_forward_args a = {.tokens = L.s.tokens + 1, .x = (void *)L.dx, .router_w = (void *)L.dwr,
                              .topk_ids = (const int *)L.dgids, .topk_weights = (const float *)L.dgw,
                              .router_x = (const void *)L.drx, .router_expert_scale = (const float *)L.des,
                              .router_bias = s->router.bias ? (float *)L.dsel : NULL,
                              .router_logit_bias = s->router.logit_bias ? (float *)L.dlogit : NULL,
                              .w1p = (void *)L.dw1p, .b1p = s->ffn_bias ? (void *)L.db1p : NULL,
                              .w2 = (void *)L.dw2, .b2 = s->ffn_bias ? (void *)L.db2 : NULL, .y = (void *)L.dy,
                              .workspace = (void *)L.dws,
                              .shared_gate = s->shared.gate == MOE_SHARED_GATE_SIGMOID ? (void *)L.dwsg : NULL};
        if (family_on(FAM_SWIGLU)) {
            char sc[240];
            family_case(sc, sizeof sc, FAM_SWIGLU, label);
            check_swiglu(plan, &L, seed ^ 0x5a);
            CASE(label);
        }
        if (family_on(FAM_LAYER)) {
            char lc[240];
            family_case(lc, sizeof lc, FAM_LAYER, label);
            CHECK(moe_forward(plan, &a, NULL) == MOE_ERR_CAPACITY);
            /* an empty batch is valid (x may be NULL): nothing enqueued, y untouched */
            size_t yb = (size_t)L.s.tokens * L.s.hidden * 2;
            uint8_t *yh = malloc(yb);
            moe_forward_args z = a;
            z.tokens = 0;
            z.x = NULL;
            CHECK(yh && cu_ok(moe_cu.cuMemsetD8(L.dy, 0x5a, yb), "poison y"));
            moe_status zst = moe_forward(plan, &z, NULL);
            CHECKF(zst == MOE_OK, "tokens = 0: %s: %s", moe_status_string(zst), moe_last_error());
            CHECK(cu_ok(moe_cu.cuCtxSynchronize(), "sync") && cu_ok(moe_cu.cuMemcpyDtoH(yh, L.dy, yb), "read y"));
            size_t changed = 0;
            for (size_t i = 0; yh && i < yb; i++)
                changed += yh[i] != 0x5a;
            CHECKF(changed == 0, "tokens = 0 wrote %zu bytes of y", changed);
            free(yh);
            z.tokens = -1;
            CHECK(moe_forward(plan, &z, NULL) == MOE_ERR_INVALID_ARG);
            /* rows the kernels move 16 bytes at a time: a misaligned x or y is refused, nothing enqueued */
            z = a;
            z.tokens = 1;
            z.x = (const char *)a.x + 2;
            CHECK(moe_forward(plan, &z, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "x must be 16-byte"));
            z = a;
            z.tokens = 1;
            z.y = (char *)a.y + 8;
            CHECK(moe_forward(plan, &z, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "y must be 16-byte"));
            CASE(label);
        }
    }
    layer_free(&L);
    moe_plan_destroy(plan);
}

int main(int argc, char **argv) {
    /* arguments: --cudnn, --family LIST, --tokens-max N, --tokens-min N, and spec filters (only the cases
     * whose spec contains one of them) */
    int only_cudnn = 0, nfilter = 0;
    const char *filter[32];
    unsigned chosen = 0;
    for (int i = 1; i < argc; i++) {
        const char *list = NULL;
        if (strcmp(argv[i], "--cudnn") == 0)
            only_cudnn = 1;
        else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc)
            list = argv[++i];
        else if (strncmp(argv[i], "--family=", 9) == 0)
            list = argv[i] + 9;
        else if (strcmp(argv[i], "--tokens-max") == 0 && i + 1 < argc)
            tokens_max = atoi(argv[++i]);
        else if (strcmp(argv[i], "--tokens-min") == 0 && i + 1 < argc)
            tokens_min = atoi(argv[++i]);
        else if (nfilter < 32)
            filter[nfilter++] = argv[i];
        if (list && !select_families(list, &chosen)) {
            fprintf(stderr, "test_gpu: --family %s: no such family; the families are", list);
            for (int f = 0; f < FAM_COUNT; f++)
                fprintf(stderr, " %s", family_names[f]);
            fputc('\n', stderr);
            return 2;
        }
    }
    if (chosen)
        families_on = chosen;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *env = getenv("MOEGEN_TEST_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 10);
    fprintf(stderr, "test_gpu: seed %llu (MOEGEN_TEST_SEED=%llu repeats this run)\n", (unsigned long long)seed,
            (unsigned long long)seed);
    char why[512];
    CASE("driver");
    if (moe_cu_load(why, sizeof why) != 0) {
        SKIP("every GPU case: no CUDA driver (%s)", why);
        return check_report("test_gpu");
    }
    int count = 0;
    if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
        SKIP("every GPU case: the driver reports no GPU");
        return check_report("test_gpu");
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moegen_test_gpu_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases && !only_cudnn; i++) {
        int want = nfilter == 0;
        for (int j = 0; j < nfilter; j++)   /* the spec's path or text, or the case's tuning table */
            want |= strstr(cases[i].spec, filter[j]) != NULL ||
                    (cases[i].tuning && strstr(cases[i].tuning, filter[j]) != NULL);
        if (want)
            run_case(&cases[i], seed + i * 1000, cache);
    }
    if (nfilter == 0 || only_cudnn) {
        int v = cudnn_loaded_version(why, sizeof why);
        fprintf(stderr, "test_gpu: cuDNN cases with %s (MOEGEN_CUDNN=%s, MOEGEN_CUDNN_PATH=%s): %s\n",
                v ? "the loaded cuDNN" : "no cuDNN", getenv("MOEGEN_CUDNN") ? getenv("MOEGEN_CUDNN") : "",
                getenv("MOEGEN_CUDNN_PATH") ? getenv("MOEGEN_CUDNN_PATH") : "", v ? "" : why);
        if (v) {
            char vs[32];
            moe_cudnn_version_string(v, vs, sizeof vs);
            fprintf(stderr, "test_gpu: cuDNN %s\n", vs);
        }
        /* with MOEGEN_CUDNN=off only the cases the environment decides run,
         * and afterwards no cuDNN library may be in the process */
        for (size_t i = 0; i < sizeof cudnn_cases / sizeof *cudnn_cases; i++)
            if (!cudnn_env_off() || cudnn_cases[i].cudnn == MOE_CUDNN_DEFAULT)
                run_case(&cudnn_cases[i], seed + 100000 + i * 1000, cache);
        if (v) /* the version table against what this cuDNN does, whatever the table says */
            cudnn_probe(v, cache);
        if (cudnn_env_off()) {
            CASE("cuDNN off: never loaded");
            CHECK(!dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_NOLOAD) && !dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD));
        }
    }
    return check_report("test_gpu");
}
