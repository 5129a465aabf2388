/* test_quant_gpu.c — the fp8 expert GEMMs on the GPU (issue #20), each run
 * alone through the plan's launcher on a ragged tile table (empty experts,
 * partial tiles), against the CPU reference's quantized math
 * (tests/support/ref.c, moe_ref_fp8_gemm):
 *   up    e4m3 rows x packed e4m3 W1 (scales per 128 K) -> activation ->
 *         e4m3 rows + one scale per row per 128 columns; compared
 *         dequantized (normalized L2) and code by code (one e4m3 step at
 *         most: the GPU's sums differ from the reference's in the last bits,
 *         which moves a value across a rounding boundary now and then);
 *   down  the GPU's own e4m3 rows x packed W2 -> bf16, normalized L2.
 * Fresh random inputs each run (MOEGEN_TEST_SEED repeats one), outputs
 * poisoned before each launch, rows past each tile's `rows` must stay
 * poisoned. And the device-side fp8 packs (moe_plan_pack_fp8_async from
 * e4m3 + scales, moe_plan_pack_quantize_async from bf16) equal to the host
 * packs byte for byte; and the fp8 permute scatter (rows quantized on the
 * way into expert order) equal to the host's quantization byte for byte.
 * And the whole fp8 layer through moe_forward (check_layer): route, the
 * quantizing scatter, both fp8 GEMMs and combine, on fresh random x and
 * weights packed by the library (bf16 quantized by moe_plan_pack_quantize,
 * or a checkpoint's e4m3 + scales by moe_plan_pack_fp8; on the device for
 * the example specs), y and the workspace poisoned, eager and replayed from
 * a CUDA graph, against the CPU's quantized recipe (moe_ref_ffn on the
 * GPU's routing) and the bf16 layer; for every case below and every
 * one-device spec in examples/specs/fp8/. Skips without a GPU. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "driver.h"
#include "moe.h"
#include "moe_impl.h" /* white box: the plan's launcher */
#include "moe_internal.h"
#include "pack_geom.h" /* moe_pack_row: the reference's weights unpacked */
#include "ref.h"

static uint64_t rng;
static float frand(void) { /* [-1, 1), never 0 */
    float v;
    do {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        v = (float)((rng >> 40) * 0x1p-24) * 2.0f - 1.0f;
    } while (v == 0.0f);
    return v;
}

static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 1;
    fprintf(stderr, "CUDA error in %s: %s\n", what, moe_cu_error_string(r));
    return 0;
}

static CUdeviceptr up_load(const void *host, size_t bytes) {
    CUdeviceptr d = 0;
    if (!cu_ok(moe_cu.cuMemAlloc(&d, bytes), "cuMemAlloc"))
        return 0;
    if (host && !cu_ok(moe_cu.cuMemcpyHtoD(d, host, bytes), "cuMemcpyHtoD")) {
        moe_cu.cuMemFree(d);
        return 0;
    }
    return d;
}

typedef struct {
    int expert, row_start, rows, pad;
} tile_t;

/* one spec: name, text; layer_only: the whole layer's checks alone (the
 * kernels-alone checks below assume 6 experts) */
typedef struct {
    const char *label, *text;
    int layer_only;
} fp8_case_t;

