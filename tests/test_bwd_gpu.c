/* test_bwd_gpu.c — the training forward and the backward on the GPU against
 * the CPU reference's backward (moe_ref_backward, tests/support/ref.h), on
 * fresh random inputs and output gradients, every output and buffer the
 * backward writes poisoned first.
 *
 * Without a driver or GPU every case reports itself skipped. The seed is
 * printed; MOEGEN_TEST_SEED=N repeats a run. Each (spec, tokens, choice)
 * checks, one CASE each:
 *   gradients  dx, d router_w, d logit_bias, dW1 (dw1p unpacked by
 *              moe_plan_unpack_grad), db1 (db1p unpacked), dW2, db2 against
 *              the reference's rounded mode; a shared expert's dW1, dW2
 *              (its slots, joined as moe_plan_pack_shared split them) and
 *              d w_gate
 *   stages     the saved U (or the recomputed one), A, O; dys, dw, dU, dXs
 *              and d logits, row by row through the GPU's row map
 *   accumulate the weight gradients added into random prior values
 *              (accumulate = 1) equal prior + the written ones; dx written
 * The routing is the reference's up to near-ties: a token whose expert set
 * differs gets dy = 0 (so it adds nothing to any gradient, on both sides)
 * and the pair runs again; its rows are left out of the stage checks.
 * Cases: the common spec (softmax top-2, SwiGLU) at 1, 37 and 700 tokens
 * (most experts empty at 1), saving and recomputing U; gpt-oss's parts in
 * fp16 (logit_bias, expert biases, clamped SwiGLU); sigmoid, grouped routing
 * with a selection bias and scale; router.apply = "input" with biases and the
 * clamp; a sigmoid-gated shared expert of two slots; and forward + backward
 * captured in one CUDA graph, replayed on new x and dy; the weight
 * gradients in the dtype (weight_grads = "dtype", bf16 and fp16). Then every
 * one-device example spec (the .moe files of examples/specs) as a training spec at
 * 1, 77 and 300 tokens: its own experts, top_k, router, activation, biases,
 * dtype and shared expert (the same number of shared slots), with hidden =
 * 256 and ffn = 128 so that the CPU reference and the full weight gradients
 * stay small (the GEMMs' own shapes are test_bgemm_gpu's).
 *
 * Then training on dp x fsdp meshes, every rank a plan of its own on this
 * GPU (run_fsdp_mesh): the FSDP groups' summed weight gradients against the
 * reference of each group's tokens together, and moe_reduce_scatter_grads.
 *
 * Then training on expert-parallel meshes (run_ep_mesh): every rank a plan
 * of its own on this GPU holding its experts, the training forward and the
 * backward driven step by step (moe_ep_train_step, moe_ep_bwd_step) with
 * this harness moving the rows between the ranks exactly as each step's
 * transfer list says (the lists NCCL executes); every rank's dx, d router_w
 * and d logit_bias against the reference of its own tokens, and each held
 * expert's weight and bias gradients against the sum of the reference's
 * over the EP group's ranks (the tokens that reached it). Ragged and empty
 * experts (ranks of 1 and 5 tokens) and a rank with no tokens (its router
 * gradients zero), in exact and capacity dispatch.
 *
 * Usage: test_bwd_gpu [SPEC-FILTER...]  ("examples" selects the example
 * specs, "fsdp" the dp x fsdp mesh cases, "ep" the expert-parallel ones)
 * Tolerance: normalized L2 error <= 1.5e-2 for bf16, 4e-3 for fp16. */
#define _GNU_SOURCE
#include "check.h"
#include "driver.h"
#include "ep_bwd.h"
#include "ep_play.h"
#include "fsdp_grad.h"
#include "moe.h"
#include "moe_impl.h"
#include "moe_internal.h"
#include "pack_geom.h"
#include "plan.h"
#include "ref.h"
#include "spec.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *spec;
    int tokens[5], ntokens;
    int recompute;   /* recompute_u */
    int graph;       /* forward + backward captured in one CUDA graph, replayed on new inputs */
    int accumulate;  /* also check accumulate = 1 */
    const char *tuning; /* moe_options.tuning_path; NULL: the default table */
    int variants;       /* the GEMM variants that table plans for the spec (its entries of the spec's shape) */
} bwd_case_t;

