/* test_route_host.c — the route kernel (templates/route.lua) run on the
 * CPU: for each case a spec is planned and emitted, the route's namespace
 * and kernel and the prelude pieces they use are cut out of the source and
 * built with the host C++ compiler into tests/route_host.cc (cp.async,
 * ldmatrix, mma.sync and the warp reductions emulated by
 * tests/support/cuda_host.h; the namespace's inline-asm mma swapped for the
 * host one), which routes random tokens; the selection, the weights, the
 * counts and (training specs) the saved logits are compared with the C
 * reference (tests/support/ref.c) as test_gpu compares the GPU's. So a
 * change to the route's logit tiling, its H split across blocks and their
 * ticket, or its top-k can be checked where there is no GPU; test_gpu runs
 * the same checks on one. Calls of up to 64 tokens also run fused (the
 * mode the runtime picks: the permute plan, and for the fewest tokens the
 * scatter, in the last block), which route_host.cc checks against the
 * plan's and the scatter's rules, and whose routing must be the unfused
 * call's bit for bit. Skipped without a
 * C++17 compiler with <ucontext.h> (c++, or $CXX). Run from the repository
 * root. */
#define _POSIX_C_SOURCE 200809L
#include "gen_fixture.h"
#include "launch_geom.h"
#include "ref.h"

#include <math.h>
#include <stdint.h>