static const fp8_case_t cases[] = {
    {"block", "name = 'q8b'\nexperts = 6\ntop_k = 2\nhidden = 512\nffn = 384\ntokens = 512\n"
              "quant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 0},
    {"channel, ffn_bias, hidden not a multiple of 256",
     "name = 'q8c'\nexperts = 6\ntop_k = 2\nhidden = 640\nffn = 256\ntokens = 512\nffn_bias = true\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'channel' }\n", 0},
    {"block, router.apply = input", "name = 'q8i'\nexperts = 6\ntop_k = 2\nhidden = 384\nffn = 128\ntokens = 512\n"
                                    "router = { apply = 'input' }\nquant = { weights = 'fp8_e4m3' }\n", 0},
    {"block, Qwen3-30B-A3B's H and F", "name = 'q8q'\nexperts = 6\ntop_k = 2\nhidden = 2048\nffn = 768\n"
                                       "tokens = 512\nquant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 0},
    {"block, top_k 1", "name = 'q8k1'\nexperts = 8\ntop_k = 1\nhidden = 256\nffn = 384\ntokens = 300\n"
                       "quant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 1},
    {"channel, top_k 8, sigmoid groups, router.bias",
     "name = 'q8k8'\nexperts = 16\ntop_k = 8\nhidden = 384\nffn = 256\ntokens = 700\n"
     "router = { score = 'sigmoid', bias = true, groups = 4, topk_groups = 2, renormalize = true, scale = 2.5 }\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'channel' }\n", 1},
    {"channel, top_k 1, router.apply = input, ffn_bias",
     "name = 'q8li'\nexperts = 4\ntop_k = 1\nhidden = 512\nffn = 256\ntokens = 200\nffn_bias = true\n"
     "router = { score = 'sigmoid', apply = 'input' }\nquant = { weights = 'fp8_e4m3', scaling = 'channel' }\n", 1},
};

/* The one-device example specs of examples/specs/fp8/ (paths from the
 * repository's root, where the tests run), the whole layer at their own
 * shapes (the EP8 mesh spec there is test_ep_gpu's and test_mgpu's kind). */
static const char *const example_specs[] = {
    "examples/specs/fp8/deepseek-v3-ep8-fp8.moe",
    "examples/specs/fp8/mixtral-8x7b-fp8.moe",
    "examples/specs/fp8/qwen3-30b-a3b-fp8.moe",
};

/* e4m3 codes a and b are at most one step apart (same sign, magnitude codes
 * adjacent), or equal. */
static int near_code(uint8_t a, uint8_t b) {
    if (a == b)
        return 1;
    if ((a & 0x80) != (b & 0x80))
        return (a & 0x7F) <= 1 && (b & 0x7F) <= 1;
    return abs((int)(a & 0x7F) - (int)(b & 0x7F)) <= 1;
}

/* The device packs against the host packs: W1 from separate e4m3 gate/up
 * [E, F, H] with their scales, W2 from e4m3 [E, H, F]; bf16 W1 fused and
 * W2 transposed quantized; into poisoned tensors, slots 1..E-1 (slot 0
 * must stay poisoned). */
static void check_packs(const moe_plan *plan, const char *label_base) {
    const moe_spec_t *s = &plan->pd.spec;
    const long long E = s->experts, F = s->ffn, H = s->hidden;
    const int blk = s->quant.scaling == MOE_SCALING_BLOCK;
    const long long gsr = blk ? F / 128 : F, gsc = blk ? H / 128 : 1; /* a gate (or up) scale grid per expert */
    const long long s1 = 2 * gsr * gsc, s2 = blk ? (H / 128) * (F / 128) : H;
    const size_t n1 = (size_t)(E * 2 * F * H), n2 = (size_t)(E * H * F);
    char label[200];
    snprintf(label, sizeof label, "fp8 %s: device packs equal the host's", label_base);
    CASE(label);
    uint8_t *gq = malloc(n1), *w2q8 = malloc(n2), *hq1 = malloc(n1), *dq1 = malloc(n1), *hq2 = malloc(n2), *dq2 = malloc(n2);
    float *gs = malloc(sizeof(float) * (size_t)(E * s1)), *hs1 = malloc(sizeof(float) * (size_t)(E * s1)),
          *ds1 = malloc(sizeof(float) * (size_t)(E * s1)), *ws2 = malloc(sizeof(float) * (size_t)(E * s2)),
          *hs2 = malloc(sizeof(float) * (size_t)(E * s2)), *ds2 = malloc(sizeof(float) * (size_t)(E * s2));
    uint16_t *w1 = malloc(n1 * 2), *w2t = malloc(n2 * 2);
    for (size_t i = 0; i < n1; i++)
        gq[i] = (uint8_t)((unsigned)(fabsf(frand()) * 1e6f) % 0x7E + 1), w1[i] = moe_float_to_half(frand() * 0.2f, MOE_DTYPE_BF16);
    for (size_t i = 0; i < n2; i++)
        w2q8[i] = (uint8_t)((unsigned)(fabsf(frand()) * 1e6f) % 0x7E + 1), w2t[i] = moe_float_to_half(frand() * 3.0f, MOE_DTYPE_BF16);
    for (long long i = 0; i < E * s1; i++)
        gs[i] = fabsf(frand());
    for (long long i = 0; i < E * s2; i++)
        ws2[i] = fabsf(frand());
    CUdeviceptr dg = up_load(gq, n1), dw2 = up_load(w2q8, n2), dgs = up_load(gs, sizeof(float) * (size_t)(E * s1)),
                dws2 = up_load(ws2, sizeof(float) * (size_t)(E * s2)), dw1 = up_load(w1, n1 * 2),
                dw2t = up_load(w2t, n2 * 2), dq = up_load(NULL, n1 > n2 ? n1 : n2),
                dsc = up_load(NULL, sizeof(float) * (size_t)(E * (s1 > s2 ? s1 : s2))); /* W1's and W2's jobs */
    if (!dg || !dw2 || !dgs || !dws2 || !dw1 || !dw2t || !dq || !dsc)
        goto done;
    for (int job = 0; job < 4; job++) { /* pack W1, pack W2, quantize W1, quantize W2 */
        const int w1job = job % 2 == 0;
        const size_t nq = w1job ? n1 : n2, ns = (size_t)(E * (w1job ? s1 : s2));
        uint8_t *hq = w1job ? hq1 : hq2, *dqh = w1job ? dq1 : dq2;
        float *hs = w1job ? hs1 : hs2, *dsh = w1job ? ds1 : ds2;
        memset(hq, 0xff, nq);
        memset(hs, 0xff, ns * 4);
        CHECK(cu_ok(moe_cu.cuMemsetD8(dq, 0xff, nq), "poison") && cu_ok(moe_cu.cuMemsetD8(dsc, 0xff, ns * 4), "poison"));
        moe_pack_args a, da, sa, dsa;
        moe_status h = MOE_OK, d = MOE_OK;
        if (job == 0) { /* gate = the first half of gq's experts' rows, up the second: separate [E, F, H] views */
            moe_plan_pack_layout(plan, MOE_LAYOUT_W1_SEPARATE, gq, gq + F * H, 1, (int)E - 1, &a);
            a.src[0].expert = a.src[1].expert = 2 * F * H;
            da = a;
            da.src[0].ptr = (const void *)(uintptr_t)dg, da.src[1].ptr = (const void *)(uintptr_t)(dg + F * H);
            sa = (moe_pack_args){.tensor = MOE_TENSOR_W1, .first = 1, .count = (int)E - 1};
            sa.src[0] = (moe_pack_src){gs, s1, gsc, 1};
            sa.src[1] = (moe_pack_src){gs + gsr * gsc, s1, gsc, 1};
            dsa = sa;
            dsa.src[0].ptr = (const void *)(uintptr_t)dgs, dsa.src[1].ptr = (const void *)(uintptr_t)(dgs + 4 * gsr * gsc);
        } else if (job == 1) {
            moe_plan_pack_layout(plan, MOE_LAYOUT_W2, w2q8, NULL, 1, (int)E - 1, &a);
            da = a;
            da.src[0].ptr = (const void *)(uintptr_t)dw2;
            sa = (moe_pack_args){.tensor = MOE_TENSOR_W2, .first = 1, .count = (int)E - 1};
            sa.src[0] = (moe_pack_src){ws2, s2, blk ? F / 128 : 1, 1};
            dsa = sa;
            dsa.src[0].ptr = (const void *)(uintptr_t)dws2;
        } else {
            moe_plan_pack_layout(plan, job == 2 ? MOE_LAYOUT_W1_FUSED : MOE_LAYOUT_W2_T, job == 2 ? (const void *)w1 : (const void *)w2t,
                                 NULL, 1, (int)E - 1, &a);
            moe_plan_pack_layout(plan, job == 2 ? MOE_LAYOUT_W1_FUSED : MOE_LAYOUT_W2_T,
                                 (const void *)(uintptr_t)(job == 2 ? dw1 : dw2t), NULL, 1, (int)E - 1, &da);
        }
        if (job < 2) {
            h = moe_plan_pack_fp8(plan, &a, &sa, hq, hs);
            d = moe_plan_pack_fp8_async(plan, &da, &dsa, (void *)(uintptr_t)dq, (float *)(uintptr_t)dsc, NULL);
        } else {
            h = moe_plan_pack_quantize(plan, &a, hq, hs);
            d = moe_plan_pack_quantize_async(plan, &da, (void *)(uintptr_t)dq, (float *)(uintptr_t)dsc, NULL);
        }
        CHECKF(h == MOE_OK && d == MOE_OK, "job %d: host %d, device %d: %s", job, h, d, moe_last_error());
        CUresult r = moe_cu.cuCtxSynchronize();
        CHECKF(r == CUDA_SUCCESS, "job %d faulted: %s", job, moe_cu_error_string(r));
        if (r != CUDA_SUCCESS || !cu_ok(moe_cu.cuMemcpyDtoH(dqh, dq, nq), "q") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(dsh, dsc, ns * 4), "scales"))
            goto done;
        long long diff = 0, untouched = 1;
        for (size_t i = 0; i < nq; i++)
            diff += hq[i] != dqh[i];
        diff += memcmp(hs, dsh, ns * 4) != 0;
        untouched = hq[0] == 0xff && dqh[0] == 0xff; /* slot 0 not written */
        CHECKF(diff == 0 && untouched, "%s: %lld bytes differ between the device and the host%s",
               job == 0 ? "pack W1" : job == 1 ? "pack W2" : job == 2 ? "quantize W1" : "quantize W2", diff,
               untouched ? "" : ", slot 0 written");
    }
done:;
    CUdeviceptr all[] = {dg, dw2, dgs, dws2, dw1, dw2t, dq, dsc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    free(gq), free(w2q8), free(hq1), free(dq1), free(hq2), free(dq2), free(gs), free(hs1), free(ds1), free(ws2), free(hs2),
        free(ds2), free(w1), free(w2t);
}

/* The fp8 scatter alone: T tokens' rows to their K expert rows (offsets
 * e * CAP), quantized; each written row equal to moe_ref_fp8_quantize_rows
 * of its token's row byte for byte, every other row left poisoned. */
static void check_scatter(const moe_plan *plan, const char *label_base) {
    const moe_spec_t *s = &plan->pd.spec;
    const moe_launcher_t *l = &plan->launcher;
    const int E = s->experts, K = s->top_k, H = s->hidden, HB = H / 128, T = 50, CAP = 128, R = E * CAP;
    char label[200];
    snprintf(label, sizeof label, "fp8 %s: permute_scatter (%s)", label_base, l->kernels[MOE_K_PERMUTE_SCATTER].name);
    CASE(label);
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H);
    float *xf = malloc(sizeof(float) * (size_t)H), *sc = malloc(sizeof(float) * (size_t)R * HB), want_sc[64];
    int *idx = malloc(sizeof(int) * (size_t)T * K), *row_of = malloc(sizeof(int) * (size_t)T * K), offsets[64], cursor[64];
    float *tw = malloc(sizeof(float) * (size_t)T * K);
    uint8_t *q = malloc((size_t)R * H), *want = malloc((size_t)H), *seen = calloc((size_t)R, 1);
    for (int i = 0; i < T * H; i++) /* magnitudes over a wide range, so blocks differ in scale */
        x[i] = moe_float_to_half(frand() * powf(2.0f, (float)((i / 128) % 9) - 4.0f), MOE_DTYPE_BF16);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            idx[t * K + k] = (t * 7 + k * 3) % E, tw[t * K + k] = 0.25f + 0.5f * fabsf(frand());
    for (int e = 0; e <= E; e++)
        offsets[e] = e * CAP, cursor[e] = 0;
    CUdeviceptr dx = up_load(x, sizeof(uint16_t) * (size_t)T * H), didx = up_load(idx, sizeof(int) * (size_t)T * K),
                dtw = up_load(tw, sizeof(float) * (size_t)T * K), doff = up_load(offsets, sizeof(int) * (size_t)(E + 1)),
                dcur = up_load(cursor, sizeof(int) * (size_t)(E + 1)), dq = up_load(NULL, (size_t)R * H),
                dsc = up_load(NULL, sizeof(float) * (size_t)R * HB), drow = up_load(NULL, sizeof(int) * (size_t)T * K);
    if (!dx || !didx || !dtw || !doff || !dcur || !dq || !dsc || !drow)
        goto done;
    CHECK(cu_ok(moe_cu.cuMemsetD8(dq, 0xff, (size_t)R * H), "poison") &&
          cu_ok(moe_cu.cuMemsetD8(dsc, 0xff, sizeof(float) * (size_t)R * HB), "poison"));
    {
        int tokens = T;
        void *args[] = {&dx, &didx, &dtw, &doff, &dcur, &tokens, &dq, &dsc, &drow};
        moe_status st = moe_launch_kernel(l, MOE_K_PERMUTE_SCATTER, T, 0, NULL, args, NULL);
        CHECKF(st == MOE_OK, "%s", moe_last_error());
        CUresult r = st == MOE_OK ? moe_cu.cuCtxSynchronize() : CUDA_ERROR_UNKNOWN;
        CHECKF(r == CUDA_SUCCESS, "scatter faulted: %s", moe_cu_error_string(r));
        if (r != CUDA_SUCCESS || !cu_ok(moe_cu.cuMemcpyDtoH(q, dq, (size_t)R * H), "xq") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(sc, dsc, sizeof(float) * (size_t)R * HB), "xsc") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(row_of, drow, sizeof(int) * (size_t)T * K), "row_of"))
            goto done;
    }
    long long bad = 0, bad_rows = 0, poisoned_left = 0;
    for (int i = 0; i < T * K; i++) {
        const int t = i / K, e = idx[i], row = row_of[i];
        if (row < offsets[e] || row >= offsets[e] + CAP || seen[row]) {
            bad_rows++;
            continue;
        }
        seen[row] = 1;
        for (int h = 0; h < H; h++) {
            float v = moe_half_to_float(x[(size_t)t * H + h], MOE_DTYPE_BF16);
            if (s->router.apply == MOE_APPLY_INPUT) /* round(x * round(w)), as the reference's input */
                v = moe_half_to_float(moe_float_to_half(v * moe_half_to_float(moe_float_to_half(tw[i], MOE_DTYPE_BF16),
                                                                               MOE_DTYPE_BF16), MOE_DTYPE_BF16), MOE_DTYPE_BF16);
            xf[h] = v;
        }
        moe_ref_fp8_quantize_rows(xf, 1, H, want, want_sc);
        bad += memcmp(q + (size_t)row * H, want, (size_t)H) != 0 || memcmp(sc + (size_t)row * HB, want_sc, sizeof(float) * HB) != 0;
    }
    for (int row = 0; row < R; row++)
        if (!seen[row])
            for (int h = 0; h < H; h++)
                poisoned_left += q[(size_t)row * H + h] != 0xff;
    CHECKF(bad_rows == 0, "%lld slots got a row outside their expert's or a row twice", bad_rows);
    CHECKF(bad == 0, "%lld rows differ from the host's quantization (bytes or scales)", bad);
    CHECKF(poisoned_left == 0, "%lld bytes written in rows no slot owns", poisoned_left);
done:;
    CUdeviceptr all[] = {dx, didx, dtw, doff, dcur, dq, dsc, drow};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    free(x), free(xf), free(sc), free(idx), free(row_of), free(tw), free(q), free(want), free(seen);
}