static const bwd_case_t cases[] = {
    {"tests/specs/train_softmax.moe", {1, 37, 700}, 3, 0, 0, 1, NULL, 0},
    /* several GEMM variants (tests/tune/variants.tune: bm 64 below 64 tokens, 128 persist from 64, 128 tile
     * from 512): the training forward runs the variant of its size where its row block is the backward's
     * (100 tokens), else the capacity's (1, 63), and the backward reads its tile table */
    {"tests/specs/train_softmax.moe", {1, 63, 100, 511, 1024}, 5, 0, 0, 1, "tests/tune/variants.tune", 3},
    {"tests/specs/train_softmax.moe", {2, 100}, 2, 1, 1, 0, "tests/tune/variants.tune", 3},
    /* row blocks of 192 (below 512 tokens) and 256 (from 512, the capacity's: the dgrads' row block) on 3 and 4
     * consumer warpgroups (tests/tune/rowblock.tune) */
    {"tests/specs/train_softmax.moe", {1, 37, 700}, 3, 0, 0, 1, "tests/tune/rowblock.tune", 2},
    /* the backward GEMMs on the tuning table's backward entries (tests/tune/bwd.tune, bwd2.tune): dgrads on
     * the persist, ping-pong and one-CTA grids with bn 128 / 256, wgrads of 64 .. 256 rows on 1 .. 3 consumer
     * warpgroups, fp32 and dtype gradients, fp16 with biases and the clamp (train_gptoss) */
    {"tests/specs/train_softmax.moe", {1, 37, 700}, 3, 0, 0, 1, "tests/tune/bwd.tune", 1},
    {"tests/specs/train_softmax_hgrad.moe", {37, 700}, 2, 1, 1, 1, "tests/tune/bwd.tune", 1},
    {"tests/specs/train_softmax.moe", {5, 600}, 2, 0, 1, 1, "tests/tune/bwd2.tune", 1},
    {"tests/specs/train_softmax_hgrad.moe", {600}, 1, 1, 0, 1, "tests/tune/bwd2.tune", 1},
    {"tests/specs/train_gptoss.moe", {3, 333}, 2, 0, 0, 1, "tests/tune/bwd.tune", 1},
    {"tests/specs/train_softmax.moe", {700}, 1, 1, 0, 0, NULL, 0},
    {"tests/specs/train_softmax.moe", {256}, 1, 0, 1, 0, NULL, 0},
    {"tests/specs/train_gptoss.moe", {333}, 1, 0, 0, 1, NULL, 0},
    {"tests/specs/train_gptoss.moe", {3, 333}, 2, 1, 1, 0, NULL, 0},
    {"tests/specs/train_sigmoid_groups.moe", {5, 513}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_sigmoid_groups.moe", {513}, 1, 1, 0, 0, NULL, 0},
    {"tests/specs/sqrtsoftplus.moe", {3, 600}, 2, 0, 0, 1, NULL, 0},   /* DeepSeek-V4's sqrt(softplus) router */
    {"tests/specs/softcap.moe", {3, 600}, 2, 0, 0, 1, NULL, 0},        /* Laguna's logit cap, through the backward */
    {"tests/specs/train_input.moe", {2, 400}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_input.moe", {400}, 1, 1, 1, 0, NULL, 0},
    {"tests/specs/train_shared.moe", {3, 300}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_shared.moe", {300}, 1, 1, 1, 0, NULL, 0},
    {"tests/specs/train_given.moe", {3, 500}, 2, 0, 0, 1, NULL, 0},   /* the caller's ids: repeats, drops */
    {"tests/specs/train_given.moe", {500}, 1, 1, 1, 0, NULL, 0},
    /* Gemma 4's router: d router_x apart from dx, d expert_scale (the router kernel's dw·w', escale's sums) */
    {"tests/specs/train_own_input.moe", {3, 500}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_own_input.moe", {500}, 1, 1, 1, 0, NULL, 0},
    /* the gate's clamp after its unit: dgrad_down's activation gradient cut where silu(gate) > L (the shared
     * expert's slots at their own L) */
    {"tests/specs/train_clamp_after.moe", {3, 600}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_clamp_after.moe", {600}, 1, 1, 1, 0, NULL, 0},
    /* relu2: dgrad_down's gradient 2 relu(gate) on the gate columns, 0 on the unused up columns */
    {"tests/specs/train_relu2.moe", {3, 600}, 2, 0, 0, 1, NULL, 0},
    {"tests/specs/train_relu2.moe", {600}, 1, 1, 1, 0, NULL, 0},
    /* weight_grads = "dtype": dw1p and dw2 written (and accumulated) in bf16 / fp16 */
    {"tests/specs/train_softmax_hgrad.moe", {1, 37, 700}, 3, 0, 0, 1, NULL, 0},
    {"tests/specs/train_softmax_hgrad.moe", {256}, 1, 1, 1, 1, NULL, 0},
    {"tests/specs/train_gptoss_hgrad.moe", {3, 333}, 2, 0, 0, 1, NULL, 0},
};

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float unif(uint64_t *r) { return (float)((double)(splitmix(r) >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

static void fill(uint16_t *d, size_t n, float scale, uint64_t *r, moe_dtype_t dt) {
    for (size_t i = 0; i < n; i++)
        d[i] = moe_float_to_half(unif(r) * scale, dt);
}

static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, moe_cu_error_string(r));
    return 0;
}

static CUdeviceptr dalloc(size_t bytes) {
    CUdeviceptr d = 0;
    return cu_ok(moe_cu.cuMemAlloc(&d, bytes ? bytes : 256), "cuMemAlloc") ? d : 0;
}

static int up(CUdeviceptr d, const void *h, size_t n) { return cu_ok(moe_cu.cuMemcpyHtoD(d, h, n), "upload"); }
static int down(void *h, CUdeviceptr d, size_t n) { return cu_ok(moe_cu.cuMemcpyDtoH(h, d, n), "download"); }

/* normalized L2 error of got against want (NaN, the poison, fails) */
static double rel_err(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_close(const char *what, const float *got, const float *want, size_t n, double tol) {
    double e = rel_err(got, want, n);
    CHECKF(e <= tol, "%s: normalized L2 error %.3g > %.3g (n = %zu)", what, e, tol, n);
}

/* A sum's error is relative to the magnitudes of its terms, not to the sum: for one dot product that cancels
 * (the shared gate's dg with one token) the normalized error above says nothing. This one divides by the
 * norm of `scale`, each element the sum of the magnitudes of the terms of that element's sum. */
static void check_close_scaled(const char *what, const float *got, const float *want, const float *scale, size_t n,
                               double tol) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)scale[i] * scale[i];
    }
    const double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECKF(e <= tol, "%s: L2 error %.3g of the terms' magnitudes > %.3g (n = %zu)", what, e, tol, n);
}

static float *halves(const uint16_t *h, size_t n, moe_dtype_t dt) {
    float *f = malloc((n ? n : 1) * sizeof *f);
    for (size_t i = 0; f && i < n; i++)
        f[i] = moe_half_to_float(h[i], dt);
    return f;
}

/* ---- one layer ------------------------------------------------------------- */

typedef struct {
    moe_spec_t s;
    moe_plan *plan;
    int E, K, KE, S, H, F, FS, cap;   /* KE entries per token, S weight slots (the shared expert's after E) */
    uint16_t *x, *wr, *w1, *w1p, *w2, *b1, *b1p, *b2, *dy;
    uint16_t *ws1, *ws2, *wsg;       /* the shared expert, unsplit: [2F_s, H], [H, F_s], [H] */
    CUdeviceptr dwsg, gdsg;
    float *sel, *lb;
    int *gids;                       /* router.select = "given": the caller's ids [cap, K] (repeats; 1 in 16
                                      * out of range: dropped, no gradient) */
    CUdeviceptr dgids;
    uint16_t *rx;                    /* router.input = "separate": the router's own input [cap, H] */
    float *es;                       /* router.expert_scale: [E] */
    CUdeviceptr drx, des, gdrx, gdes; /* them on the device, and their gradients */
    /* device: inputs, y, the three buffers, the gradients, the unpacked ones */
    CUdeviceptr dx_in, dwr, dw1p, dw2, db1p, db2, dsel, dlb, ddy, dy_out, ws, saved, bws;
    CUdeviceptr gdx, gdwr, gdlb, gdw1p, gdb1p, gdw2, gdb2, pw1, pb1;
    size_t ws_bytes, saved_bytes, bws_bytes;
} layer_t;

/* Bytes of an element of L's weight gradients dw1p and dw2 (spec
 * weight_grads: 4, fp32; 2, the dtype); the other gradients are fp32. */
static size_t wg_bytes(const layer_t *L) {
    return (size_t)moe_wgrad_elem_bytes(&L->s);
}

/* n elements of eb bytes each (4: fp32; 2: L's dtype) at d, as floats. */
static int down_f(const layer_t *L, size_t eb, float *out, CUdeviceptr d, size_t n) {
    if (eb == 4)
        return down(out, d, 4 * n);
    uint16_t *h = malloc(2 * n + 2);
    int ok = h && down(h, d, 2 * n);
    for (size_t i = 0; ok && i < n; i++)
        out[i] = moe_half_to_float(h[i], L->s.dtype);
    free(h);
    return ok;
}

/* v as an element of eb bytes holds it (2: rounded to L's dtype). */
static float as_elem(const layer_t *L, size_t eb, float v) {
    return eb == 4 ? v : moe_half_to_float(moe_float_to_half(v, L->s.dtype), L->s.dtype);
}

/* n floats to d as elements of eb bytes (2: rounded to L's dtype). */
static int up_f(const layer_t *L, size_t eb, CUdeviceptr d, const float *in, size_t n) {
    if (eb == 4)
        return up(d, in, 4 * n);
    uint16_t *h = malloc(2 * n + 2);
    for (size_t i = 0; h && i < n; i++)
        h[i] = moe_float_to_half(in[i], L->s.dtype);
    int ok = h && up(d, h, 2 * n);
    free(h);
    return ok;
}

static void layer_free(layer_t *L) {
    free(L->x); free(L->wr); free(L->w1); free(L->w1p); free(L->w2); free(L->b1); free(L->b1p); free(L->b2);
    free(L->dy); free(L->sel); free(L->lb); free(L->ws1); free(L->ws2); free(L->wsg); free(L->gids);
    free(L->rx); free(L->es);
    CUdeviceptr ext[] = {L->dgids, L->drx, L->des, L->gdrx, L->gdes};
    for (size_t i = 0; i < sizeof ext / sizeof *ext; i++)
        if (ext[i])
            moe_cu.cuMemFree(ext[i]);
    if (L->dwsg)
        moe_cu.cuMemFree(L->dwsg);
    if (L->gdsg)
        moe_cu.cuMemFree(L->gdsg);
    CUdeviceptr d[] = {L->dx_in, L->dwr, L->dw1p, L->dw2, L->db1p, L->db2, L->dsel, L->dlb, L->ddy, L->dy_out,
                       L->ws, L->saved, L->bws, L->gdx, L->gdwr, L->gdlb, L->gdw1p, L->gdb1p, L->gdw2, L->gdb2,
                       L->pw1, L->pb1};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i])
            moe_cu.cuMemFree(d[i]);
    moe_plan_destroy(L->plan);
}

static int layer_init(layer_t *L, uint64_t *r) {
    const moe_spec_t *s = &L->s;
    const size_t E = s->experts, H = s->hidden, F = s->ffn, T = s->tokens, FS = s->shared.ffn;
    const size_t S = (size_t)moe_spec_slots(s); /* the device weights and gradients span every slot */
    moe_dtype_t dt = s->dtype;
    L->E = (int)E, L->K = s->top_k, L->KE = moe_spec_entries(s), L->S = (int)S, L->H = (int)H, L->F = (int)F;
    L->FS = (int)FS, L->cap = (int)T;
    L->x = malloc(T * H * 2);
    L->dy = malloc(T * H * 2);
    L->wr = malloc(E * H * 2);
    L->w1 = malloc(E * 2 * F * H * 2);
    L->w1p = malloc(S * 2 * F * H * 2);
    L->w2 = malloc(S * H * F * 2);
    L->b1 = malloc(E * 2 * F * 2);
    L->b1p = malloc(E * 2 * F * 2);
    L->b2 = malloc(E * H * 2);
    L->sel = malloc(E * 4);
    L->lb = malloc(E * 4);
    if (!L->x || !L->dy || !L->wr || !L->w1 || !L->w1p || !L->w2 || !L->b1 || !L->b1p || !L->b2 || !L->sel || !L->lb)
        return 0;
    fill(L->wr, E * H, 4.0f / sqrtf((float)H), r, dt);
    fill(L->w1, E * 2 * F * H, 2.0f / sqrtf((float)H), r, dt);
    fill(L->w2, E * H * F, 2.0f / sqrtf((float)F), r, dt);
    fill(L->b1, E * 2 * F, 0.5f, r, dt);
    fill(L->b2, E * H, 0.5f, r, dt);
    for (size_t e = 0; e < E; e++) {
        L->sel[e] = unif(r) * 0.1f;
        L->lb[e] = unif(r);
    }
    if (moe_plan_pack_w1(L->plan, L->w1, L->w1p) != MOE_OK || moe_plan_pack_b1(L->plan, L->b1, L->b1p) != MOE_OK)
        return 0;
    if (s->router.select == MOE_SELECT_GIVEN) {
        const size_t n = T * (size_t)s->top_k;
        if (!(L->gids = malloc(n * sizeof(int))) || !(L->dgids = dalloc(n * sizeof(int))))
            return 0;
        for (size_t i = 0; i < n; i++) {
            const float u = unif(r);   /* [-1, 1) */
            L->gids[i] = u < -0.875f ? (i % 2 ? -1 : (int)E) : (int)((unif(r) + 1.0f) * 0.5f * (float)E) % (int)E;
        }
        if (!up(L->dgids, L->gids, n * sizeof(int)))
            return 0;
    }
    if (s->router.input == MOE_ROUTER_INPUT_SEPARATE) { /* rows of their own, and d router_x's buffer */
        if (!(L->rx = malloc(T * H * 2)) || !(L->drx = dalloc(T * H * 2)) || !(L->gdrx = dalloc(T * H * 2)))
            return 0;
        fill(L->rx, T * H, 1.0f, r, dt);
        if (!up(L->drx, L->rx, T * H * 2))
            return 0;
    }
    if (s->router.expert_scale) { /* Gemma 4's per_expert_scale: in [0.5, 1.5) */
        if (!(L->es = malloc(E * 4)) || !(L->des = dalloc(E * 4)) || !(L->gdes = dalloc(E * 4)))
            return 0;
        for (size_t e = 0; e < E; e++)
            L->es[e] = 1.0f + 0.5f * unif(r);
        if (!up(L->des, L->es, E * 4))
            return 0;
    }
    if (FS) { /* the shared expert into slots E.. of w1p and w2 */
        L->ws1 = malloc(2 * FS * H * 2);
        L->ws2 = malloc(H * FS * 2);
        L->wsg = malloc(H * 2);
        if (!L->ws1 || !L->ws2 || !L->wsg)
            return 0;
        fill(L->ws1, 2 * FS * H, 2.0f / sqrtf((float)H), r, dt);
        fill(L->ws2, H * FS, 2.0f / sqrtf((float)FS), r, dt);
        fill(L->wsg, H, 2.0f / sqrtf((float)H), r, dt);
        if (moe_plan_pack_shared(L->plan, L->ws1, L->ws2, L->w1p, L->w2) != MOE_OK)
            return 0;
        if (!(L->dwsg = dalloc(H * 2)) || !(L->gdsg = dalloc(H * 4)) || !up(L->dwsg, L->wsg, H * 2))
            return 0;
    }
    L->ws_bytes = moe_plan_train_workspace_size(L->plan, (int)T); /* exactly the training forward's own (poisoned) */
    L->saved_bytes = moe_plan_saved_size(L->plan, (int)T, 0); /* the larger of the two choices */
    L->bws_bytes = moe_plan_backward_workspace_size(L->plan, (int)T, 1);
    CUdeviceptr *all[] = {&L->dx_in, &L->dwr, &L->dw1p, &L->dw2, &L->db1p, &L->db2, &L->dsel, &L->dlb, &L->ddy,
                          &L->dy_out, &L->ws, &L->saved, &L->bws, &L->gdx, &L->gdwr, &L->gdlb, &L->gdw1p, &L->gdb1p,
                          &L->gdw2, &L->gdb2, &L->pw1, &L->pb1};
    size_t bytes[] = {T * H * 2, E * H * 2, S * 2 * F * H * 2, S * H * F * 2, E * 2 * F * 2, E * H * 2, E * 4, E * 4,
                      T * H * 2, T * H * 2, L->ws_bytes, L->saved_bytes, L->bws_bytes, T * H * 2, E * H * 4, E * 4,
                      S * 2 * F * H * 4, E * 2 * F * 4, S * H * F * 4, E * H * 4, S * 2 * F * H * 4, E * 2 * F * 4};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!(*all[i] = dalloc(bytes[i])))
            return 0;
    return up(L->dwr, L->wr, E * H * 2) && up(L->dw1p, L->w1p, S * 2 * F * H * 2) && up(L->dw2, L->w2, S * H * F * 2) &&
           up(L->db1p, L->b1p, E * 2 * F * 2) && up(L->db2, L->b2, E * H * 2) && up(L->dsel, L->sel, E * 4) &&
           up(L->dlb, L->lb, E * 4);
}

static moe_train_forward_args fwd_args(const layer_t *L, int T, int recompute) {
    return (moe_train_forward_args){
        .fwd = {.tokens = T, .x = (void *)L->dx_in, .router_w = (void *)L->dwr,
                .router_bias = L->s.router.bias ? (float *)L->dsel : NULL,
                .router_logit_bias = L->s.router.logit_bias ? (float *)L->dlb : NULL, .w1p = (void *)L->dw1p,
                .b1p = L->s.ffn_bias ? (void *)L->db1p : NULL, .w2 = (void *)L->dw2,
                .b2 = L->s.ffn_bias ? (void *)L->db2 : NULL, .y = (void *)L->dy_out, .workspace = (void *)L->ws,
                .shared_gate = (void *)L->dwsg, .topk_ids = (const int *)L->dgids, .router_x = (void *)L->drx,
                .router_expert_scale = (const float *)L->des},
        .saved = (void *)L->saved,
        .recompute_u = recompute};
}

static moe_backward_args bwd_args(const layer_t *L, int T, int recompute, int accumulate) {
    return (moe_backward_args){
        .tokens = T, .recompute_u = recompute, .saved = (void *)L->saved, .x = (void *)L->dx_in,
        .router_w = (void *)L->dwr, .w1p = (void *)L->dw1p, .b1p = L->s.ffn_bias ? (void *)L->db1p : NULL,
        .w2 = (void *)L->dw2, .b2 = L->s.ffn_bias ? (void *)L->db2 : NULL, .dy = (void *)L->ddy,
        .workspace = (void *)L->bws, .accumulate = accumulate, .dx = (void *)L->gdx, .d_router_w = (float *)L->gdwr,
        .d_logit_bias = L->s.router.logit_bias ? (float *)L->gdlb : NULL, .dw1p = (void *)L->gdw1p,
        .db1p = L->s.ffn_bias ? (float *)L->gdb1p : NULL, .dw2 = (void *)L->gdw2,
        .db2 = L->s.ffn_bias ? (float *)L->gdb2 : NULL, .shared_gate = (void *)L->dwsg,
        .d_shared_gate = (float *)L->gdsg, .router_x = (void *)L->drx, .router_expert_scale = (const float *)L->des,
        .d_router_x = (void *)L->gdrx, .d_expert_scale = (float *)L->gdes};
}

/* Poison what the pair writes: y, the three buffers, every gradient. */
static int poison(const layer_t *L) {
    const size_t E = L->E, S = L->S, H = L->H, F = L->F, T = L->cap;
    CUdeviceptr d[] = {L->dy_out, L->ws, L->saved, L->bws, L->gdx, L->gdwr, L->gdlb, L->gdw1p, L->gdb1p, L->gdw2,
                       L->gdb2, L->pw1, L->pb1, L->gdsg, L->gdrx, L->gdes};
    size_t n[] = {T * H * 2, L->ws_bytes, L->saved_bytes, L->bws_bytes, T * H * 2, E * H * 4, E * 4,
                  S * 2 * F * H * 4, E * 2 * F * 4, S * H * F * 4, E * H * 4, S * 2 * F * H * 4, E * 2 * F * 4, H * 4,
                  T * H * 2, E * 4};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        if (d[i] && !cu_ok(moe_cu.cuMemsetD8(d[i], 0xff, n[i]), "poison"))
            return 0;
    return cu_ok(moe_cu.cuCtxSynchronize(), "poison");
}

/* The training forward and the backward at T on stream st (accumulate 0). */
static moe_status run_pair(const layer_t *L, int T, int recompute, CUstream st) {
    moe_train_forward_args fa = fwd_args(L, T, recompute);
    moe_backward_args ba = bwd_args(L, T, recompute, 0);
    moe_status rc = moe_forward_train(L->plan, &fa, st);
    CHECKF(rc == MOE_OK, "moe_forward_train: %s: %s", moe_status_string(rc), moe_last_error());
    if (rc)
        return rc;
    rc = moe_backward(L->plan, &ba, st);
    CHECKF(rc == MOE_OK, "moe_backward: %s: %s", moe_status_string(rc), moe_last_error());
    return rc;
}

/* The pair captured into a CUDA graph on a stream of its own (made once per
 * (case, tokens) and replayed by run_graph). */
typedef struct {
    CUstream st;
    CUgraph g;
    CUgraphExec ge;
} graph_t;

static int graph_make(graph_t *G, const layer_t *L, int T, int recompute) {
    memset(G, 0, sizeof *G);
    if (!cu_ok(moe_cu.cuStreamCreate(&G->st, CU_STREAM_NON_BLOCKING), "stream") ||
        !cu_ok(moe_cu.cuStreamBeginCapture(G->st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture"))
        return 0;
    moe_status rc = run_pair(L, T, recompute, G->st);
    int ok = cu_ok(moe_cu.cuStreamEndCapture(G->st, &G->g), "end capture") && rc == MOE_OK;
    return ok && cu_ok(moe_cu.cuGraphInstantiateWithFlags(&G->ge, G->g, 0), "instantiate");
}

static void graph_free(graph_t *G) {
    if (G->ge)
        moe_cu.cuGraphExecDestroy(G->ge);
    if (G->g)
        moe_cu.cuGraphDestroy(G->g);
    if (G->st)
        moe_cu.cuStreamDestroy(G->st);
}

/* Download a region of the saved region (backward 0) or the backward's
 * workspace (1) at T. */
static void *region(const layer_t *L, int backward, int T, int recompute, const char *name) {
    size_t off, n;
    if (moe_plan_saved_region(L->plan, backward, T, recompute, name, &off, &n) != MOE_OK)
        return NULL;
    void *h = malloc(n ? n : 1);
    if (h && !down(h, (backward ? L->bws : L->saved) + off, n)) {
        free(h);
        return NULL;
    }
    return h;
}

/* Tokens whose GPU expert set (saved topk_idx) differs from the reference's:
 * bad[t] = 1; ref_k[t*K + k] = the reference's entry of the GPU's entry k
 * (-1 for a bad token). Returns how many. */
static int route_diff(const layer_t *L, int T, const int *gidx, const int *ridx, unsigned char *bad, int *ref_k) {
    const int K = L->K, KE = L->KE; /* the GPU's tables have KE entries per token, the routed K first */
    int n = 0;
    for (int t = 0; t < T; t++) {
        bad[t] = 0;
        for (int k = 0; k < K && L->gids; k++) { /* given routing: entry for entry (repeats, drops at 0) */
            ref_k[t * K + k] = k;
            bad[t] |= ridx[t * K + k] != gidx[t * KE + k];
        }
        for (int k = 0; k < K && !L->gids; k++) {
            int m = -1;
            for (int j = 0; j < K; j++)
                if (ridx[t * K + j] == gidx[t * KE + k])
                    m = j;
            ref_k[t * K + k] = m;
            bad[t] |= m < 0;
        }
        n += bad[t];
    }
    return n;
}

/* Per-row stage values: the GPU's rows (through row_of, packed columns
 * unpacked when packed) against the reference's rows t*K + ref_k. */
static void check_rows(const char *what, const layer_t *L, int T, const int *row_of, const int *ref_k,
                       const unsigned char *bad, const uint16_t *gpu, const float *ref, int cols, int packed,
                       double tol) {
    const int K = L->K, KE = L->KE; /* the routed entries; the reference's stages have no shared rows */
    size_t n = 0;
    float *g = malloc(sizeof(float) * (size_t)T * K * cols), *w = malloc(sizeof(float) * (size_t)T * K * cols);
    for (int t = 0; g && w && t < T; t++)
        for (int k = 0; !bad[t] && k < K; k++) {
            const long long row = row_of[t * KE + k], rr = (long long)t * K + ref_k[t * K + k];
            for (int c = 0; c < cols; c++) {
                const long long pc = packed ? moe_pack_row(c, L->F) : c; /* plain column c's packed column */
                g[n] = moe_half_to_float(gpu[row * cols + pc], L->s.dtype);
                w[n++] = ref[rr * cols + c];
            }
        }
    if (g && w)
        check_close(what, g, w, n, tol);
    free(g);
    free(w);
}

/* ---- one (case, tokens) ----------------------------------------------------- */

/* The backward's weight gradients of layer L (d 0 where the spec has
 * none), n elements of eb bytes each (dw1p and dw2: wg_bytes; the others
 * fp32): what accumulate = 1 adds into. */
typedef struct {
    CUdeviceptr d;
    size_t n, eb;
    const char *what;
} grad_buf_t;
enum { NWGRADS = 7 };
static void weight_grads(const layer_t *L, grad_buf_t g[NWGRADS]) {
    const moe_spec_t *s = &L->s;
    const size_t E = L->E, S = L->S, H = L->H, F = L->F, wb = wg_bytes(L);
    const grad_buf_t all[NWGRADS] = {
        {L->gdwr, E * H, 4, "d router_w"}, {L->gdw1p, S * 2 * F * H, wb, "dw1p"}, {L->gdw2, S * H * F, wb, "dw2"},
        {s->router.logit_bias ? L->gdlb : 0, E, 4, "d logit_bias"},
        {s->ffn_bias ? L->gdb1p : 0, E * 2 * F, 4, "db1p"}, {s->ffn_bias ? L->gdb2 : 0, E * H, 4, "db2"},
        {moe_spec_router_columns(s) > (int)E ? L->gdsg : 0, H, 4, "d w_gate"}};
    memcpy(g, all, sizeof all);
}

/* A save case's pair has just run (accumulate 0): its saved region holds U.
 * The backward again with recompute_u = 1 on the same saved region (U is its
 * last region, so every other region sits where recompute's layout puts it;
 * the mismatch with the forward's choice is deliberate) recomputes U with
 * the forward's own up GEMM on the same rows: the recomputed U must be the
 * saved one bit for bit, and so must every gradient (the backward has no
 * atomics: docs/DESIGN.md, "Backward"). */
static void check_recompute_same(const layer_t *L, int T, const char *label) {
    const size_t H = L->H, F = L->F, KE = L->KE;
    char name[300];
    snprintf(name, sizeof name, "backward: %s/T%d, recompute_u = 1 on the saved rows: the same bits", label, T);
    CASE(name);
    /* dx, then the weight gradients */
    grad_buf_t gr[1 + NWGRADS] = {{L->gdx, (size_t)T * H, 2, "dx"}};
    weight_grads(L, gr + 1);
    enum { NG = 1 + NWGRADS };
    unsigned char *first[NG] = {0}, *again = NULL;
    int good = 1;
    for (int i = 0; i < NG && good; i++)
        if (gr[i].d)
            good = (first[i] = malloc(gr[i].eb * gr[i].n)) && down(first[i], gr[i].d, gr[i].eb * gr[i].n) &&
                   cu_ok(moe_cu.cuMemsetD8(gr[i].d, 0xff, gr[i].eb * gr[i].n), "poison");
    good = good && cu_ok(moe_cu.cuMemsetD8(L->bws, 0xff, L->bws_bytes), "poison");
    moe_backward_args ba = bwd_args(L, T, 1, 0);
    moe_status rc = good ? moe_backward(L->plan, &ba, NULL) : MOE_ERR_CUDA;
    CHECKF(good && rc == MOE_OK, "moe_backward (recompute_u = 1): %s: %s", moe_status_string(rc), moe_last_error());
    if (good && rc == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "recompute")) {
        int *row_of = region(L, 0, T, 0, "row_of");
        uint16_t *saved_u = region(L, 0, T, 0, "u"), *re_u = region(L, 1, T, 1, "u");
        CHECKF(row_of && saved_u && re_u, "reading U back");
        size_t diff = 0, n = 0;
        for (size_t i = 0; row_of && saved_u && re_u && i < (size_t)T * KE; i++, n++)
            diff += memcmp(saved_u + (size_t)row_of[i] * 2 * F, re_u + (size_t)row_of[i] * 2 * F, 4 * F) != 0;
        CHECKF(diff == 0, "U: %zu of %zu rows differ between the saved and the recomputed", diff, n);
        free(row_of);
        free(saved_u);
        free(re_u);
        for (int i = 0; i < NG; i++) {
            if (!gr[i].d)
                continue;
            again = malloc(gr[i].eb * gr[i].n);
            CHECKF(again && down(again, gr[i].d, gr[i].eb * gr[i].n) &&
                       memcmp(again, first[i], gr[i].eb * gr[i].n) == 0,
                   "%s differs between recompute_u = 0 and 1", gr[i].what);
            free(again);
        }
    }
    for (int i = 0; i < NG; i++)
        free(first[i]);
}

static void run_tokens(layer_t *L, const bwd_case_t *c, int T, uint64_t *rng, const char *label) {
    const moe_spec_t *s = &L->s;
    const int E = L->E, K = L->K, KE = L->KE, S = L->S, H = L->H, F = L->F, FS = L->FS;
    const int EL = moe_spec_router_columns(s); /* d logits columns: a sigmoid shared gate's is column E */
    const moe_dtype_t dt = s->dtype;
    const double tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    char name[256];
    snprintf(name, sizeof name, "backward: %s/T%d", label, T);
    CASE(name);
    fill(L->x, (size_t)T * H, 1.0f, rng, dt);
    fill(L->dy, (size_t)T * H, 1.0f, rng, dt);
    if (!up(L->dx_in, L->x, (size_t)T * H * 2) || !up(L->ddy, L->dy, (size_t)T * H * 2) || !poison(L)) {
        CHECKF(0, "cannot set up the inputs");
        return;
    }
    graph_t G = {0};
    int ok = 1;
    if (c->graph) { /* captured once, then x, dy new and everything poisoned again, replayed */
        ok = graph_make(&G, L, T, c->recompute);
        fill(L->x, (size_t)T * H, 1.0f, rng, dt);
        fill(L->dy, (size_t)T * H, 1.0f, rng, dt);
        ok = ok && up(L->dx_in, L->x, (size_t)T * H * 2) && up(L->ddy, L->dy, (size_t)T * H * 2) && poison(L) &&
             cu_ok(moe_cu.cuGraphLaunch(G.ge, G.st), "replay") && cu_ok(moe_cu.cuStreamSynchronize(G.st), "replay");
    } else {
        ok = run_pair(L, T, c->recompute, NULL) == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "pair");
    }
    if (!ok) {
        CHECKF(0, "the pair did not run");
        graph_free(&G);
        return;
    }
    if (L->gids) { /* given routing: the training forward counted its dropped ids in saved's counts */
        long long want = 0, got = -1;
        for (long long i = 0; i < (long long)T * K; i++)
            want += L->gids[i] < 0 || L->gids[i] >= L->E;
        const moe_status re = moe_plan_routing_errors(L->plan, (void *)L->saved, NULL, &got);
        CHECKF(got == want && (re == MOE_OK) == (want == 0), "moe_plan_routing_errors(saved): %lld, %lld dropped",
               got, want);
    }
    /* the reference's routing; tokens that differ get dy = 0 and the pair runs again */
    moe_ref_inputs_t in = {.x = L->x, .wr = L->wr, .w1 = L->w1, .w2 = L->w2, .b1 = L->b1, .b2 = L->b2,
                           .sel_bias = L->sel, .logit_bias = L->lb, .tokens = T, .ws1 = L->ws1, .ws2 = L->ws2,
                           .wsg = L->wsg, .given_ids = L->gids, .router_x = L->rx, .expert_scale = L->es};
    int *ridx = malloc(sizeof(int) * T * K), *ref_k = malloc(sizeof(int) * T * K);
    float *rw = malloc(sizeof(float) * T * K);
    unsigned char *bad = malloc((size_t)T);
    int *gidx = region(L, 0, T, c->recompute, "topk_idx");
    if (!ridx || !ref_k || !rw || !bad || !gidx || moe_ref_route(s, &in, ridx, rw, NULL)) {
        CHECKF(0, "routing the reference");
        goto out;
    }
    int nbad = route_diff(L, T, gidx, ridx, bad, ref_k);
    CHECKF(nbad * 20 <= T + 20, "%d of %d tokens route to other experts than the reference's", nbad, T);
    if (nbad) {
        for (int t = 0; t < T; t++)
            if (bad[t])
                memset(L->dy + (size_t)t * H, 0, (size_t)H * 2);
        ok = up(L->ddy, L->dy, (size_t)T * H * 2) && poison(L);
        ok = ok && (c->graph ? cu_ok(moe_cu.cuGraphLaunch(G.ge, G.st), "replay") &&
                                   cu_ok(moe_cu.cuStreamSynchronize(G.st), "replay")
                             : run_pair(L, T, c->recompute, NULL) == MOE_OK &&
                                   cu_ok(moe_cu.cuCtxSynchronize(), "pair"));
        free(gidx);
        gidx = region(L, 0, T, c->recompute, "topk_idx");
        CHECKF(ok && gidx && route_diff(L, T, gidx, ridx, bad, ref_k) == nbad, "the second run routes otherwise");
        if (!ok || !gidx)
            goto out;
    }

    /* the reference's backward, rounded mode, with its stages */
    const size_t TK = (size_t)T * K;
    moe_ref_grads_t rg = {0};
    moe_ref_bwd_stages_t rs = {0};
    float *ref_buf[] = {rg.dx = malloc(4 * (size_t)T * H), rg.dwr = malloc(4 * (size_t)E * H),
                        rg.dw1 = malloc(4 * (size_t)E * 2 * F * H), rg.db1 = malloc(4 * (size_t)E * 2 * F),
                        rg.dw2 = malloc(4 * (size_t)E * H * F), rg.db2 = malloc(4 * (size_t)E * H),
                        rg.dlogit_bias = malloc(4 * (size_t)E), rs.u = malloc(4 * TK * 2 * F),
                        rs.a = malloc(4 * TK * F), rs.o = malloc(4 * TK * H), rs.dys = malloc(4 * TK * H),
                        rs.du = malloc(4 * TK * 2 * F), rs.dxs = malloc(4 * TK * H), rs.dw = malloc(4 * TK),
                        rs.dlogits = malloc(4 * (size_t)T * E), rs.shared_g = malloc(4 * (size_t)T + 4),
                        rs.shared_dg = malloc(4 * (size_t)T + 4), rs.shared_dg_abs = malloc(4 * (size_t)T + 4), rg.dws1 = malloc(4 * (size_t)2 * FS * H + 4),
                        rg.dws2 = malloc(4 * (size_t)H * FS + 4), rg.dwsg = malloc(4 * (size_t)H),
                        rg.d_router_x = malloc(4 * (size_t)T * H), rg.d_expert_scale = malloc(4 * (size_t)E)};
    int have = 1;
    for (size_t i = 0; i < sizeof ref_buf / sizeof *ref_buf; i++)
        have &= ref_buf[i] != NULL;
    if (!FS) /* the shared expert's outputs only with one */
        rs.shared_g = rs.shared_dg = rs.shared_dg_abs = rg.dws1 = rg.dws2 = rg.dwsg = NULL;
    if (!have || moe_ref_backward(s, &in, L->dy, 0, &rg, &rs)) {
        CHECKF(0, "the reference's backward");
        goto free_ref;
    }

    /* gradients */
    {
        uint16_t *hdx = malloc((size_t)T * H * 2);
        float *g = malloc(4 * (size_t)S * 2 * F * H);
        if (!hdx || !g) {
            CHECKF(0, "out of memory");
        } else {
            float *fdx = down(hdx, L->gdx, (size_t)T * H * 2) ? halves(hdx, (size_t)T * H, dt) : NULL;
            if (fdx)
                check_close("dx", fdx, rg.dx, (size_t)T * H, tol);
            free(fdx);
            if (down(g, L->gdwr, 4 * (size_t)E * H))
                check_close("d router_w", g, rg.dwr, (size_t)E * H, tol);
            if (L->rx) { /* the router's term of the input gradient, apart from dx */
                float *frx = down(hdx, L->gdrx, (size_t)T * H * 2) ? halves(hdx, (size_t)T * H, dt) : NULL;
                CHECKF(frx != NULL, "reading d router_x back");
                if (frx)
                    check_close("d router_x", frx, rg.d_router_x, (size_t)T * H, tol);
                free(frx);
            }
            if (L->es && down(g, L->gdes, 4 * (size_t)E))
                check_close("d expert_scale", g, rg.d_expert_scale, E, tol);
            if (s->router.logit_bias && down(g, L->gdlb, 4 * (size_t)E))
                check_close("d logit_bias", g, rg.dlogit_bias, E, tol);
            moe_status us = moe_plan_unpack_grad(L->plan, MOE_TENSOR_W1, (void *)L->gdw1p, (void *)L->pw1, S, NULL);
            CHECKF(us == MOE_OK, "moe_plan_unpack_grad: %s", moe_last_error());
            if (us == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "unpack") &&
                down_f(L, wg_bytes(L), g, L->pw1, (size_t)S * 2 * F * H)) {
                check_close("dW1 (dw1p unpacked)", g, rg.dw1, (size_t)E * 2 * F * H, tol);
                if (FS) { /* the shared slots joined: slot j's plain row r is the unsplit row moe_plan_shared_w1_row */
                    float *j1 = malloc(4 * (size_t)2 * FS * H);
                    for (int j = 0; j1 && j < S - E; j++)
                        for (int r2 = 0; r2 < 2 * F; r2++)
                            memcpy(j1 + moe_plan_shared_w1_row(s, j, r2) * H, g + ((size_t)(E + j) * 2 * F + r2) * H,
                                   4 * (size_t)H);
                    if (j1)
                        check_close("the shared expert's dW1 (its slots joined)", j1, rg.dws1, (size_t)2 * FS * H, tol);
                    free(j1);
                }
            }
            if (down_f(L, wg_bytes(L), g, L->gdw2, (size_t)S * H * F)) {
                check_close("dW2", g, rg.dw2, (size_t)E * H * F, tol);
                if (FS) { /* slot E + j's column f is the unsplit column jF + f */
                    float *j2 = malloc(4 * (size_t)H * FS);
                    for (int j = 0; j2 && j < S - E; j++)
                        for (int h = 0; h < H; h++)
                            memcpy(j2 + (size_t)h * FS + (size_t)j * F, g + ((size_t)(E + j) * H + h) * F, 4 * (size_t)F);
                    if (j2)
                        check_close("the shared expert's dW2 (its slots joined)", j2, rg.dws2, (size_t)H * FS, tol);
                    free(j2);
                }
            }
            if (EL > E && down(g, L->gdsg, 4 * (size_t)H)) {
                /* Σ_t dz[t]·x[t]: each dz one dot product of T = 1's kind (check_close_scaled) */
                float *sc = calloc((size_t)H, sizeof *sc);
                for (int t = 0; sc && t < T; t++) {
                    const double gz = rs.shared_dg_abs[t] * rs.shared_g[t] * (1 - rs.shared_g[t]);
                    for (int h = 0; h < H; h++)
                        sc[h] += (float)(gz * fabs(moe_half_to_float(L->x[(size_t)t * H + h], dt)));
                }
                if (sc)
                    check_close_scaled("d w_gate", g, rg.dwsg, sc, H, tol);
                free(sc);
            }
            if (s->ffn_bias) {
                us = moe_plan_unpack_grad(L->plan, MOE_TENSOR_B1, (void *)L->gdb1p, (void *)L->pb1, E, NULL);
                CHECKF(us == MOE_OK, "moe_plan_unpack_grad: %s", moe_last_error());
                if (us == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "unpack") && down(g, L->pb1, 4 * (size_t)E * 2 * F))
                    check_close("db1 (db1p unpacked)", g, rg.db1, (size_t)E * 2 * F, tol);
                if (down(g, L->gdb2, 4 * (size_t)E * H))
                    check_close("db2", g, rg.db2, (size_t)E * H, tol);
            }
        }
        free(hdx);
        free(g);
    }

    /* stages, row by row */
    {
        int *row_of = region(L, 0, T, c->recompute, "row_of");
        uint16_t *u = region(L, c->recompute, T, c->recompute, "u"), *a = region(L, 0, T, c->recompute, "hbuf");
        uint16_t *o = region(L, 0, T, c->recompute, "out"), *dys = region(L, 1, T, c->recompute, "dys");
        uint16_t *du = region(L, 1, T, c->recompute, "du"), *dxs = region(L, 1, T, c->recompute, "dxs");
        float *dw = region(L, 1, T, c->recompute, "dw"), *dl = region(L, 1, T, c->recompute, "dlogits");
        if (!row_of || !u || !a || !o || !dys || !du || !dxs || !dw || !dl) {
            CHECKF(0, "reading the stages back");
        } else {
            check_rows(c->recompute ? "U (recomputed)" : "U (saved)", L, T, row_of, ref_k, bad, u, rs.u, 2 * F, 1,
                       tol);
            check_rows("A", L, T, row_of, ref_k, bad, a, rs.a, F, 0, tol);
            check_rows("O", L, T, row_of, ref_k, bad, o, rs.o, H, 0, tol);
            check_rows("dys", L, T, row_of, ref_k, bad, dys, rs.dys, H, 0, tol);
            check_rows("dU", L, T, row_of, ref_k, bad, du, rs.du, 2 * F, 1, tol);
            check_rows("dXs", L, T, row_of, ref_k, bad, dxs, rs.dxs, H, 0, tol);
            float *g = malloc(4 * (size_t)T * KE), *w = malloc(4 * (size_t)T * KE);
            size_t n = 0;
            for (int t = 0; g && w && t < T; t++)
                for (int k = 0; !bad[t] && k < K; k++) {
                    const int j = t * K + ref_k[t * K + k];
                    g[n] = dw[t * KE + k];   /* with expert scales the router kernel left dw·w' there */
                    w[n++] = L->es ? rs.dw[j] * (rw[j] / L->es[ridx[j]]) : rs.dw[j];
                }
            if (g && w)
                check_close("dw", g, w, n, tol);
            float *gl = malloc(4 * (size_t)T * E + 4), *gz = malloc(4 * (size_t)T + 4), *wz = malloc(4 * (size_t)T + 4);
            for (int t = 0; gl && t < T; t++)
                memcpy(gl + (size_t)t * E, dl + (size_t)t * EL, 4 * (size_t)E);
            if (gl)
                check_close("d logits", gl, rs.dlogits, (size_t)T * E, tol);
            /* the shared entries: Σ_j dw = dg; the gate's column: dz = dg g (1 - g). An ungated shared expert
             * under router.apply = "input" (Llama 4) has no dg: its entries' weight is the constant 1 that
             * permute scales its input by, their dw the input-side <x, dXs> no kernel reads (spec_check
             * refuses a gate with "input"), while the reference's dg is the output-side <dy, O>. */
            const int shared_dg = EL > E || s->router.apply != MOE_APPLY_INPUT;
            if (FS && shared_dg && g && w && gz && wz) {
                /* each dg one dot product <dy, O_shared>: judged against its terms' magnitudes */
                float *sa = malloc(4 * (size_t)T + 4), *sz = malloc(4 * (size_t)T + 4);
                n = 0;
                for (int t = 0; sa && sz && t < T; t++) {
                    g[n] = 0;
                    for (int j = K; j < KE; j++)
                        g[n] += dw[t * KE + j];
                    w[n] = rs.shared_dg[t];
                    sa[n++] = rs.shared_dg_abs[t];
                    gz[t] = EL > E ? dl[(size_t)t * EL + E] : 0;
                    wz[t] = rs.shared_dg[t] * rs.shared_g[t] * (1 - rs.shared_g[t]);
                    sz[t] = rs.shared_dg_abs[t] * rs.shared_g[t] * (1 - rs.shared_g[t]);
                }
                CHECKF(sa && sz, "out of memory");
                if (sa && sz) {
                    check_close_scaled("the shared expert's dg (its entries' dw)", g, w, sa, n, tol);
                    if (EL > E)
                        check_close_scaled("d logits, the shared gate's column", gz, wz, sz, (size_t)T, tol);
                }
                free(sa); free(sz);
            }
            free(gl); free(gz); free(wz);
            free(g);
            free(w);
        }
        free(row_of); free(u); free(a); free(o); free(dys); free(du); free(dxs); free(dw); free(dl);
    }

    if (!c->recompute)
        check_recompute_same(L, T, label);

    /* accumulate = 1: the weight gradients add into random priors; dx is written */
    if (c->accumulate) {
        snprintf(name, sizeof name, "backward accumulate: %s/T%d", label, T);
        CASE(name);
        grad_buf_t gr[NWGRADS];
        weight_grads(L, gr);
        enum { NG = NWGRADS };
        float *first[NG] = {0}, *prior[NG] = {0};
        uint16_t *dx0 = malloc((size_t)T * H * 2), *dx1 = malloc((size_t)T * H * 2);
        int good = dx0 && dx1 && down(dx0, L->gdx, (size_t)T * H * 2);
        for (int i = 0; i < NG && good; i++) {
            if (!gr[i].d)
                continue;
            first[i] = malloc(4 * gr[i].n);
            prior[i] = malloc(4 * gr[i].n);
            good = first[i] && prior[i] && down_f(L, gr[i].eb, first[i], gr[i].d, gr[i].n);
            for (size_t j = 0; good && j < gr[i].n; j++) /* what the buffer will hold: rounded as its elements */
                prior[i][j] = as_elem(L, gr[i].eb, unif(rng));
            good = good && up_f(L, gr[i].eb, gr[i].d, prior[i], gr[i].n);
        }
        moe_backward_args ba = bwd_args(L, T, c->recompute, 1);
        good = good && cu_ok(moe_cu.cuMemsetD8(L->gdx, 0xff, (size_t)T * H * 2), "poison dx");
        moe_status rc = good ? moe_backward(L->plan, &ba, NULL) : MOE_ERR_CUDA;
        CHECKF(rc == MOE_OK, "moe_backward (accumulate): %s: %s", moe_status_string(rc), moe_last_error());
        if (good && rc == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "accumulate")) {
            for (int i = 0; i < NG; i++) {
                if (!gr[i].d)
                    continue;
                float *got = malloc(4 * gr[i].n);
                for (size_t j = 0; got && j < gr[i].n; j++)
                    first[i][j] += prior[i][j];
                /* fp32: the same sum added; the dtype: prior + the sum rounded (the written gradient was the sum
                 * rounded once, so they differ by up to 1.5 units in the last place) */
                if (got && down_f(L, gr[i].eb, got, gr[i].d, gr[i].n))
                    check_close(gr[i].what, got, first[i], gr[i].n, gr[i].eb == 4 ? 1e-6 : dt == MOE_DTYPE_BF16 ? 8e-3
                                                                                                          : 2e-3);
                free(got);
            }
            /* dx is written, not accumulated: the second equals the first */
            float *f0 = halves(dx0, (size_t)T * H, dt), *f1 = down(dx1, L->gdx, (size_t)T * H * 2)
                                                                  ? halves(dx1, (size_t)T * H, dt) : NULL;
            if (f0 && f1)
                check_close("dx (written again)", f1, f0, (size_t)T * H, 1e-6);
            else
                CHECKF(0, "reading dx back");
            free(f0);
            free(f1);
        }
        for (int i = 0; i < NG; i++) {
            free(first[i]);
            free(prior[i]);
        }
        free(dx0);
        free(dx1);
    }
