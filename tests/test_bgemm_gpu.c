/* test_bgemm_gpu.c — the backward grouped GEMMs (runtime/bgemm.h) on the
 * GPU, each kind alone, against a plain CPU GEMM of the same math (double
 * accumulation) on fresh random inputs:
 *   dgrad_down  dU = act'(Ur) . (dys . W2[slot]), dtype, packed gate/up columns
 *               (also in place: dU written over Ur)
 *   dgrad_up    dXs = dU . W1p[slot], dtype
 *   wgrad_up    dW1p[slot] (+)= dU_gᵀ . xs_g, fp32
 *   wgrad_down  dW2[slot] (+)= dys_gᵀ . A_g, fp32
 * The row layout is the forward's: each slot's rows start on the plan's row
 * block, pad rows between slots hold NaN (so a pad row that contributed
 * shows), and the tile table lists each slot's row blocks. Routing is
 * ragged: slot 0 gets no rows, slot 1 one row, slot 2 exactly one row block,
 * the rest random; two cases store the experts' weights in a random slot
 * order (the plan's routing table: the dgrads read the tile's slot, the
 * wgrads write slot_of[g]), one has a shared expert's slot. Outputs are poisoned (NaN) before the beta = 0 runs, and
 * rows the dgrads must not write are checked to keep their poison; beta = 1
 * adds to random values, and the empty slot's accumulator is left bit for
 * bit. bf16 and fp16, clamped SwiGLU with biases, GeGLU, plain SwiGLU.
 *
 * Tolerances, per element: the dtype outputs (dgrads) within one unit in
 * the last place of the dtype's rounding of the reference (2^-7 of it for
 * bf16, 2^-10 for fp16: a sum on a rounding boundary may round either way)
 * plus 1e-4 of the sum of the |terms| (the fp32 accumulation and the
 * activation's fast exp); the fp32 outputs (wgrads) within 1e-4 of the sum
 * of the |terms| (the products are exact in fp32, the sums in a different
 * order) plus 1e-6.
 *
 * One case runs on the CPU, GPU or not: this file's statement of the
 * activation's backward (act_bwd, line for line templates/activation.lua's
 * M.backward) against the CPU reference's backward (moe_ref_backward's
 * stages Ur, dA -> dU) on tiny layers whose clamp cuts often.
 *
 * On sm_90a all four are TMA + wgmma kernels (templates/gemm_sm90.lua: the
 * dgrads B N-major, the wgrads both operands M/N-major with the slot's last
 * rows zeroed in shared memory), on sm_80 mma.sync; each case prints the
 * kernels it ran.
 *
 * Without a driver or GPU every GPU case reports itself skipped. The seed is
 * printed; MOEGEN_TEST_SEED=N repeats a run. Run from the repository root
 * (it reads tests/specs/training.moe). Usage: test_bgemm_gpu
 * [--perf] (--perf adds a large bf16 shape, checked on sampled elements, and
 * prints each kind's time and TFLOP/s). */
#define _GNU_SOURCE
#include "bgemm.h"
#include "check.h"
#include "driver.h"
#include "half.h"
#include "moe.h"
#include "moe_impl.h" /* white box: the plan's launcher */
#include "moe_internal.h"
#include "pack_geom.h"
#include "ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *spec;  /* spec: a file, or spec text when it holds '=' */
    int tokens;     /* rows = tokens * top_k, spread over the slots */
    int sample;     /* check this many random elements per output (0: all) */
    int perm;       /* store the experts' weights in a random slot order (the plan's routing table) */
} bcase_t;

static const bcase_t cases[] = {
    {"clamp_bf16", "tests/specs/training.moe", 500, 0, 0}, /* clamped SwiGLU; H, F not multiples of the tiles */
    {"clamp_bf16_permuted_slots", "tests/specs/training.moe", 300, 0, 1},
    {"geglu_fp16_shared", /* 64-row blocks; a shared expert's slot (slot 6) after the routed ones */
     "name = 'bg_geglu' experts = 6 top_k = 2 hidden = 200 ffn = 88 tokens = 128 dtype = 'fp16'\n"
     "activation = { kind = 'geglu', limit = 7.0, up_offset = 1 } shared = { ffn = 88 } training = true\n",
     100, 0, 0},
    {"swiglu_fp16",
     "name = 'bg_swiglu' experts = 8 top_k = 2 hidden = 128 ffn = 64 tokens = 256 dtype = 'fp16' training = true\n",
     256, 0, 1},
    {"swiglu_bf16_many_rows", /* several row blocks and K tiles per slot */
     "name = 'bg_rows' experts = 4 top_k = 2 hidden = 384 ffn = 192 tokens = 2048 training = true\n",
     2000, 0, 0},
};
static const bcase_t perf_case = {
    "perf_bf16", "name = 'bg_perf' experts = 8 top_k = 2 hidden = 4096 ffn = 2048 tokens = 8192 training = true\n",
    8192, 3000, 0};