/* ---- the whole fp8 layer through moe_forward ------------------------------ */

/* rng's next 64 bits */
static uint64_t next64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* dst[i] = bf16 of uniform(-scale, scale), never 0: four values per 64
 * random bits through a table of 65536 levels (the example specs' weights
 * are a billion and more). */
static void fill_bf16(uint16_t *dst, size_t n, float scale) {
    static uint16_t lut[65536];
    for (int i = 0; i < 65536; i++)
        lut[i] = moe_float_to_half((((float)i + 0.5f) / 32768.0f - 1.0f) * scale, MOE_DTYPE_BF16);
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = next64();
        for (size_t j = 0; j < 4 && i + j < n; j++, r >>= 16)
            dst[i + j] = lut[r & 0xFFFF];
    }
}

/* dst[i] = an e4m3 code of uniform(-448, 448) (never NaN, never 0): a
 * checkpoint's quantized weights with their scales drawn apart. */
static void fill_e4m3(uint8_t *dst, size_t n) {
    uint8_t lut[256];
    for (int i = 0; i < 256; i++)
        lut[i] = moe_float_to_e4m3((((float)i + 0.5f) / 128.0f - 1.0f) * 448.0f);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = next64();
        for (size_t j = 0; j < 8 && i + j < n; j++, r >>= 8)
            dst[i + j] = lut[r & 0xFF];
    }
}

enum { WEIGHTS_QUANTIZE, WEIGHTS_CHECKPOINT };

/* The packed fp8 weights of one layer run, on the device, and the same in
 * the plain layout on the host for the reference (rows unpacked with
 * gen/pack_geom.h; the scales are in plain order already). */
typedef struct {
    CUdeviceptr w1q, w1s, w2q, w2s;
    uint8_t *p1q, *p2q; /* plain e4m3 [E, 2F, H], [E, H, F] */
    float *p1s, *p2s;   /* plain scales */
    uint16_t *w1, *w2;  /* WEIGHTS_QUANTIZE: the bf16 source, plain (the bf16 reference's weights) */
} fp8_weights_t;