free_ref:
    for (size_t i = 0; i < sizeof ref_buf / sizeof *ref_buf; i++)
        free(ref_buf[i]);
out:
    graph_free(&G);
    free(ridx); free(ref_k); free(rw); free(bad); free(gidx);
}

static void run_case(const bwd_case_t *c, uint64_t seed, const char *cache) {
    layer_t L;
    memset(&L, 0, sizeof L);
    moe_diag_t d;
    if (moe_spec_load(&L.s, c->spec, NULL, NULL, 0, &d)) {
        CASE(c->spec);
        CHECKF(0, "%s", d.msg);
        return;
    }
    char label[200];
    snprintf(label, sizeof label, "%s/%s/%s%s%s%s", L.s.name, moe_dtype_name(L.s.dtype),
             c->recompute ? "recompute" : "save", c->graph ? "/graph" : "", c->tuning ? " under " : "",
             c->tuning ? c->tuning : "");
    CASE(label);
    moe_options o = {.cache_dir = cache, .tuning_path = c->tuning};
    moe_status st = moe_plan_create(&L.plan, c->spec, &o);
    if (st == MOE_OK && c->tuning)
        CHECKF(moe_plan_variant_count(L.plan) == c->variants, "%d GEMM variants from %s; %d planned",
               moe_plan_variant_count(L.plan), c->tuning, c->variants);
    CHECKF(st == MOE_OK, "moe_plan_create: %s: %s", moe_status_string(st), moe_last_error());
    if (st == MOE_OK) { /* moe_plan_info names the backward GEMMs the plan loaded, in stage order */
        moe_plan_info info = MOE_PLAN_INFO_INIT;
        static const char *const stage[4] = {"_dgrad_down_", "_dgrad_up_", "_wgrad_up_", "_wgrad_down_"};
        CHECK(moe_plan_get_info(L.plan, &info) == MOE_OK);
        for (int k = 0; k < 4; k++)
            CHECKF(info.backward_kernels[k] && strstr(info.backward_kernels[k], stage[k]),
                   "moe_plan_info.backward_kernels[%d] = %s", k,
                   info.backward_kernels[k] ? info.backward_kernels[k] : "NULL");
    }
    uint64_t rng = seed;
    if (st == MOE_OK && !layer_init(&L, &rng))
        CHECKF(0, "cannot set up the layer (host or device memory)");
    else if (st == MOE_OK)
        for (int i = 0; i < c->ntokens; i++)
            run_tokens(&L, c, c->tokens[i], &rng, label);
    layer_free(&L);
}