static const host_case_t cases[] = {
    {"softmax top-4 of 32, a shared expert, logit softcap, training (the saved logits); H 264: one block or two",
     "tests/specs/softcap.moe", {1, 13, 40}, 3},
    {"softmax top-8 of 128 (Qwen3's), H 1024: split across 4 blocks at few tokens",
     "name = 'q' experts = 128 top_k = 8 hidden = 1024 ffn = 64 tokens = 256\n"
     "router = { score = 'softmax', renormalize = true }\n", {1, 7, 70}, 3},
    {"sigmoid with a selection bias, 8 groups keep 4 (DeepSeek-V3's), scale 2.5, fp16",
     "name = 'g' experts = 64 top_k = 6 hidden = 512 ffn = 64 tokens = 128 dtype = 'fp16'\n"
     "router = { score = 'sigmoid', bias = true, groups = 8, topk_groups = 4, group_topk = 2, renormalize = true, "
     "scale = 2.5 }\n", {3, 50}, 2},
    {"sqrt(softplus) with a selection bias (DeepSeek-V4's)", "tests/specs/sqrtsoftplus.moe", {2, 33}, 2},
    {"sparsemixer top-2 (Phi-3.5-MoE's)", "tests/specs/sparsemixer.moe", {5, 40}, 2},
    {"logit_bias, top-4 (gpt-oss's)", "tests/specs/train_gptoss.moe", {9}, 1},
    {"a sigmoid-gated shared expert of two slots (Qwen2-MoE's gate: logit column E), fp16",
     "tests/specs/train_shared.moe", {4, 37}, 2},
    {"zero experts: 48 routed + 24 zero scored together", "tests/specs/zero_experts.moe", {1, 30}, 2},
    {"fp8 weights (Qwen3's fp8 spec): the route as bf16's; one token's row quantized by the route (mode 2), 9 tokens "
     "fused with the plan alone", "examples/specs/fp8/qwen3-30b-a3b-fp8.moe", {1, 9}, 2},
    {"router.apply = \"input\", sigmoid top-1 (Llama 4's): the fused scatter writes round(x . round(w))",
     "tests/specs/apply_input.moe", {1, 5, 64}, 3},
    {"DeepSeek-V3's whole router: 256 experts (8 a lane), top-8 of 8 groups keep 4; 64 tokens fused, 65 not",
     "name = 'v3' experts = 256 top_k = 8 hidden = 512 ffn = 64 tokens = 256\n"
     "router = { score = 'sigmoid', bias = true, groups = 8, topk_groups = 4, group_topk = 2, renormalize = true, "
     "scale = 2.5 }\n", {1, 64, 65}, 3},
    {"DeepSeek-V3's router at H 4096: one token's 256 logits summed over 16 split blocks (two batches of eight "
     "splits' loads)",
     "name = 'v3h' experts = 256 top_k = 8 hidden = 4096 ffn = 64 tokens = 64\n"
     "router = { score = 'sigmoid', bias = true, groups = 8, topk_groups = 4, group_topk = 2, renormalize = true, "
     "scale = 2.5 }\n", {1, 3}, 2},
    {"given ids (DeepSeek-V4's hash layers): sqrt(softplus) at the caller's experts, renormalized, scaled; "
     "repeats, and ids out of range dropped and counted", "tests/specs/given_ids.moe", {1, 64, 70}, 3},
    {"given ids and weights (a server's own router): no logits, no split; a sigmoid-free shared expert after them",
     "name = 'gw' experts = 64 top_k = 6 hidden = 1024 ffn = 64 tokens = 128\n"
     "router = { select = 'given', score = 'given', renormalize = false }\nshared = { ffn = 128 }\n",
     {1, 9, 64}, 3},
    {"given ids in a training spec: the saved logits (logit_bias included) beside the caller's experts",
     "tests/specs/train_given.moe", {2, 70}, 2},
    {"the router's own input and per-expert scales (Gemma 4's): softmax top-8 of 128 on router_x, renormalized, "
     "× expert_scale; H 704: split at few tokens", "tests/specs/router_own_input.moe", {1, 9, 70}, 3},
    {"a latent MoE's router (Nemotron 3 Super's LatentMoE): sigmoid with a selection bias, top-22 of 128, x 5, on "
     "router_x of 1024 columns (router.hidden; split at few tokens) while x, scattered, is 256 wide",
     "tests/specs/router_latent.moe", {1, 9, 70}, 3},
    {"fp32 router weights (ERNIE 4.5's): softmax with a selection bias over 64 experts, H 1024 split at few tokens; "
     "the weights' three parts", "tests/specs/router_fp32.moe", {1, 9, 70}, 3},
    {"fp32 router weights with zero experts (LongCat-Flash's classifier), fp16",
     "name = 'lz' experts = 40 zero_experts = 8 top_k = 4 hidden = 256 ffn = 64 tokens = 128 dtype = 'fp16'\n"
     "router = { score = 'softmax', bias = true, renormalize = false, scale = 1.5, weight_dtype = 'fp32' }\n",
     {1, 33}, 2},
    {"given ids weighted by the router's softmax on its own input, per-expert scales, an ungated shared expert, fp16",
     "name = 'gx' experts = 40 top_k = 3 hidden = 256 ffn = 64 tokens = 128 dtype = 'fp16'\n"
     "router = { select = 'given', score = 'softmax', renormalize = true, scale = 2.0, input = 'separate', "
     "expert_scale = true }\nshared = { ffn = 64 }\n", {1, 33}, 2},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

/* The route's pieces into b: the prelude's fuse struct, plan block and
 * sqrt(softplus) (when emitted), the namespace with the host mma, the
 * kernel with its dynamic shared memory at host_smem(). 0, or 1. */
static int cut_route(const char *src, const char *name, moe_buf_t *b) {
    static const char *const prelude[] = {"typedef struct {\n    int mode, align;",
                                          "template <int THREADS, int N>\nstatic __device__ __forceinline__ void "
                                          "moe_plan_block(",
                                          "static __device__ __forceinline__ float moe_sqrt_softplus(float l) {",
                                          "static __device__ __forceinline__ float moe_sqrt_softplus_grad(float l) {"};
    for (int i = 0; i < 4; i++) { /* the fuse struct and the plan block always; sqrt(softplus) when emitted */
        const char *to = i ? "\n}\n" : "} moe_route_fuse_t;";
        if ((i < 2 || strstr(src, prelude[i])) && host_cut_span(src, prelude[i], to, b))
            return 1;
    }
    moe_buf_t k = {0};
    const char *mma = "static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], "
                      "const unsigned (&b)[2]) {";
    char *m = host_cut_kernel(src, name, "moe_route_smem", &k) ? NULL : strstr(k.data, mma);
    char *e = m ? strstr(m, "\n}\n") : NULL;
    if (e) { /* the namespace's inline-asm mma swapped for the host one */
        moe_buf_printf(b, "%.*s", (int)(m - k.data), k.data);
        moe_buf_printf(b, "static inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) "
                          "{ host_mma_16816(d, a, b); }\n%s", e + 3);
    }
    moe_buf_free(&k);
    return e == NULL;
}

static uint64_t rng_state;
static float urand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* One run of the built program on T random tokens: write the inputs, run,
 * read the outputs, compare with the reference. */
static void run_tokens(const moe_spec_t *s, const char *bin, int T, int seed) {
    const int H = s->hidden, NS = moe_spec_scored(s), K = s->top_k, KE = moe_spec_entries(s), ES = moe_spec_slots(s);
    const int E = s->experts, NI = ES + s->zero_experts;
    const int HR = moe_spec_router_hidden(s); /* the router's width: wr [NS, HR], rx [T, HR] (router.hidden) */
    const moe_dtype_t dt = s->dtype;
    rng_state = 0x9e3779b97f4a7c15ULL * (uint64_t)(seed + 1) + (uint64_t)T;
    const int gated = s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H), *wr = malloc(sizeof(uint16_t) * (size_t)NS * HR);
    uint16_t *wg = malloc(sizeof(uint16_t) * (size_t)H);
    float *gref = malloc(sizeof(float) * (size_t)T);
    float *sel = malloc(sizeof(float) * (size_t)NS), *lb = malloc(sizeof(float) * (size_t)NS);
    const size_t nout = (size_t)T * KE;
    int *idx = malloc(sizeof(int) * nout), *counts = malloc(sizeof(int) * (size_t)ES);
    float *w = malloc(sizeof(float) * nout), *logits = malloc(sizeof(float) * (size_t)T * NS);
    int *ridx = malloc(sizeof(int) * (size_t)T * K), *gidx = malloc(sizeof(int) * (size_t)T * K);
    float *rw = malloc(sizeof(float) * (size_t)T * K), *sc = malloc(sizeof(float) * (size_t)T * NS);
    int *hist = calloc((size_t)NI + 1, sizeof(int));
    const int given = s->router.select == MOE_SELECT_GIVEN, given_w = s->router.score == MOE_SCORE_GIVEN;
    int *gids = malloc(sizeof(int) * (size_t)T * K), ndrop = 0, dropped = -1;
    float *gw = malloc(sizeof(float) * (size_t)T * K);
    /* the router's own input (router.input = "separate"): other rows than x; per-expert scales (expert_scale) */
    const int own = s->router.input == MOE_ROUTER_INPUT_SEPARATE, escale = s->router.expert_scale;
    uint16_t *rx = malloc(sizeof(uint16_t) * (size_t)T * HR);
    float *es = malloc(sizeof(float) * (size_t)NS);
    /* fp32 router weights (router.weight_dtype = "fp32"): values a dtype cannot hold, the halves beside them */
    const int w32 = s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32;
    float *wr32 = malloc(sizeof(float) * (size_t)NS * HR);
    CHECK(x && wr && wg && gref && sel && lb && idx && counts && w && logits && ridx && gidx && rw && sc && hist &&
          gids && gw && rx && es && wr32);
    if (!(x && wr && wg && gref && sel && lb && idx && counts && w && logits && ridx && gidx && rw && sc && hist &&
          gids && gw && rx && es && wr32))
        goto done;
    for (size_t i = 0; i < (size_t)T * H; i++)
        x[i] = moe_float_to_half(urand(), dt);
    for (size_t i = 0; i < (size_t)T * HR; i++)
        rx[i] = moe_float_to_half(urand(), dt);
    for (int e = 0; e < NS; e++) /* Gemma 4's per_expert_scale: around 1, some below */
        es[e] = 0.25f + 1.5f * (urand() + 1.0f) * 0.5f;
    for (size_t i = 0; i < (size_t)NS * HR; i++) { /* logits of a few units: softmax and sigmoid both spread */
        wr32[i] = urand() * 3.0f / sqrtf((float)HR);
        wr[i] = moe_float_to_half(wr32[i], dt);
    }
    for (int h = 0; h < H; h++)
        wg[h] = moe_float_to_half(urand() * 2.0f / sqrtf((float)H), dt);
    for (int e = 0; e < NS; e++)
        sel[e] = s->router.bias ? 0.1f * urand() : 0.0f, lb[e] = s->router.logit_bias ? 0.5f * urand() : 0.0f;
    /* given routing: ids over the experts, repeats within a token allowed, about one in 16 out of range
     * (-1, E, a large one: dropped and counted); weights in (0, 1] */
    for (int i = 0; i < T * K; i++) {
        const float u = urand();
        const int r = (int)((urand() + 1.0f) * 0.5f * (float)E) % E;
        gids[i] = u < -0.875f ? (i % 3 == 0 ? -1 : i % 3 == 1 ? E : 1 << 30) : r;
        ndrop += gids[i] < 0 || gids[i] >= E;
        gw[i] = 0.5f * (urand() + 1.0f) + 1e-3f;
    }
    char in_path[400], out_path[400], cmd[1200];
    snprintf(in_path, sizeof in_path, "%s/%s_%d_%d.in", tmp_root, s->name, T, seed);
    snprintf(out_path, sizeof out_path, "%s/%s_%d_%d.out", tmp_root, s->name, T, seed);
    FILE *f = fopen(in_path, "wb");
    int ok = f && fwrite(&T, sizeof T, 1, f) == 1 && fwrite(x, 2, (size_t)T * H, f) == (size_t)T * H &&
             (w32 ? fwrite(wr32, 4, (size_t)NS * HR, f) : fwrite(wr, 2, (size_t)NS * HR, f)) == (size_t)NS * HR &&
             (!gated || fwrite(wg, 2, (size_t)H, f) == (size_t)H) &&
             fwrite(sel, 4, (size_t)NS, f) == (size_t)NS &&
             fwrite(lb, 4, (size_t)NS, f) == (size_t)NS &&
             (!given || fwrite(gids, 4, (size_t)T * K, f) == (size_t)T * K) &&
             (!given_w || fwrite(gw, 4, (size_t)T * K, f) == (size_t)T * K) &&
             (!own || fwrite(rx, 2, (size_t)T * HR, f) == (size_t)T * HR) &&
             (!escale || fwrite(es, 4, (size_t)NS, f) == (size_t)NS);
    ok = f && fclose(f) == 0 && ok;
    CHECKF(ok, "cannot write %s", in_path);
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s %s", bin, in_path, out_path);
    fflush(NULL);
    ok = ok && system(cmd) == 0;
    CHECKF(ok, "%s failed", cmd);
    if (ok && T <= MOE_ROUTE_FUSE_TOKENS) { /* the fused tail: checked by the program; the same routing, bit for bit */
        char fused_out[420], fcmd[1300];
        snprintf(fused_out, sizeof fused_out, "%s.fused", out_path);
        snprintf(fcmd, sizeof fcmd, "timeout 120 %s %s %s fused", bin, in_path, fused_out);
        fflush(NULL);
        CHECKF(system(fcmd) == 0, "%s: the fused tail is wrong (its line above says where)", fcmd);
        size_t na = 0, nb = 0;
        char *a = read_bytes(out_path, &na), *b = read_bytes(fused_out, &nb);
        CHECKF(a && b && na == nb && memcmp(a, b, na) == 0, "%s, %d tokens: the fused call routes otherwise than "
               "the unfused one", s->name, T);
        free(a), free(b);
    }
    f = ok ? fopen(out_path, "rb") : NULL;
    ok = f && fread(idx, sizeof(int), nout, f) == nout && fread(w, 4, nout, f) == nout &&
         fread(counts, sizeof(int), (size_t)ES, f) == (size_t)ES &&
         (!s->training || fread(logits, 4, (size_t)T * NS, f) == (size_t)T * NS) &&
         (!given || fread(&dropped, sizeof(int), 1, f) == 1);
    if (f)
        fclose(f);
    CHECKF(ok, "cannot read %s", out_path);
    if (!ok)
        goto done;
    /* every index in range: routed and shared slots, zero experts past them */
    int in_range = 1;
    for (size_t i = 0; i < nout; i++)
        in_range &= idx[i] >= 0 && idx[i] < NI;
    CHECKF(in_range, "%s, %d tokens: an index out of range (or never written)", s->name, T);
    if (!in_range)
        goto done;
    moe_ref_inputs_t in = {.x = x, .wr = wr, .sel_bias = sel, .logit_bias = lb, .tokens = T, .given_ids = gids,
                           .given_w = gw, .router_x = rx, .expert_scale = es, .wr32 = wr32};
    CHECK(moe_ref_route(s, &in, ridx, rw, sc) == 0);
    for (int t = 0; t < T; t++)
        memcpy(gidx + (size_t)t * K, idx + (size_t)t * KE, sizeof(int) * (size_t)K);
    double werr = 0;
    if (given) { /* the caller's ids: entry for entry (a dropped one at expert 0, weight 0), and the drops counted */
        int same = 1;
        double gerr = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                same &= gidx[(size_t)t * K + k] == ridx[(size_t)t * K + k];
                const double d = fabs(w[(size_t)t * KE + k] - rw[(size_t)t * K + k]);
                gerr = d > gerr ? d : gerr;
            }
        CHECKF(same, "%s, %d tokens: the entries' experts are not the caller's ids", s->name, T);
        werr = gerr; /* checked below with the others' */
        CHECKF(dropped == ndrop, "%s, %d tokens: %d ids out of range counted, %d given", s->name, T, dropped, ndrop);
    }
    /* as test_gpu: sparsemixer works on logits rounded to the dtype, its ties a dtype step wide */
    const int in_dtype = s->router.score == MOE_SCORE_SPARSEMIXER;
    int bad = -1;
    const int agree = given || moe_ref_route_agree(s, ridx, gidx, sc, T, in_dtype ? 4e-2f : 2e-4f, &bad);
    CHECKF(agree, "%s, %d tokens: token %d selects other experts than the reference", s->name, T, bad);
    int wild = 0;
    for (int t = 0; t < T && !given; t++) {
        int off = 0;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < K; j++)
                if (gidx[(size_t)t * K + j] == ridx[(size_t)t * K + k]) {
                    const double d = fabs(w[(size_t)t * KE + j] - rw[(size_t)t * K + k]);
                    if (in_dtype && d > 8e-3)
                        off = 1;
                    else if (d > werr)
                        werr = d;
                }
        wild += off;
    }
    /* fp32 router weights: the logits as an fp32 product's, so the weights too (a missing lo part, the weight's
     * last 8 bits, moves them by 1e-6 here) */
    const double wtol = in_dtype ? 8e-3 : w32 ? 4e-7 * s->router.scale + 2e-7 : 1e-4 * s->router.scale + 1e-4;
    CHECKF(werr <= wtol, "%s, %d tokens: weights differ by %g (tolerance %g)", s->name, T, werr, wtol);
    CHECKF(wild <= (T + 127) / 128, "%s, %d tokens: %d sparsemixer weights off by more than a step", s->name, T, wild);
    /* the shared expert's entries: slots E.. in order, weight g(x): 1, or sigmoid(x . w_gate) */
    moe_ref_inputs_t sin = {.x = x, .wsg = wg, .tokens = T};
    CHECK(KE == K || moe_ref_shared(s, &sin, NULL, 0, gref, NULL, NULL) == 0);
    int shared_ok = 1;
    double gerr = 0;
    for (int t = 0; t < T; t++)
        for (int j = K; j < KE; j++) {
            shared_ok &= idx[(size_t)t * KE + j] == E + j - K;
            const double d = fabs(w[(size_t)t * KE + j] - gref[t]);
            gerr = d > gerr ? d : gerr;
        }
    CHECKF(shared_ok, "%s, %d tokens: the shared expert's entries are not slots %d.. in order", s->name, T, E);
    CHECKF(gerr <= 1e-4, "%s, %d tokens: the shared expert's weights differ from g(x) by %g", s->name, T, gerr);
    for (size_t i = 0; i < nout; i++)
        hist[idx[i]]++;
    int cnt_ok = 1;
    for (int e = 0; e < ES; e++)
        cnt_ok &= hist[e] == counts[e];
    CHECKF(cnt_ok, "%s, %d tokens: counts differ from the histogram of topk_idx", s->name, T);
    if (s->training) { /* the saved logits: x . wr (+ logit_bias), capped, against double sums */
        double lerr = 0;
        for (int t = 0; t < T; t++)
            for (int e = 0; e < NS; e++) {
                double l = 0, mag = 0;
                for (int h = 0; h < H; h++) {
                    const double p = (double)moe_half_to_float(x[(size_t)t * H + h], dt) *
                                     moe_half_to_float(wr[(size_t)e * H + h], dt);
                    l += p, mag += fabs(p);
                }
                l += lb[e];
                if (s->router.logit_softcap > 0)
                    l = s->router.logit_softcap * tanh(l / s->router.logit_softcap);
                const double d = fabs(logits[(size_t)t * NS + e] - l) / (mag + 1e-3);
                lerr = d > lerr ? d : lerr;
            }
        CHECKF(lerr <= 1e-5, "%s, %d tokens: saved logits off by %g of their magnitude", s->name, T, lerr);
    }
    printf("  %s, %d tokens (seed %d): the reference's experts, weights within %.2g%s\n", s->name, T, seed, werr,
           given ? " (given ids; the drops counted)" : "");