static void weights_free(fp8_weights_t *w) {
    CUdeviceptr all[] = {w->w1q, w->w1s, w->w2q, w->w2s};
    for (size_t i = 0; i < 4; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    free(w->p1q), free(w->p2q), free(w->p1s), free(w->p2s), free(w->w1), free(w->w2);
    memset(w, 0, sizeof *w);
}

/* Fresh weights for plan's spec, packed by the library: mode
 * WEIGHTS_QUANTIZE from random bf16 (moe_plan_pack_quantize), or
 * WEIGHTS_CHECKPOINT from random e4m3 codes and scales as DeepSeek-V3 ships
 * them (moe_plan_pack_fp8: gate and up separate, W2 [E, H, F]); on the host,
 * or with device = 1 through the _async packs (equal byte for byte:
 * check_packs), for the example specs' billion-element weights. Returns 0
 * on success. */
static int make_weights(const moe_plan *plan, int mode, int device, fp8_weights_t *w) {
    const moe_spec_t *s = &plan->pd.spec;
    const long long E = s->experts, F = s->ffn, H = s->hidden, B = MOE_FP8_BLOCK;
    const int blk = s->quant.scaling == MOE_SCALING_BLOCK;
    const long long gsr = blk ? F / B : F, gsc = blk ? H / B : 1;      /* gate's (or up's) scale grid */
    const long long s1 = 2 * gsr * gsc, s2 = blk ? (H / B) * (F / B) : H; /* scales per expert */
    const size_t n1 = (size_t)(E * 2 * F * H), n2 = (size_t)(E * H * F);
    memset(w, 0, sizeof *w);
    w->p1q = malloc(n1), w->p2q = malloc(n2);
    w->p1s = malloc(sizeof(float) * (size_t)(E * s1)), w->p2s = malloc(sizeof(float) * (size_t)(E * s2));
    uint8_t *q1 = malloc(n1), *q2 = malloc(n2); /* packed, on the host */
    float *c1 = malloc(sizeof(float) * (size_t)(E * s1)), *c2 = malloc(sizeof(float) * (size_t)(E * s2));
    CUdeviceptr src1 = 0, src2 = 0, srs1 = 0, srs2 = 0;
    int rc = 1;
    if (!w->p1q || !w->p2q || !w->p1s || !w->p2s || !q1 || !q2 || !c1 || !c2)
        goto out;
    w->w1q = up_load(NULL, n1), w->w2q = up_load(NULL, n2);
    w->w1s = up_load(NULL, sizeof(float) * (size_t)(E * s1)), w->w2s = up_load(NULL, sizeof(float) * (size_t)(E * s2));
    if (!w->w1q || !w->w2q || !w->w1s || !w->w2s)
        goto out;
    moe_pack_args a1, a2, sa1 = {0}, sa2 = {0};
    moe_status st1, st2;
    if (mode == WEIGHTS_QUANTIZE) {
        w->w1 = malloc(n1 * 2), w->w2 = malloc(n2 * 2);
        if (!w->w1 || !w->w2)
            goto out;
        fill_bf16(w->w1, n1, 2.0f / sqrtf((float)H));
        fill_bf16(w->w2, n2, 2.0f / sqrtf((float)F));
        if (device && (!(src1 = up_load(w->w1, n1 * 2)) || !(src2 = up_load(w->w2, n2 * 2))))
            goto out;
        moe_plan_pack_layout(plan, MOE_LAYOUT_W1_FUSED, device ? (const void *)(uintptr_t)src1 : w->w1, NULL, 0,
                             (int)E, &a1);
        moe_plan_pack_layout(plan, MOE_LAYOUT_W2, device ? (const void *)(uintptr_t)src2 : w->w2, NULL, 0, (int)E,
                             &a2);
        if (device) {
            st1 = moe_plan_pack_quantize_async(plan, &a1, (void *)(uintptr_t)w->w1q, (float *)(uintptr_t)w->w1s, NULL);
            st2 = moe_plan_pack_quantize_async(plan, &a2, (void *)(uintptr_t)w->w2q, (float *)(uintptr_t)w->w2s, NULL);
        } else {
            st1 = moe_plan_pack_quantize(plan, &a1, q1, c1);
            st2 = moe_plan_pack_quantize(plan, &a2, q2, c2);
        }
    } else { /* the checkpoint: plain codes and scales, each scale block its own magnitude */
        fill_e4m3(w->p1q, n1);
        fill_e4m3(w->p2q, n2);
        for (long long i = 0; i < E * s1; i++)
            w->p1s[i] = (0.5f + fabsf(frand())) * (2.0f / sqrtf((float)H)) / 448.0f;
        for (long long i = 0; i < E * s2; i++)
            w->p2s[i] = (0.5f + fabsf(frand())) * (2.0f / sqrtf((float)F)) / 448.0f;
        if (device && (!(src1 = up_load(w->p1q, n1)) || !(src2 = up_load(w->p2q, n2)) ||
                       !(srs1 = up_load(w->p1s, sizeof(float) * (size_t)(E * s1))) ||
                       !(srs2 = up_load(w->p2s, sizeof(float) * (size_t)(E * s2)))))
            goto out;
        const uint8_t *g = device ? (const uint8_t *)(uintptr_t)src1 : w->p1q;
        const float *gs = device ? (const float *)(uintptr_t)srs1 : w->p1s;
        /* gate_proj and up_proj as separate [E, F, H] views of the plain [E, 2F, H] */
        moe_plan_pack_layout(plan, MOE_LAYOUT_W1_SEPARATE, g, g + F * H, 0, (int)E, &a1);
        a1.src[0].expert = a1.src[1].expert = 2 * F * H;
        sa1 = (moe_pack_args){.tensor = MOE_TENSOR_W1, .first = 0, .count = (int)E};
        sa1.src[0] = (moe_pack_src){gs, s1, gsc, 1};
        sa1.src[1] = (moe_pack_src){gs + gsr * gsc, s1, gsc, 1};
        moe_plan_pack_layout(plan, MOE_LAYOUT_W2, device ? (const void *)(uintptr_t)src2 : w->p2q, NULL, 0, (int)E,
                             &a2);
        sa2 = (moe_pack_args){.tensor = MOE_TENSOR_W2, .first = 0, .count = (int)E};
        sa2.src[0] = (moe_pack_src){device ? (const float *)(uintptr_t)srs2 : w->p2s, s2, blk ? F / B : 1, 1};
        if (device) {
            st1 = moe_plan_pack_fp8_async(plan, &a1, &sa1, (void *)(uintptr_t)w->w1q, (float *)(uintptr_t)w->w1s, NULL);
            st2 = moe_plan_pack_fp8_async(plan, &a2, &sa2, (void *)(uintptr_t)w->w2q, (float *)(uintptr_t)w->w2s, NULL);
        } else {
            st1 = moe_plan_pack_fp8(plan, &a1, &sa1, q1, c1);
            st2 = moe_plan_pack_fp8(plan, &a2, &sa2, q2, c2);
        }
    }
    if (st1 != MOE_OK || st2 != MOE_OK) {
        fprintf(stderr, "  fp8 pack (%s, %s): %s\n", mode == WEIGHTS_QUANTIZE ? "quantize" : "checkpoint",
                device ? "device" : "host", moe_last_error());
        goto out;
    }
    if (device) { /* the packs back, for the reference */
        if (!cu_ok(moe_cu.cuCtxSynchronize(), "fp8 pack") || !cu_ok(moe_cu.cuMemcpyDtoH(q1, w->w1q, n1), "w1q") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(q2, w->w2q, n2), "w2q") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(c1, w->w1s, sizeof(float) * (size_t)(E * s1)), "w1s") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(c2, w->w2s, sizeof(float) * (size_t)(E * s2)), "w2s"))
            goto out;
    } else if (!cu_ok(moe_cu.cuMemcpyHtoD(w->w1q, q1, n1), "w1q") || !cu_ok(moe_cu.cuMemcpyHtoD(w->w2q, q2, n2), "w2q") ||
               !cu_ok(moe_cu.cuMemcpyHtoD(w->w1s, c1, sizeof(float) * (size_t)(E * s1)), "w1s") ||
               !cu_ok(moe_cu.cuMemcpyHtoD(w->w2s, c2, sizeof(float) * (size_t)(E * s2)), "w2s")) {
        goto out;
    }
    if (mode == WEIGHTS_QUANTIZE) { /* the reference's weights: the pack's bytes in the plain layout */
        for (long long e = 0; e < E; e++)
            for (long long r = 0; r < 2 * F; r++)
                memcpy(w->p1q + (e * 2 * F + r) * H, q1 + (e * 2 * F + moe_pack_row(r, F)) * H, (size_t)H);
        memcpy(w->p2q, q2, n2);
        memcpy(w->p1s, c1, sizeof(float) * (size_t)(E * s1));
        memcpy(w->p2s, c2, sizeof(float) * (size_t)(E * s2));
        rc = 0;
    } else { /* the pack of a checkpoint moves bytes: they must be the plain ones, paired */
        long long diff = 0;
        for (long long e = 0; e < E; e++)
            for (long long r = 0; r < 2 * F; r++)
                diff += memcmp(w->p1q + (e * 2 * F + r) * H, q1 + (e * 2 * F + moe_pack_row(r, F)) * H, (size_t)H) != 0;
        diff += memcmp(w->p2q, q2, n2) != 0;
        diff += memcmp(w->p1s, c1, sizeof(float) * (size_t)(E * s1)) != 0;
        diff += memcmp(w->p2s, c2, sizeof(float) * (size_t)(E * s2)) != 0;
        if (diff)
            fprintf(stderr, "  fp8 checkpoint pack: %lld rows or scale tensors moved wrong\n", diff);
        rc = diff != 0;
    }
out:
    if (src1)
        moe_cu.cuMemFree(src1);
    if (src2)
        moe_cu.cuMemFree(src2);
    if (srs1)
        moe_cu.cuMemFree(srs1);
    if (srs2)
        moe_cu.cuMemFree(srs2);
    free(q1), free(q2), free(c1), free(c2);
    return rc;
}

/* The capture of one forward into a CUDA graph, y and the workspace
 * poisoned after the capture (which runs nothing), then the replay: what
 * the checks see is what the replay computed. */