/* ---- training on a dp x fsdp mesh, its ranks on one GPU ------------------ */

/* A spec of tests/specs with a mesh key appended, written into dir; 1 with
 * its path in out, 0 on failure. */
static int mesh_spec(const char *spec, const char *mesh, const char *dir, char *out, size_t nout) {
    FILE *in = fopen(spec, "r");
    static char text[1 << 14];
    size_t n = in ? fread(text, 1, sizeof text - 1, in) : 0;
    if (in)
        fclose(in);
    text[n] = '\0';
    static int made;
    snprintf(out, nout, "%s/mesh%d_%s", dir, made++, strrchr(spec, '/') + 1);
    FILE *f = n ? fopen(out, "w") : NULL;
    int ok = f && fprintf(f, "%s\nmesh = %s\n", text, mesh) > 0;
    ok = f && fclose(f) == 0 && ok;
    return ok;
}

/* Every rank of a dp x fsdp training mesh as a plan of its own on this GPU
 * (moe_plan_create_unconnected, options.rank = r): each holds every expert
 * (mesh.ep = 1: the gather leaves the whole packed weights, the same on
 * every rank; the gather itself is test_ep_gpu's and test_mgpu's), runs the
 * training forward and the backward on tokens of its own, and its held
 * gradients come back to the host. moe_fsdp_grad_parts's collectives are
 * played there over each FSDP group (as NCCL defines them), and every
 * rank's result, each expert it stores, must be the CPU reference's
 * gradient of the FSDP group's tokens together (rounded mode). Where the
 * parts are a copy (no FSDP group) moe_reduce_scatter_grads runs on the
 * GPU into poisoned buffers and must equal the held gradients, and with
 * accumulate = 1 add them into random priors (the bwd_accum kernel); where
 * they are collectives, an unconnected plan must refuse it. Tokens routed
 * otherwise than the reference get dy = 0, as above. */