/* ---- random numbers -------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(double lo, double hi) { return lo + (hi - lo) * (double)(rng_next() >> 11) / 9007199254740992.0; }
static int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

/* ---- the activation's backward, as templates/activation.lua states it ------ */

static void act_bwd(const moe_spec_t *s, double gate, double up, double d, double *dgate, double *dup) {
    const double lim = s->activation.limit;
    int gate_in = 1, up_in = 1;
    if (lim > 0) {
        gate_in = gate <= lim;
        up_in = up >= -lim && up <= lim;
        gate = fmin(gate, lim);
        up = fmin(fmax(up, -lim), lim);
    }
    const double upt = up + s->activation.up_offset;
    double act, dact;
    if (s->activation.kind == MOE_ACT_GEGLU) {
        const double c = 0.7978845608028654, sg = 1 / (1 + exp(-2 * c * (gate + 0.044715 * gate * gate * gate)));
        act = gate * sg;
        dact = sg + 2 * gate * sg * (1 - sg) * c * (1 + 3 * 0.044715 * gate * gate);
    } else {
        const double a = s->activation.alpha, sg = 1 / (1 + exp(-a * gate));
        act = gate * sg;
        dact = sg + a * gate * sg * (1 - sg);
    }
    *dgate = gate_in ? d * upt * dact : 0;
    *dup = up_in ? d * act : 0;
}

/* ---- device helpers ------------------------------------------------------- */

static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, moe_cu_error_string(r));
    return 0;
}

static CUdeviceptr upload(const void *host, size_t bytes) {
    CUdeviceptr d = 0;
    if (!cu_ok(moe_cu.cuMemAlloc(&d, bytes ? bytes : 16), "cuMemAlloc"))
        return 0;
    if (host && bytes && !cu_ok(moe_cu.cuMemcpyHtoD(d, host, bytes), "cuMemcpyHtoD")) {
        moe_cu.cuMemFree(d);
        return 0;
    }
    return d;
}

/* ---- one case --------------------------------------------------------------- */

typedef struct {
    const moe_spec_t *s;
    moe_dtype_t dt;
    long long S, H, F, R;          /* slots, hidden, ffn, rows (incl. pad) */
    int *counts, *offsets;         /* [S], [S + 1] */
    int *row_slot;                 /* [R] expert g (offsets' index) of each row, -1 for pad rows */
    int *slot_of;                  /* [S] the weight slot of expert g (the routing table; then the shared slots) */
    uint16_t *dys, *w2, *ur, *du, *w1p, *xs, *a; /* the inputs, host */
    double ulp;                    /* the dtype's largest relative spacing (one ulp) */
    double tiny;                   /* its spacing among subnormals (one step there is a whole ulp) */
} bdata_t;

static double hf(const bdata_t *d, uint16_t v) { return moe_half_to_float(v, d->dt); }

/* A random dtype matrix of n elements in [lo, hi]; for a row matrix
 * (row_len > 0, rows of row_len elements) the pad rows (slot -1) are NaN
 * (0xffff). */
static uint16_t *random_half(const bdata_t *d, size_t n, double lo, double hi, long long row_len) {
    uint16_t *v = malloc(n * sizeof *v);
    for (size_t i = 0; v && i < n; i++)
        v[i] = row_len && d->row_slot[i / (size_t)row_len] < 0 ? 0xffff
                                                                : moe_float_to_half((float)rng_uniform(lo, hi), d->dt);
    return v;
}

/* Check a dtype output [R, n] (GPU got) against want(row, col) for the real
 * rows, pad rows untouched (their poison). Returns the worst error ratio. */
typedef double (*want_fn)(const bdata_t *d, long long r, long long c, double *mag);