static moe_status forward_graph(const moe_plan *plan, const moe_forward_args *a, CUdeviceptr dy, size_t ybytes,
                                CUdeviceptr dws, size_t wsbytes) {
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
    if (cu_ok(moe_cu.cuGraphInstantiateWithFlags(&ge, g, 0), "instantiate") &&
        cu_ok(moe_cu.cuMemsetD8(dy, 0xff, ybytes), "poison y") && cu_ok(moe_cu.cuMemsetD8(dws, 0xff, wsbytes), "poison ws") &&
        cu_ok(moe_cu.cuCtxSynchronize(), "poison") && cu_ok(moe_cu.cuGraphLaunch(ge, gs), "replay") &&
        cu_ok(moe_cu.cuStreamSynchronize(gs), "replay"))
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

/* Bounds of the layer checks (normalized L2 over the sampled tokens' y):
 *  - against the CPU's quantized recipe (moe_ref_ffn with the same packed
 *    weights, on the GPU's own routing): the activations' quantization is
 *    the same bytes on both sides; what differs is the fp8 wgmma's sums
 *    inside a 128-K block (reduced-precision accumulation), which moves an
 *    h code across an e4m3 rounding boundary now and then (gemm_up's h
 *    error alone is ~3e-3 on the H200, bounded by 1e-2 above), and the
 *    bf16 roundings of the down output and y; 1.5e-2 (test_gpu's bf16
 *    bound) holds that and fails a wrong scale block or a lost promotion
 *    (O(1) errors in whole 128-column blocks);
 *  - against the bf16 layer on the bf16 weights the pack quantized: the
 *    format's own error, test_quant's (0.005, 0.09) on the same uniform
 *    data (docs/DESIGN.md, "FP8"). */
#define LAYER_TOL 1.5e-2
#define BF16_LO 0.005
#define BF16_HI 0.09

/* One forward of T tokens on fresh random x and weights of `mode`, eager or
 * replayed from a CUDA graph, against the references on a sample of tokens
 * (the first, the last and random ones; `nsample` in all). device: pack on
 * the device (make_weights). */
static void check_layer(const moe_plan *plan, const char *label_base, int T, int mode, int device, int graph,
                        int nsample) {
    const moe_spec_t *s = &plan->pd.spec;
    const int E = s->experts, K = s->top_k, H = s->hidden, F = s->ffn, TC = s->tokens;
    static char label[300];
    snprintf(label, sizeof label, "fp8 %s: layer, %d tokens, %s weights packed on the %s%s", label_base, T,
             mode == WEIGHTS_QUANTIZE ? "bf16" : "checkpoint e4m3", device ? "device" : "host",
             graph ? ", CUDA graph" : "");
    CASE(label);
    fp8_weights_t wt;
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)T * H), *wr = malloc(sizeof(uint16_t) * (size_t)E * H),
             *b1 = malloc(sizeof(uint16_t) * (size_t)E * 2 * F), *b1p = malloc(sizeof(uint16_t) * (size_t)E * 2 * F),
             *b2 = malloc(sizeof(uint16_t) * (size_t)E * H), *y = malloc(sizeof(uint16_t) * (size_t)TC * H);
    float *sel = malloc(sizeof(float) * (size_t)E), *lb = malloc(sizeof(float) * (size_t)E);
    const size_t wsb = moe_plan_workspace_size(plan, T);
    CUdeviceptr dx = 0, dwr = 0, db1 = 0, db2 = 0, dsel = 0, dlb = 0, dy = 0, dws = 0;
    int *idx = NULL, *sample = NULL;
    float *tw = NULL, *yref = NULL, *ybf = NULL;
    char *picked = NULL;
    const int wok = make_weights(plan, mode, device, &wt) == 0;
    CHECKF(wok, "the fp8 weights did not pack (%s)", moe_last_error());
    if (!wok || !x || !wr || !b1 || !b1p || !b2 || !y || !sel || !lb)
        goto done;
    fill_bf16(x, (size_t)T * H, 1.0f);
    fill_bf16(wr, (size_t)E * H, 4.0f / sqrtf((float)H));
    fill_bf16(b1, (size_t)E * 2 * F, 0.5f);
    fill_bf16(b2, (size_t)E * H, 0.5f);
    for (int e = 0; e < E; e++)
        sel[e] = 0.1f * frand(), lb[e] = frand();
    CHECK(moe_plan_pack_b1(plan, b1, b1p) == MOE_OK);
    dx = up_load(x, sizeof(uint16_t) * (size_t)T * H), dwr = up_load(wr, sizeof(uint16_t) * (size_t)E * H);
    db1 = up_load(b1p, sizeof(uint16_t) * (size_t)E * 2 * F), db2 = up_load(b2, sizeof(uint16_t) * (size_t)E * H);
    dsel = up_load(sel, sizeof(float) * (size_t)E), dlb = up_load(lb, sizeof(float) * (size_t)E);
    dy = up_load(NULL, sizeof(uint16_t) * (size_t)TC * H), dws = up_load(NULL, wsb);
    if (!dx || !dwr || !db1 || !db2 || !dsel || !dlb || !dy || !dws)
        goto done;
    /* y (every row of the capacity: rows past T stay poisoned) and the whole workspace poisoned */
    CHECK(cu_ok(moe_cu.cuMemsetD8(dy, 0xff, sizeof(uint16_t) * (size_t)TC * H), "poison y") &&
          cu_ok(moe_cu.cuMemsetD8(dws, 0xff, wsb), "poison workspace"));
    moe_forward_args a = {.tokens = T, .x = (void *)(uintptr_t)dx, .router_w = (void *)(uintptr_t)dwr,
                          .router_bias = s->router.bias ? (const float *)(uintptr_t)dsel : NULL,
                          .router_logit_bias = s->router.logit_bias ? (const float *)(uintptr_t)dlb : NULL,
                          .w1p = (void *)(uintptr_t)wt.w1q, .w2 = (void *)(uintptr_t)wt.w2q,
                          .b1p = s->ffn_bias ? (void *)(uintptr_t)db1 : NULL,
                          .b2 = s->ffn_bias ? (void *)(uintptr_t)db2 : NULL, .y = (void *)(uintptr_t)dy,
                          .workspace = (void *)(uintptr_t)dws, .w1s = (const float *)(uintptr_t)wt.w1s,
                          .w2s = (const float *)(uintptr_t)wt.w2s};
    moe_status st = graph ? forward_graph(plan, &a, dy, sizeof(uint16_t) * (size_t)TC * H, dws, wsb)
                          : moe_forward(plan, &a, NULL);
    CHECKF(st == MOE_OK, "moe_forward%s: %s: %s", graph ? " (CUDA graph)" : "", moe_status_string(st), moe_last_error());
    CUresult r = st == MOE_OK ? moe_cu.cuCtxSynchronize() : CUDA_ERROR_UNKNOWN;
    CHECKF(r == CUDA_SUCCESS, "the fp8 forward faulted: %s", moe_cu_error_string(r));
    size_t oi, ni, ow, nw;
    if (r != CUDA_SUCCESS || moe_plan_workspace_region_at(plan, T, "topk_idx", &oi, &ni) != MOE_OK ||
        moe_plan_workspace_region_at(plan, T, "topk_w", &ow, &nw) != MOE_OK)
        goto done;
    idx = malloc(sizeof(int) * (size_t)T * K), tw = malloc(sizeof(float) * (size_t)T * K);
    if (!idx || !tw || !cu_ok(moe_cu.cuMemcpyDtoH(y, dy, sizeof(uint16_t) * (size_t)TC * H), "y") ||
        !cu_ok(moe_cu.cuMemcpyDtoH(idx, dws + oi, sizeof(int) * (size_t)T * K), "topk_idx") ||
        !cu_ok(moe_cu.cuMemcpyDtoH(tw, dws + ow, sizeof(float) * (size_t)T * K), "topk_w"))
        goto done;
    long long bad_idx = 0, written_past = 0;
    for (long long i = 0; i < (long long)T * K; i++)
        bad_idx += idx[i] < 0 || idx[i] >= E;
    for (size_t i = (size_t)T * H; i < (size_t)TC * H; i++)
        written_past += y[i] != 0xffff;
    CHECKF(bad_idx == 0, "route wrote %lld expert indices out of range", bad_idx);
    CHECKF(written_past == 0, "the forward wrote %lld values of y past its %d tokens", written_past, T);
    if (bad_idx)
        goto done;
    /* the sample */
    const int S = T < nsample ? T : nsample;
    int ns = 0;
    sample = malloc(sizeof(int) * (size_t)S), picked = calloc((size_t)T, 1);
    yref = malloc(sizeof(float) * (size_t)T * H), ybf = malloc(sizeof(float) * (size_t)T * H);
    if (!sample || !picked || !yref || !ybf)
        goto done;
    sample[ns++] = 0, picked[0] = 1;
    if (T > 1)
        sample[ns++] = T - 1, picked[T - 1] = 1;
    while (ns < S) {
        const int t = (int)(next64() % (uint64_t)T);
        if (!picked[t])
            picked[t] = 1, sample[ns++] = t;
    }
    moe_ref_fp8_t f8 = {wt.p1q, wt.p2q, wt.p1s, wt.p2s};
    moe_ref_inputs_t in = {.x = x, .wr = wr, .b1 = b1, .b2 = b2, .sel_bias = sel, .logit_bias = lb, .tokens = T,
                           .fp8 = &f8};
    const int rc = moe_ref_ffn(s, &in, idx, tw, sample, ns, yref, NULL, NULL);
    CHECKF(rc == 0, "the CPU reference failed");
    if (rc)
        goto done;
    double num = 0, den = 0, bnum = 0, bden = 0;
    long long nonfinite = 0;
    for (int i = 0; i < ns; i++)
        for (int h = 0; h < H; h++) {
            const double g = moe_half_to_float(y[(size_t)sample[i] * H + h], MOE_DTYPE_BF16),
                         w = yref[(size_t)sample[i] * H + h];
            nonfinite += !isfinite(g);
            num += (g - w) * (g - w), den += w * w;
        }
    const double err = den > 0 ? sqrt(num / den) : 1;
    double ebf = -1;
    if (mode == WEIGHTS_QUANTIZE) { /* the bf16 layer on the bf16 weights, same routing */
        moe_spec_t sb = *s;
        sb.quant.weights = MOE_QUANT_NONE;
        moe_ref_inputs_t inb = in;
        inb.fp8 = NULL, inb.w1 = wt.w1, inb.w2 = wt.w2;
        const int rb = moe_ref_ffn(&sb, &inb, idx, tw, sample, ns, ybf, NULL, NULL);
        CHECKF(rb == 0, "the CPU bf16 reference failed");
        for (int i = 0; rb == 0 && i < ns; i++)
            for (int h = 0; h < H; h++) {
                const double g = moe_half_to_float(y[(size_t)sample[i] * H + h], MOE_DTYPE_BF16),
                             w = ybf[(size_t)sample[i] * H + h];
                bnum += (g - w) * (g - w), bden += w * w;
            }
        ebf = rb == 0 && bden > 0 ? sqrt(bnum / bden) : 1;
    }
    fprintf(stderr, "  %-70s error %.2e vs the quantized reference", label, err);
    if (ebf >= 0)
        fprintf(stderr, ", %.4f vs bf16", ebf);
    fprintf(stderr, " (%d tokens sampled)\n", ns);
    CHECKF(nonfinite == 0, "%lld NaN/Inf (poison) in the sampled rows of y", nonfinite);
    CHECKF(err <= LAYER_TOL, "layer error %.3e > %.1e against the quantized reference (normalized L2)", err, LAYER_TOL);
    if (ebf >= 0)
        CHECKF(ebf > BF16_LO && ebf < BF16_HI, "layer error against the bf16 layer %.4f outside (%.3f, %.2f)", ebf,
               BF16_LO, BF16_HI);