static void run_fsdp_mesh(const char *spec, const char *mesh, const int *tokens, uint64_t seed, const char *tmp,
                          const char *cache) {
    char path[600], label[300];
    snprintf(label, sizeof label, "fsdp: %s, mesh = %s", spec, mesh);
    CASE(label);
    if (!mesh_spec(spec, mesh, tmp, path, sizeof path)) {
        CHECKF(0, "cannot write the mesh spec");
        return;
    }
    enum { MAXR = 8 };
    layer_t L[MAXR];
    memset(L, 0, sizeof L);
    moe_diag_t d;
    if (moe_spec_load(&L[0].s, path, NULL, NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return;
    }
    const moe_spec_t *s = &L[0].s;
    const int W = moe_spec_world(s), E = s->experts, H = s->hidden, F = s->ffn;
    const moe_dtype_t dt = s->dtype;
    const double tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    const long long per[MOE_GRAD_TENSORS] = {2LL * F * H, s->ffn_bias ? 2LL * F : 0, (long long)H * F,
                                             s->ffn_bias ? H : 0};
    const size_t wb = (size_t)moe_wgrad_elem_bytes(s), eb[MOE_GRAD_TENSORS] = {wb, 4, wb, 4}; /* element bytes */
    float *held[MAXR][MOE_GRAD_TENSORS] = {{0}};
    uint16_t *xs[MAXR] = {0}, *dys[MAXR] = {0};
    moe_grad_part_t parts[MAXR][MOE_GRAD_TENSORS];
    int ok = W <= MAXR;
    CHECKF(ok, "a mesh of %d devices; this case plays at most %d", W, MAXR);
    for (int r = 0; r < W && ok; r++) {
        uint64_t wrng = seed; /* the same weights on every rank */
        uint64_t rng = seed + 1000 + (uint64_t)r;
        const int T = tokens[r];
        if (r)
            L[r].s = L[0].s;
        moe_options o = {.cache_dir = cache, .rank = r};
        moe_status st = moe_plan_create_unconnected(&L[r].plan, path, &o);
        CHECKF(st == MOE_OK, "rank %d: moe_plan_create_unconnected: %s: %s", r, moe_status_string(st), moe_last_error());
        ok = st == MOE_OK;
        if (ok && !layer_init(&L[r], &wrng)) {
            CHECKF(0, "rank %d: cannot set up the layer", r);
            ok = 0;
        }
        char err[256];
        if (ok && moe_fsdp_grad_parts(&moe_plan_desc(L[r].plan)->mesh, s, r, parts[r], err, sizeof err)) {
            CHECKF(0, "rank %d: %s", r, err);
            ok = 0;
        }
        if (!ok)
            break;
        /* this rank's tokens; those the GPU routes otherwise get dy = 0 and the pair runs again */
        fill(L[r].x, (size_t)T * H, 1.0f, &rng, dt);
        fill(L[r].dy, (size_t)T * H, 1.0f, &rng, dt);
        ok = up(L[r].dx_in, L[r].x, (size_t)T * H * 2) && up(L[r].ddy, L[r].dy, (size_t)T * H * 2) && poison(&L[r]) &&
             run_pair(&L[r], T, 0, NULL) == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "pair");
        moe_ref_inputs_t in = {.x = L[r].x, .wr = L[r].wr, .w1 = L[r].w1, .w2 = L[r].w2, .b1 = L[r].b1,
                               .b2 = L[r].b2, .sel_bias = L[r].sel, .logit_bias = L[r].lb, .tokens = T};
        int *ridx = malloc(sizeof(int) * T * L[r].K), *ref_k = malloc(sizeof(int) * T * L[r].K);
        float *rw = malloc(sizeof(float) * T * L[r].K);
        unsigned char *bad = malloc((size_t)T);
        int *gidx = ok ? region(&L[r], 0, T, 0, "topk_idx") : NULL;
        ok = ok && ridx && ref_k && rw && bad && gidx && !moe_ref_route(s, &in, ridx, rw, NULL);
        int nbad = ok ? route_diff(&L[r], T, gidx, ridx, bad, ref_k) : 0;
        CHECKF(!ok || nbad * 20 <= T + 20, "rank %d: %d of %d tokens route to other experts than the reference's", r,
               nbad, T);
        if (ok && nbad) {
            for (int t = 0; t < T; t++)
                if (bad[t])
                    memset(L[r].dy + (size_t)t * H, 0, (size_t)H * 2);
            ok = up(L[r].ddy, L[r].dy, (size_t)T * H * 2) && poison(&L[r]) && run_pair(&L[r], T, 0, NULL) == MOE_OK &&
                 cu_ok(moe_cu.cuCtxSynchronize(), "pair");
        }
        free(ridx), free(ref_k), free(rw), free(bad), free(gidx);
        xs[r] = L[r].x, dys[r] = L[r].dy;
        const CUdeviceptr g[MOE_GRAD_TENSORS] = {L[r].gdw1p, L[r].gdb1p, L[r].gdw2, L[r].gdb2};
        for (int i = 0; i < MOE_GRAD_TENSORS && ok; i++) {
            if (!per[i])
                continue;
            held[r][i] = malloc(4 * (size_t)parts[r][i].held);
            ok = held[r][i] && down_f(&L[r], eb[i], held[r][i], g[i], (size_t)parts[r][i].held);
        }
        CHECKF(ok, "rank %d: the training forward and backward did not run", r);
        if (!ok)
            break;
        /* moe_reduce_scatter_grads itself: on the GPU where it is a copy, refused without a communicator where it
         * is a collective */
        moe_grad_scatter_args ga = {(void *)L[r].gdw1p, s->ffn_bias ? (float *)L[r].gdb1p : NULL, (void *)L[r].gdw2,
                                    s->ffn_bias ? (float *)L[r].gdb2 : NULL, (void *)L[r].pw1,
                                    s->ffn_bias ? (float *)L[r].pb1 : NULL, NULL, NULL, 0};
        CUdeviceptr dw2_out = dalloc(4 * (size_t)parts[r][2].count), db2_out = dalloc(4 * (size_t)H * E);
        ga.dw2 = (void *)dw2_out, ga.db2 = s->ffn_bias ? (float *)db2_out : NULL;
        const CUdeviceptr outs[MOE_GRAD_TENSORS] = {L[r].pw1, L[r].pb1, dw2_out, db2_out};
        for (int i = 0; i < MOE_GRAD_TENSORS && dw2_out && db2_out; i++)
            if (per[i])
                cu_ok(moe_cu.cuMemsetD8(outs[i], 0xff, eb[i] * (size_t)parts[r][i].count), "poison");
        moe_status rs = dw2_out && db2_out ? moe_reduce_scatter_grads(L[r].plan, &ga, NULL) : MOE_ERR_CUDA;
        if (parts[r][0].op == MOE_GRAD_COPY) {
            CHECKF(rs == MOE_OK, "rank %d: moe_reduce_scatter_grads: %s", r, moe_last_error());
            for (int i = 0; i < MOE_GRAD_TENSORS && rs == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "copy"); i++) {
                float *got = per[i] ? malloc(4 * (size_t)parts[r][i].count) : NULL;
                if (got && down_f(&L[r], eb[i], got, outs[i], (size_t)parts[r][i].count))
                    CHECKF(memcmp(got, held[r][i], 4 * (size_t)parts[r][i].count) == 0,
                           "rank %d: moe_reduce_scatter_grads' %s is not the held gradient", r,
                           moe_grad_tensor_names[i]);
                free(got);
            }
            /* the argument checks: accumulate 0 or 1; the stored buffers apart from the held ones */
            moe_grad_scatter_args bad = ga;
            bad.accumulate = 2;
            moe_status bs = moe_reduce_scatter_grads(L[r].plan, &bad, NULL);
            CHECKF(bs == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "accumulate = 2"), "rank %d: %s", r,
                   moe_last_error());
            bad = ga;
            bad.dw2 = (char *)bad.held_dw2 + eb[2];
            bs = moe_reduce_scatter_grads(L[r].plan, &bad, NULL);
            CHECKF(bs == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "dw2 overlaps held_dw2"), "rank %d: %s", r,
                   moe_last_error());
            /* accumulate = 1: the held gradients added into random priors */
            float *prior[MOE_GRAD_TENSORS] = {0};
            int good = rs == MOE_OK;
            for (int i = 0; i < MOE_GRAD_TENSORS && good; i++) {
                if (!per[i])
                    continue;
                const size_t cnt = (size_t)parts[r][i].count;
                uint64_t prng = seed ^ (0xacc + (uint64_t)i);
                good = (prior[i] = malloc(4 * cnt)) != NULL;
                for (size_t k = 0; good && k < cnt; k++) /* rounded as the buffer's elements */
                    prior[i][k] = as_elem(&L[r], eb[i], unif(&prng));
                good = good && up_f(&L[r], eb[i], outs[i], prior[i], cnt);
            }
            ga.accumulate = 1;
            moe_status as = good ? moe_reduce_scatter_grads(L[r].plan, &ga, NULL) : MOE_ERR_CUDA;
            CHECKF(as == MOE_OK, "rank %d: moe_reduce_scatter_grads (accumulate): %s", r, moe_last_error());
            good = good && as == MOE_OK && cu_ok(moe_cu.cuCtxSynchronize(), "accumulate");
            for (int i = 0; i < MOE_GRAD_TENSORS && good; i++) {
                if (!per[i])
                    continue;
                const size_t cnt = (size_t)parts[r][i].count;
                float *got = malloc(4 * cnt);
                for (size_t k = 0; got && k < cnt; k++)
                    prior[i][k] += held[r][i][k];
                if (got && down_f(&L[r], eb[i], got, outs[i], cnt)) { /* the dtype's: the sum rounded once */
                    char what[120];
                    snprintf(what, sizeof what, "rank %d: %s accumulated (prior + held)", r, moe_grad_tensor_names[i]);
                    check_close(what, got, prior[i], cnt, eb[i] == 4 ? 1e-6 : dt == MOE_DTYPE_BF16 ? 4e-3 : 5e-4);
                }
                free(got);
            }
            for (int i = 0; i < MOE_GRAD_TENSORS; i++)
                free(prior[i]);
        } else {
            CHECKF(rs == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "no communicator"),
                   "rank %d: moe_reduce_scatter_grads on an unconnected plan: %s, %s", r, moe_status_string(rs),
                   moe_last_error());
        }
        if (dw2_out)
            moe_cu.cuMemFree(dw2_out);
        if (db2_out)
            moe_cu.cuMemFree(db2_out);
    }
    /* per FSDP group: the collectives on the host, then the reference of the group's tokens together */
    const moe_mesh_plan_t *mp = ok ? &moe_plan_desc(L[0].plan)->mesh : NULL;
    for (int grp = 0; ok && grp < mp->nfsdp_groups; grp++) {
        const int fs = mp->size[MOE_AXIS_FSDP], *peers = mp->fsdp_groups + (size_t)grp * fs;
        int Tg = 0;
        for (int f = 0; f < fs; f++)
            Tg += tokens[peers[f]];
        uint16_t *x = malloc((size_t)Tg * H * 2 + 2), *dy = malloc((size_t)Tg * H * 2 + 2);
        moe_ref_grads_t rg = {.dw1 = malloc(4 * (size_t)E * 2 * F * H), .dw2 = malloc(4 * (size_t)E * H * F),
                              .db1 = malloc(4 * (size_t)E * 2 * F), .db2 = malloc(4 * (size_t)E * H)};
        ok = x && dy && rg.dw1 && rg.dw2 && rg.db1 && rg.db2;
        for (int f = 0, t0 = 0; ok && f < fs; t0 += tokens[peers[f]], f++) {
            memcpy(x + (size_t)t0 * H, xs[peers[f]], (size_t)tokens[peers[f]] * H * 2);
            memcpy(dy + (size_t)t0 * H, dys[peers[f]], (size_t)tokens[peers[f]] * H * 2);
        }
        const layer_t *L0 = &L[peers[0]];
        moe_ref_inputs_t in = {.x = x, .wr = L0->wr, .w1 = L0->w1, .w2 = L0->w2, .b1 = L0->b1, .b2 = L0->b2,
                               .sel_bias = L0->sel, .logit_bias = L0->lb, .tokens = Tg};
        if (ok && moe_ref_backward(s, &in, dy, 0, &rg, NULL)) {
            CHECKF(0, "the reference's backward");
            ok = 0;
        }
        const float *want[MOE_GRAD_TENSORS] = {rg.dw1, rg.db1, rg.dw2, rg.db2};
        for (int f = 0; ok && f < fs; f++) {
            const int r = peers[f];
            const moe_mesh_rank_t *rk = &mp->ranks[r];
            char what[200];
            for (int i = 0; i < MOE_GRAD_TENSORS; i++) {
                const moe_grad_part_t *p = &parts[r][i];
                if (!per[i])
                    continue;
                float *got = malloc(4 * (size_t)p->count), *ref = malloc(4 * (size_t)p->count);
                for (long long k = 0; got && ref && k < p->count; k++) { /* NCCL's reduce-scatter / all-reduce */
                    float sum = 0;
                    for (int m = 0; m < p->group; m++)
                        sum += held[p->op == MOE_GRAD_COPY ? r : rk->fsdp_peers[m]]
                                   [i][(p->op == MOE_GRAD_REDUCE_SCATTER ? rk->fsdp_rank * p->count : 0) + k];
                    got[k] = sum;
                }
                /* the stored experts' reference; dw1p and db1p in the packed row order (plain row rr is
                 * packed row moe_pack_row(rr, F)) */
                const long long cols = i == 0 ? H : 1;
                for (int q = 0; got && ref && q < mp->nstored; q++)
                    for (long long k = 0; k < per[i]; k++) {
                        const long long dst = i <= 1 ? moe_pack_row((int)(k / cols), F) * cols + k % cols : k;
                        ref[q * per[i] + dst] = want[i][(size_t)rk->stored[q] * per[i] + k];
                    }
                snprintf(what, sizeof what, "rank %d (fsdp rank %d), %s of its stored experts %d..%d", r,
                         rk->fsdp_rank, moe_grad_tensor_names[i], rk->stored[0], rk->stored[mp->nstored - 1]);
                if (got && ref)
                    check_close(what, got, ref, (size_t)p->count, tol);
                free(got), free(ref);
            }
        }
        free(x), free(dy), free(rg.dw1), free(rg.dw2), free(rg.db1), free(rg.db2);
    }
    for (int r = 0; r < W && r < MAXR; r++) {
        for (int i = 0; i < MOE_GRAD_TENSORS; i++)
            free(held[r][i]);
        layer_free(&L[r]);
    }
}