static double check_half(const bdata_t *d, const uint16_t *got, long long n, want_fn want, int sample, int *bad,
                         long long *untouched_bad) {
    double worst = 0;
    *untouched_bad = 0;
    long long checks = sample ? sample : d->R * n;
    for (long long i = 0; i < checks; i++) {
        long long r = sample ? rng_int((int)d->R) : i / n, c = sample ? rng_int((int)n) : i % n;
        const uint16_t g = got[r * n + c];
        if (d->row_slot[r] < 0) {
            *untouched_bad += g != 0xffff;
            continue;
        }
        double mag, w = want(d, r, c, &mag);
        double wr = hf(d, moe_float_to_half((float)w, d->dt));
        double tol = d->ulp * fabs(wr) + 1e-4 * mag + d->tiny, err = fabs(hf(d, g) - wr);
        if (!(err <= tol)) {
            if (*bad < 5)
                fprintf(stderr, "    row %lld (slot %d) col %lld: got %g, want %g (tol %g)\n", r, d->row_slot[r], c,
                        hf(d, g), wr, tol);
            ++*bad;
        }
        if (err / tol > worst || isnan(err))
            worst = isnan(err) ? INFINITY : err / tol;
    }
    return worst;
}

static double want_dgrad_down(const bdata_t *d, long long r, long long pc, double *mag) {
    /* pc is a packed column of dU: its output column f and whether gate or up */
    const long long F = d->F, H = d->H, pl = moe_unpack_row(pc, F), f = pl >= F ? pl - F : pl;
    const int slot = d->slot_of[d->row_slot[r]];
    double da = 0, m = 0;
    for (long long h = 0; h < H; h++) {
        double t = hf(d, d->dys[r * H + h]) * hf(d, d->w2[((long long)slot * H + h) * F + f]);
        da += t, m += fabs(t);
    }
    const double gate = hf(d, d->ur[r * 2 * F + moe_pack_row(f, F)]), up = hf(d, d->ur[r * 2 * F + moe_pack_row(F + f, F)]);
    double dg, du, mg, mu;
    act_bwd(d->s, gate, up, da, &dg, &du);
    act_bwd(d->s, gate, up, m, &mg, &mu);
    *mag = pl >= F ? fabs(mu) : fabs(mg);
    return pl >= F ? du : dg;
}

static double want_dgrad_up(const bdata_t *d, long long r, long long h, double *mag) {
    const long long F2 = 2 * d->F, H = d->H;
    const int slot = d->slot_of[d->row_slot[r]];
    double s = 0, m = 0;
    for (long long j = 0; j < F2; j++) {
        double t = hf(d, d->du[r * F2 + j]) * hf(d, d->w1p[((long long)slot * F2 + j) * H + h]);
        s += t, m += fabs(t);
    }
    *mag = m;
    return s;
}

/* Check a wgrad output [S, M, N] fp32: got[slot_of[g]] = (beta ? before : 0) + Σ_rows of g a[r, m] b[r, n]. */
static double check_wgrad(const bdata_t *d, const float *got, const float *before, int beta, const uint16_t *a,
                          long long lda, const uint16_t *b, long long ldb, long long M, long long N, int sample,
                          int *bad) {
    double worst = 0;
    long long checks = sample ? sample : d->S * M * N;
    for (long long i = 0; i < checks; i++) {
        long long e = sample ? rng_int((int)d->S) : i / (M * N), m = sample ? rng_int((int)M) : i / N % M,
                  n = sample ? rng_int((int)N) : i % N;
        const long long at = ((long long)d->slot_of[e] * M + m) * N + n;
        double s = 0, mag = 0;
        for (long long r = d->offsets[e]; r < d->offsets[e] + d->counts[e]; r++) {
            double t = hf(d, a[r * lda + m]) * hf(d, b[r * ldb + n]);
            s += t, mag += fabs(t);
        }
        int ok;
        double err = 0, tol = 1e-4 * mag + 1e-6;
        if (beta && d->counts[e] == 0) { /* an empty slot leaves its accumulator, bit for bit */
            ok = memcmp(&got[at], &before[at], sizeof *got) == 0;
        } else {
            const double want = s + (beta ? before[at] : 0);
            err = fabs(got[at] - want);
            ok = err <= tol;
        }
        if (!ok) {
            if (*bad < 5)
                fprintf(stderr, "    slot %lld (%d rows) [%lld, %lld]: got %g, want %g (tol %g)\n", e, d->counts[e], m, n,
                        got[at], s + (beta ? before[at] : 0), tol);
            ++*bad;
        }
        worst = fmax(worst, isnan(err) ? INFINITY : err / tol);
    }
    return worst;
}