done:;
    CUdeviceptr all[] = {dx, dwr, db1, db2, dsel, dlb, dy, dws};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    weights_free(&wt);
    free(x), free(wr), free(b1), free(b1p), free(b2), free(y), free(sel), free(lb), free(idx), free(tw), free(sample);
    free(picked), free(yref), free(ybf);
}

/* What moe_forward refuses of an fp8 plan, and its workspace: the scales'
 * regions, and 0 tokens enqueuing nothing. */
static void check_forward_args(const moe_plan *plan, const char *label_base) {
    static char label[200];
    snprintf(label, sizeof label, "fp8 %s: moe_forward's fp8 arguments and workspace", label_base);
    CASE(label);
    const moe_spec_t *s = &plan->pd.spec;
    const int at[2] = {1, s->tokens}; /* a call's layout, at one token and at the capacity */
    for (int i = 0; i < 2; i++) {
        size_t off, end = 0, xsc = 0, hsc = 0, xs = 0, hbuf = 0;
        CHECK(moe_plan_workspace_region_at(plan, at[i], "xsc", &off, &xsc) == MOE_OK &&
              moe_plan_workspace_region_at(plan, at[i], "hsc", &off, &hsc) == MOE_OK &&
              moe_plan_workspace_region_at(plan, at[i], "xs", &off, &xs) == MOE_OK &&
              moe_plan_workspace_region_at(plan, at[i], "hbuf", &off, &hbuf) == MOE_OK);
        for (int k = 0; k < MOE_WS_COUNT; k++) {
            size_t o, n;
            moe_plan_workspace_region_at(plan, at[i], plan->pd.ws[k].name, &o, &n);
            end = o + n > end ? o + n : end;
        }
        const size_t R = (size_t)moe_plan_max_rows(&plan->pd, at[i]);
        CHECKF(xsc == 4 * R * (size_t)(s->hidden / 128) && hsc == 4 * R * (size_t)(s->ffn / 128) &&
               xs == 2 * R * (size_t)s->hidden && hbuf == R * (size_t)s->ffn,
               "%d tokens: workspace regions xsc %zu, hsc %zu, xs %zu, hbuf %zu bytes for %zu rows", at[i], xsc, hsc,
               xs, hbuf, R);
        CHECKF(moe_plan_workspace_size(plan, at[i]) >= end, "%d tokens: moe_plan_workspace_size %zu < %zu, the end "
               "of the last region", at[i], moe_plan_workspace_size(plan, at[i]), end);
    }
    /* the tensors as moe_plan_tensor describes them: e4m3 weights, fp32 scales */
    int rank1 = 0, rank2 = 0, rankw = 0;
    int64_t d1[4], d2[4], dw[4];
    const char *t1 = NULL, *t2 = NULL, *tw = NULL;
    const int blk = s->quant.scaling == MOE_SCALING_BLOCK;
    const int64_t S = plan->launcher.slots, F = s->ffn, H = s->hidden;
    CHECK(moe_plan_tensor(plan, "w1s", &rank1, d1, &t1) == MOE_OK && moe_plan_tensor(plan, "w2s", &rank2, d2, &t2) == MOE_OK &&
          moe_plan_tensor(plan, "w1p", &rankw, dw, &tw) == MOE_OK);
    CHECKF(!strcmp(tw, "fp8_e4m3") && !strcmp(t1, "fp32") && !strcmp(t2, "fp32") && rank1 == (blk ? 3 : 2) &&
           rank2 == rank1 && d1[0] == S && d2[0] == S && d1[1] == (blk ? 2 * F / 128 : 2 * F) &&
           d2[1] == (blk ? H / 128 : H) && (!blk || (d1[2] == H / 128 && d2[2] == F / 128)),
           "moe_plan_tensor: w1p %s, w1s %s rank %d, w2s %s rank %d", tw, t1, rank1, t2, rank2);
    moe_forward_args a = {.tokens = 1, .x = (void *)256, .router_w = (void *)256, .w1p = (void *)256, .w2 = (void *)256,
                          .b1p = (void *)256, .b2 = (void *)256, .y = (void *)256, .workspace = (void *)256,
                          .router_bias = (void *)256, .router_logit_bias = (void *)256};
    CHECK(moe_forward(plan, &a, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "w1s"));
    a.w1s = (const float *)256;
    CHECK(moe_forward(plan, &a, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "w1s and w2s"));
    a.w2s = (const float *)256, a.tokens = 0;
    CHECKF(moe_forward(plan, &a, NULL) == MOE_OK, "0 tokens: %s", moe_last_error());
    /* the gather carries fp8 weights now (quantize before gather, test_ep_gpu fp8): NULL tensors are refused
     * by name, and the quantizing gather wants its bf16 sources */
    moe_gather_args g = {0};
    CHECKF(moe_gather_weights(plan, &g, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "is NULL"),
           "moe_gather_weights with no tensors: %s", moe_last_error());
    CHECKF(moe_gather_weights_fp8(plan, NULL, NULL, &g, NULL) == MOE_ERR_INVALID_ARG &&
               strstr(moe_last_error(), "NULL argument"), "moe_gather_weights_fp8 with no sources: %s", moe_last_error());
}

/* The whole layer of a small case: bf16 weights quantized on the host, eager,
 * at a token count no multiple of 64; a checkpoint's e4m3 weights packed on
 * the host, replayed from a CUDA graph, at the capacity. */
static void layer_checks(const moe_plan *plan, const char *label) {
    const int TC = plan->pd.spec.tokens;
    check_forward_args(plan, label);
    check_layer(plan, label, TC * 2 / 3 | 1, WEIGHTS_QUANTIZE, 0, 0, 40);
    check_layer(plan, label, TC, WEIGHTS_CHECKPOINT, 0, 1, 40);
}