static void run_fsdp(uint64_t seed, const char *tmp, const char *cache) {
    static const int tokens[8] = {37, 300, 5, 128, 77, 1, 200, 64};
    run_fsdp_mesh("tests/specs/train_gptoss.moe", "{ dp = 2, fsdp = 2 }", tokens, seed, tmp, cache);
    run_fsdp_mesh("tests/specs/train_softmax.moe", "{ fsdp = 4, expert_sharding = { 'fsdp' } }", tokens, seed + 1, tmp,
                  cache);
    run_fsdp_mesh("tests/specs/train_softmax.moe", "{ fsdp = 2, expert_sharding = { 'ep' } }", tokens, seed + 2, tmp,
                  cache);
    run_fsdp_mesh("tests/specs/train_sigmoid_groups.moe", "{ dp = 2 }", tokens, seed + 3, tmp, cache);
    /* the weight gradients in the dtype: the copy and bwd_accum's 2-byte add (dp), the played reduce-scatter */
    run_fsdp_mesh("tests/specs/train_gptoss_hgrad.moe", "{ dp = 2 }", tokens, seed + 4, tmp, cache);
    run_fsdp_mesh("tests/specs/train_softmax_hgrad.moe", "{ fsdp = 2, expert_sharding = { 'fsdp' } }", tokens,
                  seed + 5, tmp, cache);
}