done:
    free(gids), free(gw), free(rx), free(es), free(wr32);
    free(x), free(wr), free(wg), free(gref), free(sel), free(lb), free(idx), free(counts), free(w), free(logits);
    free(ridx), free(gidx), free(rw), free(sc), free(hist);
}

static void run_case(const host_case_t *c, const char *cxx) {
    CASE(c->label);
    if (!check_counts()) /* left out by MOEGEN_TEST_CASE: not built or run */
        return;
    moe_spec_t s;
    moe_diag_t d;
    moe_plan_desc_t pd;
    if (host_case_plan(c->spec, NULL, 0, NULL, &s, &pd))
        return;
    const moe_kernel_desc_t *r = &moe_plan_kernels(&pd, s.arch[0])[MOE_K_ROUTE];
    moe_buf_t src = {0}, inc = {0};
    if (moe_emit_source(&pd, NULL, &src, &d)) {
        CHECKF(0, "%s", d.msg);
        moe_plan_desc_free(&pd);
        return;
    }
    const int bad = cut_route(src.data, r->name, &inc);
    CHECKF(!bad, "%s's pieces not found whole in the emitted source", r->name);
    CHECKF(r->threads == 256, "%s: %d threads (the host emulation runs 256)", r->name, r->threads);
    char inc_path[400], bin[400], cmd[3000];
    const int fp8 = moe_spec_fp8(&s);
    const char *objs = fp8 ? fp8_objects() : ""; /* fp8: the host's quantization rule (runtime/fp8.c), linked in */
    CHECKF(objs != NULL, "cannot build runtime/fp8.c and half.c for the reference");
    snprintf(inc_path, sizeof inc_path, "%s/%s.inc", tmp_root, s.name);
    snprintf(bin, sizeof bin, "%s/%s_host", tmp_root, s.name);
    CHECKF(!bad && write_bytes(inc_path, inc.data, inc.len) == 0, "cannot write %s", inc_path);
    if (!bad && r->threads == 256 && objs) {
        snprintf(cmd, sizeof cmd,
                 "%s -std=c++17 -O2 -w -Itests/support -Igen -include cuda_host.h -include %s %s -DRH_ROUTE=%s "
                 "-DRH_GATE=%d -DRH_TRAIN=%d -DRH_H=%d -DRH_NS=%d -DRH_KE=%d -DRH_SLOTS=%d -DRH_PER_BLOCK=%d "
                 "-DRH_SMEM=%d -DRH_ALIGN=%d -DRH_INPUT=%d -DRH_SCATTER=%d -DRH_K=%d -DRH_GIVEN=%d -DRH_GIVEN_W=%d "
                 "-DRH_OWN=%d -DRH_ESCALE=%d -DRH_W32=%d -DRH_MC=%d -DRH_HR=%d -DRH_FP8=%d tests/route_host.cc %s -o %s 2>&1",
                 cxx, inc_path, s.dtype == MOE_DTYPE_FP16 ? "-DMOE_HOST_FP16" : "", r->name,
                 s.shared.ffn && s.shared.gate == MOE_SHARED_GATE_SIGMOID, s.training, s.hidden,
                 moe_spec_scored(&s), moe_spec_entries(&s), moe_spec_slots(&s), r->per_block, r->smem, pd.align,
                 s.router.apply == MOE_APPLY_INPUT,
                 moe_route_fuse_scatter(fp8, s.router.apply == MOE_APPLY_INPUT, s.router.select == MOE_SELECT_GIVEN),
                 s.top_k, s.router.select == MOE_SELECT_GIVEN,
                 s.router.score == MOE_SCORE_GIVEN, s.router.input == MOE_ROUTER_INPUT_SEPARATE,
                 s.router.expert_scale, s.router.weight_dtype == MOE_ROUTER_WEIGHT_FP32, moe_spec_route_mma_columns(&s),
                 moe_spec_router_hidden(&s), fp8, objs, bin);
        const int built = system(cmd) == 0;
        CHECKF(built, "the host build failed: %s", cmd);
        for (int i = 0; built && i < c->ntokens; i++)
            for (int seed = 0; seed < 2; seed++)
                run_tokens(&s, bin, c->tokens[i], seed);
    }
    moe_buf_free(&inc);
    moe_buf_free(&src);
    moe_plan_desc_free(&pd);
}

int main(void) { return host_main("test_route_host", "the route kernel on the host", cases, NCASES, run_case); }