static void run(const fp8_case_t *fc, const char *cache) {
    char label[200];
    snprintf(label, sizeof label, "fp8 %s: plan", fc->label);
    CASE(label);
    moe_options o = {0};
    o.cache_dir = cache;
    o.cudnn = MOE_CUDNN_OFF;
    moe_plan *plan = NULL;
    moe_status st = moe_plan_create_text(&plan, "fp8.moe", fc->text, &o);
    CHECKF(st == MOE_OK, "%s", moe_last_error());
    if (st)
        return;
    const moe_spec_t *s = &plan->pd.spec;
    const moe_launcher_t *l = &plan->launcher;
    const int E = s->experts, H = s->hidden, F = s->ffn, A = plan->pd.align, blk = s->quant.scaling == MOE_SCALING_BLOCK;

    if (fc->layer_only) {
        layer_checks(plan, fc->label);
        moe_plan_destroy(plan);
        return;
    }
    check_packs(plan, fc->label);
    check_scatter(plan, fc->label);

    /* ragged rows per expert, two empty */
    const int counts[6] = {37, 0, 130, 64, 1, 0};
    tile_t tiles[64];
    int nt = 0, R = 0;
    for (int e = 0; e < E; e++) {
        for (int r0 = 0; r0 < counts[e]; r0 += A)
            tiles[nt++] = (tile_t){e, R + r0, counts[e] - r0 < A ? counts[e] - r0 : A, 0};
        R += (counts[e] + A - 1) / A * A;
    }
    /* the inputs: rows of x quantized per 128 columns (every row of the tile grid, over-read rows too) */
    const size_t nx = (size_t)R * H;
    float *xf = malloc(nx * sizeof(float)), *xsc = malloc((size_t)R * (H / 128) * sizeof(float));
    uint8_t *xq = malloc(nx);
    for (size_t i = 0; i < nx; i++)
        xf[i] = frand() * (1.0f + (float)(i % 5));
    moe_ref_fp8_quantize_rows(xf, R, H, xq, xsc);
    /* the weights: bf16, quantized (plain for the reference, packed for the GPU) */
    const size_t n1 = (size_t)E * 2 * F * H, n2 = (size_t)E * H * F;
    uint16_t *w1 = malloc(n1 * 2), *w2 = malloc(n2 * 2), *b1 = malloc((size_t)E * 2 * F * 2), *b2 = malloc((size_t)E * H * 2);
    for (size_t i = 0; i < n1; i++)
        w1[i] = moe_float_to_half(0.05f * frand(), MOE_DTYPE_BF16);
    for (size_t i = 0; i < n2; i++)
        w2[i] = moe_float_to_half(0.05f * frand(), MOE_DTYPE_BF16);
    for (int i = 0; i < E * 2 * F; i++)
        b1[i] = moe_float_to_half(0.3f * frand(), MOE_DTYPE_BF16);
    for (int i = 0; i < E * H; i++)
        b2[i] = moe_float_to_half(0.1f * frand(), MOE_DTYPE_BF16);
    moe_ref_fp8_t ref;
    CHECK(moe_ref_fp8_weights(s, w1, w2, &ref) == 0);
    const size_t s1 = blk ? (size_t)(2 * F / 128) * (H / 128) : (size_t)2 * F, s2 = blk ? (size_t)(H / 128) * (F / 128) : (size_t)H;
    uint8_t *w1q = malloc(n1), *w2q = malloc(n2);
    float *w1s = malloc((size_t)E * s1 * sizeof(float)), *w2s = malloc((size_t)E * s2 * sizeof(float));
    moe_pack_args a;
    CHECK(moe_plan_pack_layout(plan, MOE_LAYOUT_W1_FUSED, w1, NULL, 0, E, &a) == MOE_OK &&
          moe_plan_pack_quantize(plan, &a, w1q, w1s) == MOE_OK);
    CHECK(moe_plan_pack_layout(plan, MOE_LAYOUT_W2, w2, NULL, 0, E, &a) == MOE_OK &&
          moe_plan_pack_quantize(plan, &a, w2q, w2s) == MOE_OK);
    uint16_t *b1p = malloc((size_t)E * 2 * F * 2);
    CHECK(moe_plan_pack_b1(plan, b1, b1p) == MOE_OK);

    CUdeviceptr dxq = up_load(xq, nx), dxsc = up_load(xsc, (size_t)R * (H / 128) * 4), dw1q = up_load(w1q, n1),
                dw1s = up_load(w1s, (size_t)E * s1 * 4), dw2q = up_load(w2q, n2), dw2s = up_load(w2s, (size_t)E * s2 * 4),
                db1 = up_load(b1p, (size_t)E * 2 * F * 2), db2 = up_load(b2, (size_t)E * H * 2),
                dtiles = up_load(tiles, sizeof(tile_t) * (size_t)nt), dnt = up_load(&nt, sizeof nt),
                dhq = up_load(NULL, (size_t)R * F), dhsc = up_load(NULL, (size_t)R * (F / 128) * 4),
                dout = up_load(NULL, (size_t)R * H * 2);
    uint8_t *hq = malloc((size_t)R * F);
    float *hsc = malloc((size_t)R * (F / 128) * sizeof(float));
    uint16_t *out = malloc((size_t)R * H * 2);
    float *acc = malloc(sizeof(float) * (size_t)(2 * F > H ? 2 * F : H)), *hrow = malloc(sizeof(float) * (size_t)F);
    uint8_t *hq_ref = malloc((size_t)F);
    float hsc_ref[64];
    if (!dxq || !dxsc || !dw1q || !dw1s || !dw2q || !dw2s || !db1 || !db2 || !dtiles || !dnt || !dhq || !dhsc || !dout)
        goto done;

    /* ---- up ---- */
    snprintf(label, sizeof label, "fp8 %s: gemm_up (%s)", fc->label, l->kernels[MOE_K_GEMM_UP].name);
    CASE(label);
    CHECK(cu_ok(moe_cu.cuMemsetD8(dhq, 0xff, (size_t)R * F), "poison hq") &&
          cu_ok(moe_cu.cuMemsetD8(dhsc, 0xff, (size_t)R * (F / 128) * 4), "poison hsc"));
    {
        void *args[] = {&dxq, &dw1q, &dxsc, &dw1s, &db1, &dtiles, &dnt, &dhq, &dhsc};
        st = moe_launch_kernel(l, MOE_K_GEMM_UP, s->tokens, nt, NULL, args, NULL);
        CHECKF(st == MOE_OK, "%s", moe_last_error());
        CUresult r = st == MOE_OK ? moe_cu.cuCtxSynchronize() : CUDA_ERROR_UNKNOWN;
        CHECKF(r == CUDA_SUCCESS, "gemm_up faulted: %s", moe_cu_error_string(r));
        if (r != CUDA_SUCCESS || !cu_ok(moe_cu.cuMemcpyDtoH(hq, dhq, (size_t)R * F), "hq") ||
            !cu_ok(moe_cu.cuMemcpyDtoH(hsc, dhsc, (size_t)R * (F / 128) * 4), "hsc"))
            goto done;
    }
    {
        double num = 0, den = 0;
        long long far = 0, poisoned = 0, written_pad = 0, bad_scale = 0;
        double worst_far = 0; /* the largest |have - want| / amax of a code more than one step off */
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < A; r++) {
                const long long row = tiles[t].row_start + r;
                if (r >= tiles[t].rows) { /* past the tile's rows: untouched */
                    for (int f = 0; f < F; f++)
                        written_pad += hq[row * F + f] != 0xff;
                    continue;
                }
                const int e = tiles[t].expert;
                moe_ref_fp8_gemm(s, xq + row * H, xsc + row * (H / 128), 1, ref.w1q + (size_t)e * 2 * F * H,
                                 ref.w1s + (size_t)e * s1, 2 * F, H, acc);
                for (int f = 0; f < F; f++) {
                    float g = acc[f], u = acc[F + f];
                    if (s->ffn_bias)
                        g += moe_half_to_float(b1[(size_t)e * 2 * F + f], MOE_DTYPE_BF16),
                        u += moe_half_to_float(b1[(size_t)e * 2 * F + F + f], MOE_DTYPE_BF16);
                    hrow[f] = moe_ref_activation(s, g, u);
                }
                moe_ref_fp8_quantize_rows(hrow, 1, F, hq_ref, hsc_ref);
                for (int b = 0; b < F / 128; b++) {
                    const float got = hsc[row * (F / 128) + b];
                    bad_scale += !(fabsf(got - hsc_ref[b]) <= 1e-3f * hsc_ref[b]);
                }
                for (int f = 0; f < F; f++) {
                    const uint8_t c = hq[row * F + f];
                    poisoned += (c & 0x7F) == 0x7F;
                    const double have = moe_e4m3_to_float(c) * hsc[row * (F / 128) + f / 128];
                    const double want = moe_e4m3_to_float(hq_ref[f]) * hsc_ref[f / 128];
                    /* one e4m3 step, or (for codes near 0, whose steps are finer than the
                     * GEMM's fp32 sums are exact) 1/1024 of the block's amax (448 scale) */
                    const double off = fabs(have - want) / (448.0 * hsc_ref[f / 128]);
                    if (!near_code(c, hq_ref[f])) {
                        far += !(off <= 1.0 / 1024);
                        worst_far = off > worst_far || isnan(off) ? off : worst_far;
                    }
                    num += (have - want) * (have - want), den += want * want;
                }
            }
        const double err = den > 0 ? sqrt(num / den) : 1;
        fprintf(stderr, "  %-50s gemm_up: h error %.2e, %lld codes more than one step (and amax/1024) off, worst %.2e amax\n",
                fc->label, err, far, worst_far);
        CHECKF(poisoned == 0, "%lld NaN codes (poison) in the rows gemm_up must write", poisoned);
        CHECKF(written_pad == 0, "gemm_up wrote %lld bytes past a tile's rows", written_pad);
        CHECKF(bad_scale == 0, "%lld h scales off the reference's amax/448 by more than 1e-3", bad_scale);
        CHECKF(far == 0, "%lld codes more than one e4m3 step (and 1/1024 of the block amax) from the reference", far);
        CHECKF(err <= 1e-2, "h error %.3e > 1e-2 (dequantized, normalized L2)", err);
    }

    /* ---- down, on the GPU's own h ---- */
    snprintf(label, sizeof label, "fp8 %s: gemm_down (%s)", fc->label, l->kernels[MOE_K_GEMM_DOWN].name);
    CASE(label);
    CHECK(cu_ok(moe_cu.cuMemsetD8(dout, 0xff, (size_t)R * H * 2), "poison out"));
    {
        /* a gemv-grid down GEMM (MOEGEN_TUNING=tests/tune/gemv8.tune) takes the folded combine's five after
         * the output: y NULL, not folded in */
        CUdeviceptr none = 0;
        int zero = 0;
        void *args[] = {&dhq, &dw2q, &dhsc, &dw2s, &db2, &dtiles, &dnt, &dout, &none, &none, &zero, &none, &none};
        st = moe_launch_kernel(l, MOE_K_GEMM_DOWN, s->tokens, nt, NULL, args, NULL);
        CHECKF(st == MOE_OK, "%s", moe_last_error());
        CUresult r = st == MOE_OK ? moe_cu.cuCtxSynchronize() : CUDA_ERROR_UNKNOWN;
        CHECKF(r == CUDA_SUCCESS, "gemm_down faulted: %s", moe_cu_error_string(r));
        if (r != CUDA_SUCCESS || !cu_ok(moe_cu.cuMemcpyDtoH(out, dout, (size_t)R * H * 2), "out"))
            goto done;
    }
    {
        double num = 0, den = 0;
        long long poisoned = 0, written_pad = 0;
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < A; r++) {
                const long long row = tiles[t].row_start + r;
                if (r >= tiles[t].rows) {
                    for (int h = 0; h < H; h++)
                        written_pad += out[row * H + h] != 0xffff;
                    continue;
                }
                const int e = tiles[t].expert;
                /* hq rows past F/128 blocks: the GPU's own (hq, hsc) are the input */
                moe_ref_fp8_gemm(s, hq + row * F, hsc + row * (F / 128), 1, ref.w2q + (size_t)e * H * F,
                                 ref.w2s + (size_t)e * s2, H, F, acc);
                for (int h = 0; h < H; h++) {
                    float o = acc[h] + (s->ffn_bias ? moe_half_to_float(b2[(size_t)e * H + h], MOE_DTYPE_BF16) : 0.0f);
                    const double want = moe_half_to_float(moe_float_to_half(o, MOE_DTYPE_BF16), MOE_DTYPE_BF16);
                    const double have = moe_half_to_float(out[row * H + h], MOE_DTYPE_BF16);
                    poisoned += !isfinite(have);
                    num += (have - want) * (have - want), den += want * want;
                }
            }
        const double err = den > 0 ? sqrt(num / den) : 1;
        fprintf(stderr, "  %-50s gemm_down: error %.2e\n", fc->label, err);
        CHECKF(poisoned == 0, "%lld NaN/Inf (poison) in the rows gemm_down must write", poisoned);
        CHECKF(written_pad == 0, "gemm_down wrote %lld values past a tile's rows", written_pad);
        /* bf16 rounding of the output (2^-9) and the fp8 wgmma's accumulation inside a 128-K block */
        CHECKF(err <= 8e-3, "gemm_down error %.3e > 8e-3 (normalized L2)", err);
    }