/* Write examples/specs/NAME as a training spec of the example's semantics
 * with hidden 256, ffn 128 (shared.ffn kept at the same number of slots)
 * and a capacity of 512 tokens into dir; 1 with its path in out, 0 where the
 * example is not a one-device spec (reason in why), -1 on a load error. */
static int shrink_example(const char *name, const char *dir, char *out, size_t nout, char *why, size_t nwhy) {
    char src[600];
    snprintf(src, sizeof src, "examples/specs/%s", name);
    moe_spec_t s;
    moe_diag_t d;
    if (moe_spec_load(&s, src, NULL, NULL, 0, &d)) {
        snprintf(why, nwhy, "%s", d.msg);
        return -1;
    }
    const int world = moe_spec_world(&s), slots = s.shared.ffn ? s.shared.ffn / s.ffn : 0;
    if (world != 1) {
        snprintf(why, nwhy, "a mesh of %d devices (training = true is one device)", world);
        return 0;
    }
    if (s.zero_experts) { /* refused with training (tests/golden/errors has the message) */
        snprintf(why, nwhy, "zero_experts = %d: inference only", s.zero_experts);
        return 0;
    }
    char shared[64];
    snprintf(shared, sizeof shared, "shared.ffn=%d", slots * 128);
    const moe_override_t ovr[] = {{"training=true"}, {"hidden=256"}, {"ffn=128"}, {"tokens=512"}, {shared}};
    if (moe_spec_load(&s, src, NULL, ovr, slots ? 5 : 4, &d)) {
        snprintf(why, nwhy, "%s", d.msg);
        return -1;
    }
    char *text = moe_spec_canonical(&s);
    snprintf(out, nout, "%s/%s", dir, name);
    FILE *f = text ? fopen(out, "w") : NULL;
    int ok = f && fputs(text, f) >= 0;
    ok = f && fclose(f) == 0 && ok;
    free(text);
    if (!ok)
        snprintf(why, nwhy, "cannot write %s", out);
    return ok ? 1 : -1;
}

/* The example specs, shrunk by shrink_example, each at 1, 77 and 300 tokens
 * saving U, and at 77 recomputing it. */
static void run_examples(uint64_t seed, const char *tmp, const char *cache) {
    DIR *dir = opendir("examples/specs");
    if (!dir) {
        CASE("example specs");
        CHECKF(0, "cannot open examples/specs (run from the repository root)");
        return;
    }
    char names[64][256];
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) && n < 64;) {
        size_t l = strlen(e->d_name);
        if (l > 4 && l < sizeof names[0] && strcmp(e->d_name + l - 4, ".moe") == 0)
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    for (int i = 0; i < n; i++) {
        char path[600], why[1100], label[300];
        snprintf(label, sizeof label, "example %s as a training spec", names[i]);
        int r = shrink_example(names[i], tmp, path, sizeof path, why, sizeof why);
        if (r <= 0) {
            CASE(label);
            if (r < 0)
                CHECKF(0, "%s", why);
            else
                SKIP("%s: %s", names[i], why);
            continue;
        }
        const bwd_case_t save = {path, {1, 77, 300}, 3, 0, 0, 1, NULL, 0},
                         recompute = {path, {77}, 1, 1, 0, 0, NULL, 0};
        run_case(&save, seed + (uint64_t)i * 7919, cache);
        run_case(&recompute, seed + (uint64_t)i * 7919 + 1, cache);
    }
}

/* ---- training on an expert-parallel mesh, its ranks on one GPU ------------ */

/* The training forward and the backward of every rank, step by step. */
static int run_ep_pair(layer_t *L, const moe_mesh_plan_t *mp, const int *tokens, int recompute,
                       moe_ep_call_t **calls) {
    const int W = mp->world;
    for (int step = 0; step < MOE_EP_STEPS; step++) {
        for (int r = 0; r < W; r++) {
            moe_train_forward_args fa = fwd_args(&L[r], tokens[r], recompute);
            moe_status st = moe_ep_train_step(L[r].plan, &fa, NULL, step, calls[r]);
            CHECKF(st == MOE_OK, "training forward, step %d, rank %d: %s", step, r, moe_last_error());
            if (st)
                return 0;
        }
        if (!cu_ok(moe_cu.cuCtxSynchronize(), "step") || ep_play_xfers(mp, calls, 0))
            return 0;
    }
    for (int step = 0; step < MOE_EP_BWD_STEPS; step++) {
        for (int r = 0; r < W; r++) {
            moe_backward_args ba = bwd_args(&L[r], tokens[r], recompute, 0);
            moe_status st = moe_ep_bwd_step(L[r].plan, &ba, NULL, step, calls[r]);
            CHECKF(st == MOE_OK, "backward, step %d, rank %d: %s", step, r, moe_last_error());
            if (st)
                return 0;
        }
        if (!cu_ok(moe_cu.cuCtxSynchronize(), "step") || ep_play_xfers(mp, calls, 0))
            return 0;
    }
    return 1;
}

/* Every rank of an EP training mesh as a plan of its own on this GPU
 * (moe_plan_create_unconnected, options.rank = r), holding the packed
 * weights of the experts the mesh plan lists for it (the gather itself is
 * test_ep_gpu's), with tokens[r] tokens of its own. See the top. Tokens the
 * GPU routes otherwise than the reference get dy = 0, and the pair runs
 * again. */