/* The CPU case (it runs without a GPU too): act_bwd above against the CPU
 * reference's backward (moe_ref_backward's stages Ur, dA -> dU), on a tiny
 * layer whose clamp (limit 1) cuts often, for SwiGLU with alpha and
 * up_offset, GeGLU and plain SwiGLU, bf16 and fp16. Both round dU once to
 * the dtype; they may differ by one unit in the last place. */
static void check_act_bwd_against_ref(uint64_t seed) {
    static const char *const specs[] = {
        "name = 'a1' experts = 4 top_k = 2 hidden = 16 ffn = 16 tokens = 8 ffn_bias = true\n"
        "activation = { alpha = 1.702, limit = 1.0, up_offset = 1 }\n",
        "name = 'a2' experts = 4 top_k = 2 hidden = 16 ffn = 16 tokens = 8 dtype = 'fp16'\n"
        "activation = { kind = 'geglu', limit = 1.0, up_offset = 1 }\n",
        "name = 'a3' experts = 4 top_k = 2 hidden = 16 ffn = 16 tokens = 8\n",
    };
    rng_state = seed;
    for (size_t c = 0; c < sizeof specs / sizeof *specs; c++) {
        char label[128];
        snprintf(label, sizeof label, "activation backward against moe_ref_backward: spec %zu", c + 1);
        CASE(label);
        moe_spec_t s;
        moe_diag_t dg;
        if (moe_spec_load(&s, "act.moe", specs[c], NULL, 0, &dg)) {
            CHECKF(0, "%s", dg.msg);
            continue;
        }
        const int T = s.tokens, E = s.experts, K = s.top_k, H = s.hidden, F = s.ffn;
        bdata_t d = {.s = &s, .dt = s.dtype};
        uint16_t *x = NULL, *wr, *w1, *w2, *b1, *b2, *dy;
        d.row_slot = NULL;
        x = random_half(&d, (size_t)T * H, -1, 1, 0), wr = random_half(&d, (size_t)E * H, -1, 1, 0);
        w1 = random_half(&d, (size_t)E * 2 * F * H, -1, 1, 0), w2 = random_half(&d, (size_t)E * H * F, -1, 1, 0);
        b1 = random_half(&d, (size_t)E * 2 * F, -1, 1, 0), b2 = random_half(&d, (size_t)E * H, -1, 1, 0);
        dy = random_half(&d, (size_t)T * H, -1, 1, 0);
        float *u = malloc(sizeof(float) * T * K * 2 * F), *da = malloc(sizeof(float) * T * K * F),
              *du = malloc(sizeof(float) * T * K * 2 * F), *dx = malloc(sizeof(float) * T * H);
        moe_ref_inputs_t in = {.x = x, .wr = wr, .w1 = w1, .w2 = w2, .b1 = s.ffn_bias ? b1 : NULL,
                               .b2 = s.ffn_bias ? b2 : NULL, .tokens = T};
        moe_ref_grads_t g = {.dx = dx};
        moe_ref_bwd_stages_t st = {.u = u, .da = da, .du = du};
        if (!x || !wr || !w1 || !w2 || !b1 || !b2 || !dy || !u || !da || !du || !dx ||
            moe_ref_backward(&s, &in, dy, 0, &g, &st) != 0) {
            CHECKF(0, "moe_ref_backward failed");
        } else {
            const double ulp = s.dtype == MOE_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
            int bad = 0, cut = 0;
            for (long long r = 0; r < (long long)T * K; r++)
                for (int f = 0; f < F; f++) {
                    double dgate, dup;
                    const double gate = u[r * 2 * F + f], up = u[r * 2 * F + F + f];
                    act_bwd(&s, gate, up, da[r * F + f], &dgate, &dup);
                    cut += s.activation.limit > 0 && (gate > s.activation.limit || fabs(up) > s.activation.limit);
                    const double want[2] = {du[r * 2 * F + f], du[r * 2 * F + F + f]}, got[2] = {dgate, dup};
                    for (int j = 0; j < 2; j++) {
                        const double gr = moe_half_to_float(moe_float_to_half((float)got[j], s.dtype), s.dtype);
                        if (!(fabs(gr - want[j]) <= ulp * fabs(want[j]) + 1e-7)) {
                            if (bad++ < 5)
                                fprintf(stderr, "    row %lld f %d %s: ours %g, ref %g (gate %g, up %g, dA %g)\n", r, f,
                                        j ? "up" : "gate", gr, want[j], gate, up, da[r * F + f]);
                        }
                    }
                }
            CHECKF(bad == 0, "%d of %d values differ by more than one unit in the last place", bad, T * K * F * 2);
            if (s.activation.limit > 0)
                CHECKF(cut > 0, "the clamp never cut: the case does not test it");
        }
        free(x), free(wr), free(w1), free(w2), free(b1), free(b2), free(dy), free(u), free(da), free(du), free(dx);
    }
}