done:;
    CUdeviceptr all[] = {dxq, dxsc, dw1q, dw1s, dw2q, dw2s, db1, db2, dtiles, dnt, dhq, dhsc, dout};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    moe_ref_fp8_free(&ref);
    free(xf), free(xsc), free(xq), free(w1), free(w2), free(b1), free(b2), free(w1q), free(w2q), free(w1s), free(w2s);
    free(b1p), free(hq), free(hsc), free(out), free(acc), free(hrow), free(hq_ref);
    layer_checks(plan, fc->label); /* after the kernels alone, which say more when the layer fails */
    moe_plan_destroy(plan);
}

/* An example spec as it is: the layer with bf16 weights quantized on the
 * device at 1000 tokens, and a checkpoint's e4m3 weights packed on the
 * device, replayed from a CUDA graph, at 129; then a call at every other
 * token bucket of the plan (tuning/h200.tune's e4m3 entries: the gemv grid
 * at decode sizes, other tiles and grids above), replayed from a graph
 * every second one; 12 tokens checked each (the CPU reference is
 * single-threaded and the weights are up to 1.4 billion). */
static void run_example(const char *path, const char *cache) {
    static char label[200];
    snprintf(label, sizeof label, "fp8 %s: plan", path);
    CASE(label);
    moe_options o = MOE_OPTIONS_INIT;
    o.cache_dir = cache;
    o.cudnn = MOE_CUDNN_OFF;
    moe_plan *plan = NULL;
    moe_status st = moe_plan_create(&plan, path, &o);
    CHECKF(st == MOE_OK, "%s", moe_last_error());
    if (st)
        return;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    check_forward_args(plan, base);
    check_layer(plan, base, 1000, WEIGHTS_QUANTIZE, 1, 0, 12);
    check_layer(plan, base, 129, WEIGHTS_CHECKPOINT, 1, 1, 12);
    for (int v = 0; v < plan->pd.nvariants; v++) {
        const int b = plan->pd.variants[v].bucket, t = b < 1 ? 1 : b;  /* a call of the bucket's own size */
        if (t != 129 && t != 1000 && t <= plan->pd.spec.tokens)
            check_layer(plan, base, t, WEIGHTS_QUANTIZE, 1, v % 2, 12);
    }
    moe_plan_destroy(plan);
}

int main(void) {
    rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    const char *env = getenv("MOEGEN_TEST_SEED");
    if (env && *env)
        rng = strtoull(env, NULL, 10);
    rng |= 1;
    fprintf(stderr, "test_quant_gpu: seed %llu (MOEGEN_TEST_SEED repeats this run)\n", (unsigned long long)rng);
    char why[512];
    CASE("driver");
    if (moe_cu_load(why, sizeof why) != 0) {
        SKIP("every fp8 GPU case: no CUDA driver (%s)", why);
        return check_report("test_quant_gpu");
    }
    int count = 0;
    if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
        SKIP("every fp8 GPU case: the driver reports no GPU");
        return check_report("test_quant_gpu");
    }
    CUdevice dev;
    int major = 0;
    if (moe_cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        moe_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        major != 9) {
        SKIP("every fp8 GPU case: the fp8 GEMMs are sm_90a and device 0 is compute capability %d.x", major);
        return check_report("test_quant_gpu");
    }
    char cache[] = "/tmp/moegen_test_quant_gpu_XXXXXX";
    if (!mkdtemp(cache)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run(&cases[i], cache);
    for (size_t i = 0; i < sizeof example_specs / sizeof *example_specs; i++)
        run_example(example_specs[i], cache);
    { /* the cuDNN path has no fp8 graph: cudnn = on fails the plan with the reason */
        CASE("fp8: cudnn = on refuses the plan");
        moe_options o = MOE_OPTIONS_INIT;
        o.cache_dir = cache;
        o.cudnn = MOE_CUDNN_ON;
        moe_plan *plan = NULL;
        moe_status st = moe_plan_create_text(&plan, "fp8.moe", cases[0].text, &o);
        CHECKF(st == MOE_ERR_UNSUPPORTED && strstr(moe_last_error(), "fp8_e4m3"), "status %d: %s", st,
               moe_last_error());
        moe_plan_destroy(plan);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "test_quant_gpu: could not remove %s\n", cache);
    return check_report("test_quant_gpu");
}