static void run_ep_mesh(const char *spec, const char *mesh, const int *tokens, int recompute, uint64_t seed,
                        const char *tmp, const char *cache) {
    char path[600], label[300];
    snprintf(label, sizeof label, "ep: %s, mesh = %s%s", spec, mesh, recompute ? ", recompute_u" : "");
    CASE(label);
    if (!mesh_spec(spec, mesh, tmp, path, sizeof path)) {
        CHECKF(0, "cannot write the mesh spec");
        return;
    }
    enum { MAXR = 8 };
    layer_t L[MAXR];
    memset(L, 0, sizeof L);
    moe_ep_call_t *calls[MAXR] = {0};
    moe_ref_grads_t rg[MAXR];
    memset(rg, 0, sizeof rg);
    moe_diag_t d;
    if (moe_spec_load(&L[0].s, path, NULL, NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return;
    }
    const moe_spec_t *s = &L[0].s;
    const int W = moe_spec_world(s), E = s->experts, H = s->hidden, F = s->ffn, K = s->top_k;
    const moe_dtype_t dt = s->dtype;
    const double tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    const long long per[MOE_GRAD_TENSORS] = {2LL * F * H, s->ffn_bias ? 2LL * F : 0, (long long)H * F,
                                             s->ffn_bias ? H : 0};
    const moe_mesh_plan_t *mp = NULL;
    int ok = W <= MAXR;
    CHECKF(ok, "a mesh of %d devices; this case plays at most %d", W, MAXR);
    for (int r = 0; r < W && ok; r++) {
        uint64_t wrng = seed; /* the same weights on every rank */
        uint64_t rng = seed + 1000 + (uint64_t)r;
        const int T = tokens[r];
        if (r)
            L[r].s = L[0].s;
        moe_options o = {.cache_dir = cache, .rank = r};
        moe_status st = moe_plan_create_unconnected(&L[r].plan, path, &o);
        CHECKF(st == MOE_OK, "rank %d: moe_plan_create_unconnected: %s: %s", r, moe_status_string(st), moe_last_error());
        ok = st == MOE_OK && (calls[r] = malloc(sizeof *calls[r])) != NULL;
        if (ok && !layer_init(&L[r], &wrng)) {
            CHECKF(0, "rank %d: cannot set up the layer", r);
            ok = 0;
        }
        if (!ok)
            break;
        mp = &moe_plan_desc(L[0].plan)->mesh;
        /* the held experts' packed weights at slots 0 .. held - 1 (what the gather leaves) */
        const moe_mesh_rank_t *rk = &mp->ranks[r];
        const size_t w1e = 2 * (size_t)F * H, w2e = (size_t)H * F, b1e = 2 * (size_t)F, b2e = (size_t)H;
        for (int j = 0; j < mp->nheld && ok; j++) {
            const size_t g = (size_t)rk->held[j];
            ok = up(L[r].dw1p + 2 * j * w1e, L[r].w1p + g * w1e, 2 * w1e) &&
                 up(L[r].dw2 + 2 * j * w2e, L[r].w2 + g * w2e, 2 * w2e) &&
                 up(L[r].db1p + 2 * j * b1e, L[r].b1p + g * b1e, 2 * b1e) &&
                 up(L[r].db2 + 2 * j * b2e, L[r].b2 + g * b2e, 2 * b2e);
        }
        fill(L[r].x, (size_t)T * H, 1.0f, &rng, dt);
        fill(L[r].dy, (size_t)T * H, 1.0f, &rng, dt);
        ok = ok && (!T || (up(L[r].dx_in, L[r].x, (size_t)T * H * 2) && up(L[r].ddy, L[r].dy, (size_t)T * H * 2)));
    }
    /* the pair; tokens routed otherwise than the reference get dy = 0 and it runs again */
    for (int attempt = 0; ok && attempt < 2; attempt++) {
        for (int r = 0; r < W && ok; r++)
            ok = poison(&L[r]);
        ok = ok && run_ep_pair(L, mp, tokens, recompute, calls);
        int again = 0;
        for (int r = 0; r < W && ok && attempt == 0; r++) {
            const int T = tokens[r];
            if (!T)
                continue;
            moe_ref_inputs_t in = {.x = L[r].x, .wr = L[r].wr, .w1 = L[r].w1, .w2 = L[r].w2, .b1 = L[r].b1,
                                   .b2 = L[r].b2, .sel_bias = L[r].sel, .logit_bias = L[r].lb, .tokens = T};
            int *ridx = malloc(sizeof(int) * T * K), *ref_k = malloc(sizeof(int) * T * K);
            float *rw = malloc(sizeof(float) * T * K);
            unsigned char *bad = malloc((size_t)T);
            int *gidx = region(&L[r], 0, T, recompute, "topk_idx");
            ok = ridx && ref_k && rw && bad && gidx && !moe_ref_route(s, &in, ridx, rw, NULL);
            int nbad = ok ? route_diff(&L[r], T, gidx, ridx, bad, ref_k) : 0;
            CHECKF(!ok || nbad * 20 <= T + 20, "rank %d: %d of %d tokens route to other experts than the reference's",
                   r, nbad, T);
            for (int t = 0; ok && t < T; t++)
                if (bad[t])
                    memset(L[r].dy + (size_t)t * H, 0, (size_t)H * 2);
            ok = ok && (!nbad || up(L[r].ddy, L[r].dy, (size_t)T * H * 2));
            again |= nbad > 0;
            free(ridx), free(ref_k), free(rw), free(bad), free(gidx);
        }
        if (!again)
            break;
    }
    CHECKF(ok, "the training forward and backward did not run");
    for (int r = 0; r < W && ok; r++) { /* capacity mode: room for every row */
        long long lost = -1;
        moe_status st = moe_plan_overflow(L[r].plan, (void *)L[r].ws, NULL, &lost);
        CHECKF(st == MOE_OK && lost == 0, "rank %d: %lld rows overflowed: %s", r, lost, moe_last_error());
    }
    /* the reference of each rank's own tokens */
    for (int r = 0; r < W && ok; r++) {
        if (!tokens[r])
            continue;
        rg[r] = (moe_ref_grads_t){.dx = malloc(4 * (size_t)tokens[r] * H), .dwr = malloc(4 * (size_t)E * H),
                                  .dlogit_bias = malloc(4 * (size_t)E), .dw1 = malloc(4 * (size_t)E * 2 * F * H),
                                  .dw2 = malloc(4 * (size_t)E * H * F), .db1 = malloc(4 * (size_t)E * 2 * F),
                                  .db2 = malloc(4 * (size_t)E * H)};
        moe_ref_inputs_t in = {.x = L[r].x, .wr = L[r].wr, .w1 = L[r].w1, .w2 = L[r].w2, .b1 = L[r].b1, .b2 = L[r].b2,
                               .sel_bias = L[r].sel, .logit_bias = L[r].lb, .tokens = tokens[r]};
        ok = rg[r].dx && rg[r].dwr && rg[r].dlogit_bias && rg[r].dw1 && rg[r].dw2 && rg[r].db1 && rg[r].db2 &&
             !moe_ref_backward(s, &in, L[r].dy, 0, &rg[r], NULL);
        CHECKF(ok, "rank %d: the reference's backward", r);
    }
    /* every rank: dx, d router_w, d logit_bias of its tokens; its held experts' gradients */
    for (int r = 0; r < W && ok; r++) {
        const int T = tokens[r];
        char what[200];
        uint16_t *gx = malloc(2 * (size_t)T * H + 2);
        float *gwr = malloc(4 * (size_t)E * H), *glb = malloc(4 * (size_t)E);
        if (!gx || !gwr || !glb || !down(gwr, L[r].gdwr, 4 * (size_t)E * H) || !down(glb, L[r].gdlb, 4 * (size_t)E) ||
            (T && !down(gx, L[r].gdx, 2 * (size_t)T * H))) {
            CHECKF(0, "rank %d: downloading the gradients", r);
        } else if (T) {
            float *fx = halves(gx, (size_t)T * H, dt);
            snprintf(what, sizeof what, "rank %d (%d tokens): dx", r, T);
            if (fx)
                check_close(what, fx, rg[r].dx, (size_t)T * H, tol);
            free(fx);
            snprintf(what, sizeof what, "rank %d: d router_w", r);
            check_close(what, gwr, rg[r].dwr, (size_t)E * H, tol);
            if (s->router.logit_bias) {
                snprintf(what, sizeof what, "rank %d: d logit_bias", r);
                check_close(what, glb, rg[r].dlogit_bias, (size_t)E, tol);
            }
        } else { /* no tokens: the router's gradients are zero */
            size_t nz = 0;
            for (size_t i = 0; i < (size_t)E * H; i++)
                nz += gwr[i] != 0.0f;
            for (int e = 0; s->router.logit_bias && e < E; e++)
                nz += glb[e] != 0.0f;
            CHECKF(nz == 0, "rank %d has no tokens but %zu of its router gradients are not zero", r, nz);
        }
        free(gx), free(gwr), free(glb);
        /* held slot j's gradients: the sum of the reference's over the EP group's ranks */
        const moe_mesh_rank_t *rk = &mp->ranks[r];
        const CUdeviceptr gd[MOE_GRAD_TENSORS] = {L[r].gdw1p, L[r].gdb1p, L[r].gdw2, L[r].gdb2};
        for (int i = 0; i < MOE_GRAD_TENSORS; i++) {
            if (!per[i])
                continue;
            const size_t n = (size_t)mp->nheld * (size_t)per[i];
            float *got = malloc(4 * n), *want = calloc(n, 4);
            const float *ref[MOE_GRAD_TENSORS];
            const long long cols = i == 0 ? H : 1;
            for (int q = 0; got && want && q < mp->size[MOE_AXIS_EP]; q++) {
                const int p = rk->ep_peers[q];
                if (!tokens[p])
                    continue;
                ref[0] = rg[p].dw1, ref[1] = rg[p].db1, ref[2] = rg[p].dw2, ref[3] = rg[p].db2;
                for (int j = 0; j < mp->nheld; j++)
                    for (long long k = 0; k < per[i]; k++) {
                        const long long dst = i <= 1 ? moe_pack_row((int)(k / cols), F) * cols + k % cols : k;
                        want[(size_t)j * per[i] + dst] += ref[i][(size_t)rk->held[j] * per[i] + k];
                    }
            }
            snprintf(what, sizeof what, "rank %d (ep rank %d), %s of its %d held experts", r, rk->ep_rank,
                     moe_grad_tensor_names[i], mp->nheld);
            if (got && want && down_f(&L[r], i % 2 ? 4 : wg_bytes(&L[r]), got, gd[i], n)) /* 0, 2: dw1p, dw2 */
                check_close(what, got, want, n, tol);
            else
                CHECKF(0, "%s: downloading", what);
            free(got), free(want);
        }
    }
    for (int r = 0; r < W && r < MAXR; r++) {
        free(rg[r].dx), free(rg[r].dwr), free(rg[r].dlogit_bias), free(rg[r].dw1), free(rg[r].dw2);
        free(rg[r].db1), free(rg[r].db2), free(calls[r]);
        if (L[r].plan)
            layer_free(&L[r]);
    }
}

static void run_ep(uint64_t seed, const char *tmp, const char *cache) {
    static const int tokens[8] = {37, 300, 5, 128, 77, 1, 200, 64};
    static const int one_empty[4] = {5, 0, 128, 1};
    run_ep_mesh("tests/specs/train_softmax.moe", "{ ep = 2 }", tokens, 0, seed, tmp, cache);
    run_ep_mesh("tests/specs/train_softmax.moe", "{ ep = 4 }", one_empty, 0, seed + 1, tmp, cache);
    run_ep_mesh("tests/specs/train_gptoss.moe", "{ ep = 2 }", tokens + 3, 1, seed + 2, tmp, cache);
    run_ep_mesh("tests/specs/train_gptoss.moe", "{ ep = 4 }", tokens, 0, seed + 3, tmp, cache);
    run_ep_mesh("tests/specs/train_gptoss.moe", "{ fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }", tokens,
                0, seed + 4, tmp, cache);
    run_ep_mesh("tests/specs/train_input.moe", "{ ep = 4 }", tokens + 2, 0, seed + 5, tmp, cache);
    run_ep_mesh("tests/specs/train_sigmoid_groups.moe", "{ dp = 2, ep = 2 }", tokens + 1, 1, seed + 6, tmp, cache);
    /* capacity dispatch: every pair moves C rows (room for all: a token sends a peer at most min(top_k, slots)) */
    run_ep_mesh("tests/specs/train_softmax.moe", "{ ep = 4 }\ndispatch = { mode = 'capacity', capacity = 700 }",
                tokens, 0, seed + 7, tmp, cache);
    run_ep_mesh("tests/specs/train_gptoss.moe", "{ ep = 2 }\ndispatch = { mode = 'capacity', capacity = 600 }",
                tokens + 3, 1, seed + 8, tmp, cache);
    run_ep_mesh("tests/specs/train_softmax_hgrad.moe", "{ ep = 2 }", tokens, 0, seed + 9, tmp, cache);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *env = getenv("MOEGEN_TEST_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 10);
    fprintf(stderr, "test_bwd_gpu: seed %llu (MOEGEN_TEST_SEED=%llu repeats this run)\n", (unsigned long long)seed,
            (unsigned long long)seed);
    char why[512];
    CASE("driver");
    if (moe_cu_load(why, sizeof why) != 0) {
        SKIP("every GPU case: no CUDA driver (%s)", why);
        return check_report("test_bwd_gpu");
    }
    int count = 0;
    if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
        SKIP("every GPU case: the driver reports no GPU");
        return check_report("test_bwd_gpu");
    }
    char tmp[] = "/tmp/moegen_test_bwd_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int want = argc < 2;
        for (int j = 1; j < argc; j++)
            want |= strstr(cases[i].spec, argv[j]) != NULL;
        if (want)
            run_case(&cases[i], seed + i * 1000, cache);
    }
    int examples = argc < 2;
    for (int j = 1; j < argc; j++)
        examples |= strstr("examples", argv[j]) != NULL;
    if (examples)
        run_examples(seed ^ 0xe8a3, tmp, cache);
    int fsdp = argc < 2;
    for (int j = 1; j < argc; j++)
        fsdp |= strcmp(argv[j], "fsdp") == 0;
    if (fsdp)
        run_fsdp(seed ^ 0xf5d9, tmp, cache);
    int ep = argc < 2;
    for (int j = 1; j < argc; j++)
        ep |= strcmp(argv[j], "ep") == 0;
    if (ep)
        run_ep(seed ^ 0xe9b7, tmp, cache);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "test_bwd_gpu: could not remove %s\n", tmp);
    return check_report("test_bwd_gpu");
}