/* Time `reps` launches of kind on stream 0 with CUDA events: ms per launch. */
static double time_kind(const moe_launcher_t *l, moe_bgemm_kind kind, const moe_bgemm_args *args, int reps) {
    CUevent e0, e1;
    float ms = 0;
    moe_cu.cuEventCreate(&e0, 0);
    moe_cu.cuEventCreate(&e1, 0);
    moe_bgemm_launch(l, kind, args, NULL);
    moe_cu.cuEventRecord(e0, NULL);
    for (int i = 0; i < reps; i++)
        moe_bgemm_launch(l, kind, args, NULL);
    moe_cu.cuEventRecord(e1, NULL);
    moe_cu.cuEventSynchronize(e1);
    moe_cu.cuEventElapsedTime(&ms, e0, e1);
    moe_cu.cuEventDestroy(e0);
    moe_cu.cuEventDestroy(e1);
    return ms / reps;
}

static void run_case(const bcase_t *bc, uint64_t seed, const char *cache, int perf) {
    char label[256];
    rng_state = seed;
    snprintf(label, sizeof label, "%s: plan", bc->name);
    CASE(label);
    moe_options o = {.cache_dir = cache, .cudnn = MOE_CUDNN_OFF};
    moe_plan *plan = NULL;
    moe_status st = strchr(bc->spec, '=') ? moe_plan_create_text(&plan, bc->name, bc->spec, &o)
                                          : moe_plan_create(&plan, bc->spec, &o);
    if (st == MOE_ERR_UNSUPPORTED) { /* e.g. a training plan with a shared expert, where the runtime refuses it */
        SKIP("%s", moe_last_error());
        return;
    }
    CHECKF(st == MOE_OK, "%s", moe_last_error());
    if (st != MOE_OK)
        return;
    const moe_launcher_t *l = &plan->launcher;
    const moe_spec_t *s = &plan->pd.spec;
    CHECK(l->bgemm != NULL);
    for (int i = 0; i < MOE_BGEMM_COUNT; i++) {
        CHECKF(l->bgemm && l->bgemm_fn[i], "kernel %d in the module", i);
        if (l->bgemm) /* which kernel each kind runs (sm_90a: the dgrads' sm90a_tma_ names) */
            fprintf(stderr, "  %s %s: %s (%s)\n", bc->name, moe_arch_name(l->arch), l->bgemm[i].name,
                    l->bgemm[i].tile.consumers ? "wgmma + TMA" : "mma.sync + cp.async");
    }
    if (!l->bgemm) {
        moe_plan_destroy(plan);
        return;
    }

    /* ragged rows: slot 0 empty, slot 1 one row, slot 2 one row block, the rest random */
    bdata_t d = {.s = s, .dt = s->dtype, .S = moe_spec_slots(s), .H = s->hidden, .F = s->ffn};
    d.ulp = s->dtype == MOE_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
    d.tiny = s->dtype == MOE_DTYPE_BF16 ? ldexp(1, -133) : ldexp(1, -24);
    const int align = plan->pd.align, T = bc->tokens, rows_total = T * s->top_k;
    d.counts = calloc((size_t)d.S, sizeof *d.counts);
    d.slot_of = malloc((size_t)d.S * sizeof *d.slot_of);
    for (int e = 0; e < d.S; e++)
        d.slot_of[e] = e;
    for (int e = s->experts - 1; bc->perm && e > 0; e--) { /* a random permutation of the routed experts' slots */
        int j = rng_int(e + 1), t = d.slot_of[e];
        d.slot_of[e] = d.slot_of[j], d.slot_of[j] = t;
    }
    if (bc->perm) {
        st = moe_plan_set_slot_table(plan, d.slot_of);
        CHECKF(st == MOE_OK && !l->slot_identity, "%s", moe_last_error());
    }
    d.offsets = calloc((size_t)d.S + 1, sizeof *d.offsets);
    int left = rows_total;
    const int fixed[3] = {0, 1, align};
    for (int e = 0; e < 3 && e < d.S; e++)
        left -= d.counts[e] = fixed[e] < left ? fixed[e] : left;
    for (int i = 0; i < left; i++)
        d.counts[3 + rng_int((int)d.S - 3)]++;
    for (int e = 0; e < d.S; e++)
        d.offsets[e + 1] = d.offsets[e] + (d.counts[e] + align - 1) / align * align;
    d.R = d.offsets[d.S] + align; /* and one pad block at the end */
    d.row_slot = malloc((size_t)d.R * sizeof *d.row_slot);
    for (long long r = 0; r < d.R; r++)
        d.row_slot[r] = -1;
    int ntiles = 0;
    int(*tiles)[4] = calloc((size_t)d.R / align + 1, sizeof *tiles);
    for (int e = 0; e < d.S; e++) {
        for (int r = 0; r < d.counts[e]; r++)
            d.row_slot[d.offsets[e] + r] = e;
        for (int r = 0; r < d.counts[e]; r += align) {
            int n = d.counts[e] - r < align ? d.counts[e] - r : align;
            tiles[ntiles][0] = d.slot_of[e], tiles[ntiles][1] = d.offsets[e] + r, tiles[ntiles][2] = n, tiles[ntiles][3] = 0;
            ntiles++;
        }
    }
    const long long H = d.H, F = d.F, F2 = 2 * F, R = d.R, S = d.S;
    const double ulim = s->activation.limit > 0 ? s->activation.limit + 2 : 4;
    d.dys = random_half(&d, (size_t)(R * H), -1, 1, H);
    d.w2 = random_half(&d, (size_t)(S * H * F), -0.2, 0.2, 0);
    d.ur = random_half(&d, (size_t)(R * F2), -ulim, ulim, F2);
    d.du = random_half(&d, (size_t)(R * F2), -1, 1, F2);
    d.w1p = random_half(&d, (size_t)(S * F2 * H), -0.2, 0.2, 0);
    d.xs = random_half(&d, (size_t)(R * H), -1, 1, H);
    d.a = random_half(&d, (size_t)(R * F), -1, 1, F);

    CUdeviceptr g_dys = upload(d.dys, 2 * R * H), g_w2 = upload(d.w2, 2 * S * H * F), g_ur = upload(d.ur, 2 * R * F2),
                g_du = upload(d.du, 2 * R * F2), g_w1p = upload(d.w1p, 2 * S * F2 * H), g_xs = upload(d.xs, 2 * R * H),
                g_a = upload(d.a, 2 * R * F), g_tiles = upload(tiles, 16 * (size_t)ntiles), g_nt = upload(&ntiles, 4),
                g_off = upload(d.offsets, 4 * (S + 1)), g_cnt = upload(d.counts, 4 * S);
    /* one output buffer: the fp32 weight gradients or the widest dtype rows */
    const size_t wbytes = (size_t)(4 * S * F2 * H), rbytes = (size_t)(2 * R * (F2 > H ? F2 : H));
    const size_t out_bytes = wbytes > rbytes ? wbytes : rbytes;
    CUdeviceptr g_out = upload(NULL, out_bytes);
    void *host = malloc(out_bytes), *before = malloc(out_bytes);
    if (!g_dys || !g_w2 || !g_ur || !g_du || !g_w1p || !g_xs || !g_a || !g_tiles || !g_nt || !g_off || !g_cnt ||
        !g_out || !host || !before) {
        CHECKF(0, "allocations");
        goto done;
    }
    moe_bgemm_args base = {.tokens = T, .tiles = g_tiles, .num_tiles = g_nt, .offsets = g_off, .counts = g_cnt};
    int bad;
    double worst;
    long long untouched;

    /* dgrad_down: out separate, then in place over a copy of Ur */
    for (int inplace = 0; inplace < 2; inplace++) {
        snprintf(label, sizeof label, "dgrad_down: %s %s T%d%s", bc->name, moe_dtype_name(d.dt), T,
                 inplace ? " in place" : "");
        CASE(label);
        if (inplace) /* Ur's pad rows hold the same poison */
            moe_cu.cuMemcpyDtoDAsync(g_out, g_ur, 2 * R * F2, NULL);
        else
            moe_cu.cuMemsetD8(g_out, 0xff, 2 * R * F2);
        moe_bgemm_args a = base;
        a.a = g_dys, a.b = g_w2, a.u = inplace ? g_out : g_ur, a.out = g_out;
        st = moe_bgemm_launch(l, MOE_BGEMM_DGRAD_DOWN, &a, NULL);
        CHECKF(st == MOE_OK, "%s", moe_last_error());
        CHECK(cu_ok(moe_cu.cuCtxSynchronize(), "dgrad_down") &&
              cu_ok(moe_cu.cuMemcpyDtoH(host, g_out, 2 * R * F2), "copy dU"));
        bad = 0;
        worst = check_half(&d, host, F2, want_dgrad_down, bc->sample, &bad, &untouched);
        CHECKF(bad == 0, "%d elements out of tolerance (worst %.2f of the tolerance)", bad, worst);
        CHECKF(untouched == 0, "%lld pad-row elements written", untouched);
        fprintf(stderr, "  %s: worst error %.3f of the tolerance\n", label, worst);
    }

    /* dgrad_up */
    snprintf(label, sizeof label, "dgrad_up: %s %s T%d", bc->name, moe_dtype_name(d.dt), T);
    CASE(label);
    moe_cu.cuMemsetD8(g_out, 0xff, 2 * R * H);
    {
        moe_bgemm_args a = base;
        a.a = g_du, a.b = g_w1p, a.out = g_out;
        st = moe_bgemm_launch(l, MOE_BGEMM_DGRAD_UP, &a, NULL);
        CHECKF(st == MOE_OK, "%s", moe_last_error());
        CHECK(cu_ok(moe_cu.cuCtxSynchronize(), "dgrad_up") && cu_ok(moe_cu.cuMemcpyDtoH(host, g_out, 2 * R * H), "copy"));
        bad = 0;
        worst = check_half(&d, host, H, want_dgrad_up, bc->sample, &bad, &untouched);
        CHECKF(bad == 0, "%d elements out of tolerance (worst %.2f of the tolerance)", bad, worst);
        CHECKF(untouched == 0, "%lld pad-row elements written", untouched);
        fprintf(stderr, "  %s: worst error %.3f of the tolerance\n", label, worst);
    }

    /* the wgrads, beta 0 on a poisoned buffer, then beta 1 on random values */
    for (int up = 1; up >= 0; up--)
        for (int beta = 0; beta < 2; beta++) {
            const long long M = up ? F2 : H, N = up ? H : F, n = S * M * N;
            snprintf(label, sizeof label, "%s: %s %s T%d beta %d", up ? "wgrad_up" : "wgrad_down", bc->name,
                     moe_dtype_name(d.dt), T, beta);
            CASE(label);
            float *b = before;
            for (long long i = 0; i < n; i++)
                b[i] = beta ? (float)rng_uniform(-1, 1) : NAN;
            CHECK(cu_ok(moe_cu.cuMemcpyHtoD(g_out, b, 4 * n), "poison"));
            moe_bgemm_args a = base;
            a.a = up ? g_du : g_dys, a.b = up ? g_xs : g_a, a.out = g_out, a.beta = beta;
            st = moe_bgemm_launch(l, up ? MOE_BGEMM_WGRAD_UP : MOE_BGEMM_WGRAD_DOWN, &a, NULL);
            CHECKF(st == MOE_OK, "%s", moe_last_error());
            CHECK(cu_ok(moe_cu.cuCtxSynchronize(), label) && cu_ok(moe_cu.cuMemcpyDtoH(host, g_out, 4 * n), "copy"));
            bad = 0;
            worst = check_wgrad(&d, host, b, beta, up ? d.du : d.dys, up ? F2 : H, up ? d.xs : d.a, up ? H : F, M, N,
                                bc->sample, &bad);
            CHECKF(bad == 0, "%d elements out of tolerance (worst %.2f of the tolerance)", bad, worst);
            fprintf(stderr, "  %s: worst error %.3f of the tolerance\n", label, worst);
        }

    /* refusals: beta 1 on a dgrad, a missing operand, a wgrad's misaligned output */
    snprintf(label, sizeof label, "refusals: %s", bc->name);
    CASE(label);
    {
        moe_bgemm_args a = base;
        a.a = g_dys, a.b = g_w2, a.u = g_ur, a.out = g_out, a.beta = 1;
        CHECK(moe_bgemm_launch(l, MOE_BGEMM_DGRAD_DOWN, &a, NULL) == MOE_ERR_INVALID_ARG);
        a.beta = 0, a.u = 0;
        CHECK(moe_bgemm_launch(l, MOE_BGEMM_DGRAD_DOWN, &a, NULL) == MOE_ERR_INVALID_ARG);
        CHECK(strstr(moe_last_error(), "u is NULL") != NULL);
        a.a = g_du, a.b = g_xs, a.u = 0, a.out = g_out + 8; /* a wgrad's out off its 16-byte alignment */
        CHECK(moe_bgemm_launch(l, MOE_BGEMM_WGRAD_UP, &a, NULL) == MOE_ERR_INVALID_ARG);
        CHECK(strstr(moe_last_error(), "16-byte aligned") != NULL);
    }

    if (perf) { /* each kind's time and TFLOP/s (2 x rows x the output's N x K) */
        moe_bgemm_args a = base;
        const double rows = rows_total;
        struct { moe_bgemm_kind k; CUdeviceptr a, b, u; double flop; const char *name; } kinds[4] = {
            {MOE_BGEMM_DGRAD_DOWN, g_dys, g_w2, g_ur, 2 * rows * F * H, "dgrad_down"},
            {MOE_BGEMM_DGRAD_UP, g_du, g_w1p, 0, 2 * rows * H * F2, "dgrad_up"},
            {MOE_BGEMM_WGRAD_UP, g_du, g_xs, 0, 2 * rows * F2 * H, "wgrad_up"},
            {MOE_BGEMM_WGRAD_DOWN, g_dys, g_a, 0, 2 * rows * H * F, "wgrad_down"},
        };
        for (int i = 0; i < 4; i++) {
            a.a = kinds[i].a, a.b = kinds[i].b, a.u = kinds[i].u, a.out = g_out, a.beta = 0;
            double ms = time_kind(l, kinds[i].k, &a, 20);
            fprintf(stderr, "  perf %s %s: %lld rows, H %lld, F %lld: %.3f ms, %.1f TFLOP/s\n", bc->name,
                    kinds[i].name, (long long)rows_total, H, F, ms, kinds[i].flop / (ms * 1e-3) / 1e12);
        }
    }
done:
    moe_cu.cuCtxSynchronize();
    CUdeviceptr all[] = {g_dys, g_w2, g_ur, g_du, g_w1p, g_xs, g_a, g_tiles, g_nt, g_off, g_cnt, g_out};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    free(host), free(before), free(tiles), free(d.counts), free(d.offsets), free(d.row_slot), free(d.slot_of);
    free(d.dys), free(d.w2), free(d.ur), free(d.du), free(d.w1p), free(d.xs), free(d.a);
    moe_plan_destroy(plan);
}

int main(int argc, char **argv) {
    int perf = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--perf") == 0) {
            perf = 1;
        } else {
            fprintf(stderr, "usage: test_bgemm_gpu [--perf]\n");
            return 2;
        }
    }
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *env = getenv("MOEGEN_TEST_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 10);
    fprintf(stderr, "test_bgemm_gpu: seed %llu (MOEGEN_TEST_SEED=%llu repeats this run)\n",
            (unsigned long long)seed, (unsigned long long)seed);
    check_act_bwd_against_ref(seed ^ 0x5eed);
    char why[512];
    CASE("driver");
    if (moe_cu_load(why, sizeof why) != 0) {
        SKIP("every GPU case: no CUDA driver (%s)", why);
        return check_report("test_bgemm_gpu");
    }
    int count = 0;
    if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
        SKIP("every GPU case: the driver reports no GPU");
        return check_report("test_bgemm_gpu");
    }
    char dir[] = "/tmp/moegen_test_bgemm_XXXXXX", cache[300];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(cache, sizeof cache, "%s/cache", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(&cases[i], seed + i * 1000, cache, 0);
    if (perf)
        run_case(&perf_case, seed + 99000, cache, 1);
    return check_report("test_bgemm_gpu");
}
