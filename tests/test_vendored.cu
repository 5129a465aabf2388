/* test_vendored.cu — the vendored path: an emitted .cu compiled with plain
 * nvcc and linked with this program, no libmoegen. Runs the forward through
 * the emitted host code (NAME_forward) and checks sampled tokens of y
 * against the CPU reference; packs gpt-oss's gate_up_proj layout on the
 * device (NAME_pack) and holds it equal to the host pack (NAME_pack_w1). Built by `make test-vendored`; VENDORED_NAME
 * names the emitted spec (its NAME.h is on the include path), and
 * VENDORED_SHARED is defined when the spec has a shared expert (packed
 * into its slots by NAME_pack_shared, checked against the reference's
 * direct shared FFN). With VENDORED_FP8 (`make test-vendored-fp8`, a spec
 * with quant.weights = "fp8_e4m3") the bf16 weights are quantized on the
 * device by NAME_quantize and held to the host quantizer byte for byte,
 * NAME_pack_fp8 packs those e4m3 weights and scales as a checkpoint ships
 * them to the same bytes, and the forward (with w1s, w2s) is checked
 * against the CPU reference of the quantized math (tests/support/ref.h).
 * With VENDORED_GIVEN (`make test-vendored-given`: tests/specs/given_weights.moe,
 * router.select and router.score = "given") the forward takes the caller's
 * topk_ids and (VENDORED_GIVEN_W) topk_weights, about one id in 16 out of
 * range, and the int at NAME_BAD_IDS_AT of the workspace must count those.
 * With VENDORED_OWN (`make test-vendored-own`: tests/specs/router_own_input.moe,
 * Gemma 4's router) the forward takes router_x (rows of their own, what the
 * logits read) and, with VENDORED_ESCALE, router_expert_scale [E]. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <thread>

extern "C" {
#include "check.h"
#include "ref.h"
#include "spec.h"
}
#include "pack_geom.h" /* moe_pack_row: the packed W1 row of a plain one */

#if defined(VENDORED_FP8) && defined(VENDORED_SHARED)
#error "the fp8 vendored test takes a spec without a shared expert"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)
#include STR(VENDORED_HEADER)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define N(x) CAT(VENDORED_NAME, x)

static uint64_t rng_state;
static float urand() {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) / 16777216.0) * 2.0f - 1.0f;
}
/* n values urand() * scale, rounded to the vendored dtype (a count, not a loop bound the compiler folds: FS may be
 * 0) */
static void fill(uint16_t *p, size_t n, float scale, moe_dtype_t dt) {
    for (size_t i = 0; i < n; i++) p[i] = moe_float_to_half(urand() * scale, dt);
}

int main(int argc, char **argv) {
    const char *spec_path = argc > 1 ? argv[1] : NULL;
    int count = 0;
    CASE("vendored");
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        SKIP("no GPU (cudaGetDeviceCount)");
        return check_report("test_vendored");
    }
    moe_spec_t s;
    moe_diag_t d;
    if (!spec_path || moe_spec_load(&s, spec_path, NULL, NULL, 0, &d)) {
        fprintf(stderr, "usage: test_vendored SPEC (%s)\n", spec_path ? d.msg : "no spec");
        return 2;
    }
    rng_state = (uint64_t)time(NULL);
    fprintf(stderr, "test_vendored: %s, seed %llu\n", s.name, (unsigned long long)rng_state);
    const size_t E = N(_EXPERTS), K = N(_TOP_K), H = N(_HIDDEN), F = N(_FFN);
#ifdef VENDORED_SHARED
    const size_t FS = N(_SHARED_FFN), ES = N(_SLOTS); /* the shared expert: weight slots E .. ES-1 */
#else
    const size_t FS = 0, ES = E;
#endif
    const int T = 777 < N(_MAX_TOKENS) ? 777 : N(_MAX_TOKENS);
    const moe_dtype_t dt = s.dtype;
    uint16_t *x = (uint16_t *)malloc(T * H * 2), *wr = (uint16_t *)malloc(E * H * 2);
    uint16_t *w1 = (uint16_t *)malloc(E * 2 * F * H * 2), *w1p = (uint16_t *)malloc(ES * 2 * F * H * 2);
    uint16_t *w2 = (uint16_t *)malloc(ES * H * F * 2), *b1 = (uint16_t *)malloc(E * 2 * F * 2);
    uint16_t *ws1 = (uint16_t *)malloc(2 * FS * H * 2 + 2), *ws2 = (uint16_t *)malloc(H * FS * 2 + 2);
    uint16_t *wsg = (uint16_t *)malloc(H * 2);
    uint16_t *b1p = (uint16_t *)malloc(E * 2 * F * 2), *b2 = (uint16_t *)malloc(E * H * 2);
    float *sb = (float *)malloc(E * 4), *lb = (float *)malloc(E * 4);
    fill(x, T * H, 1, dt);
    fill(wr, E * H, 4 / sqrtf((float)H), dt);
    fill(w1, E * 2 * F * H, 2 / sqrtf((float)H), dt);
    fill(w2, E * H * F, 2 / sqrtf((float)F), dt);
    fill(b1, E * 2 * F, 0.5f, dt);
    fill(b2, E * H, 0.5f, dt);
    for (size_t i = 0; i < E; i++) { sb[i] = urand() * 0.1f; lb[i] = urand(); }
    fill(ws1, 2 * FS * H, 2 / sqrtf((float)H), dt);   /* FS = 0 without a shared expert: nothing */
    fill(ws2, H * FS, FS ? 2 / sqrtf((float)FS) : 0, dt);
    fill(wsg, H, 2 / sqrtf((float)H), dt);
    N(_pack_w1)(w1, w1p);
    N(_pack_b1)(b1, b1p);
#ifdef VENDORED_SHARED
    N(_pack_shared)(ws1, ws2, w1p, w2);
#endif
    void *dx, *dwr, *dw1p, *dw2, *db1p, *db2, *dsb, *dlb, *dy, *dws, *dwsg;
    cudaMalloc(&dx, T * H * 2); cudaMalloc(&dwr, E * H * 2); cudaMalloc(&dw1p, ES * 2 * F * H * 2);
    cudaMalloc(&dw2, ES * H * F * 2); cudaMalloc(&db1p, E * 2 * F * 2); cudaMalloc(&db2, E * H * 2);
    cudaMalloc(&dwsg, H * 2);
    cudaMalloc(&dsb, E * 4); cudaMalloc(&dlb, E * 4); cudaMalloc(&dy, T * H * 2);
    CHECK(cudaMalloc(&dws, N(_WORKSPACE_BYTES)) == cudaSuccess);
    cudaMemcpy(dx, x, T * H * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dwr, wr, E * H * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw1p, w1p, ES * 2 * F * H * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw2, w2, ES * H * F * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dwsg, wsg, H * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db1p, b1p, E * 2 * F * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db2, b2, E * H * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dsb, sb, E * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dlb, lb, E * 4, cudaMemcpyHostToDevice);
    cudaMemset(dy, 0xff, T * H * 2);
    cudaMemset(dws, 0xff, N(_WORKSPACE_BYTES));
    N(_args_t) a = {T, dx, dwr, (const float *)dsb, (const float *)dlb, dw1p, db1p, dw2, db2, dy, dws, dwsg};
    moe_ref_inputs_t in = {x, wr, w1, w2, b1, b2, sb, lb, T, ws1, ws2, wsg};
#ifdef VENDORED_GIVEN
    /* the caller's experts (repeats allowed, one in 16 out of range: dropped and counted) and weights */
    int *gid = (int *)malloc(T * K * 4), ndrop = 0;
    float *gwt = (float *)malloc(T * K * 4);
    for (size_t i = 0; i < T * K; i++) {
        const float u = urand();
        gid[i] = u < -0.875f ? (i % 2 ? -1 : (int)E) : (int)((urand() + 1.0f) * 0.5f * (float)E) % (int)E;
        gwt[i] = (urand() + 1.0f) * 0.5f + 1e-3f;
        ndrop += gid[i] < 0 || gid[i] >= (int)E;
    }
    void *dgid, *dgwt;
    CHECK(cudaMalloc(&dgid, T * K * 4) == cudaSuccess && cudaMalloc(&dgwt, T * K * 4) == cudaSuccess);
    cudaMemcpy(dgid, gid, T * K * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dgwt, gwt, T * K * 4, cudaMemcpyHostToDevice);
    a.topk_ids = (const int *)dgid;
    in.given_ids = gid;
#ifdef VENDORED_GIVEN_W
    a.topk_weights = (const float *)dgwt;
    a.router_w = NULL;   /* the caller's weights: no router */
    in.given_w = gwt;
#endif
#endif
#ifdef VENDORED_OWN
    /* the router's own input: other rows than x (the layer is wrong if the logits read x) */
    uint16_t *rx = (uint16_t *)malloc(T * H * 2);
    for (size_t i = 0; i < T * H; i++) rx[i] = moe_float_to_half(urand(), dt);
    void *drx;
    CHECK(cudaMalloc(&drx, T * H * 2) == cudaSuccess);
    cudaMemcpy(drx, rx, T * H * 2, cudaMemcpyHostToDevice);
    a.router_x = drx;
    in.router_x = rx;
#endif
#ifdef VENDORED_ESCALE
    float *es = (float *)malloc(E * 4);   /* Gemma 4's per_expert_scale, in [0.25, 1.75) */
    for (size_t i = 0; i < E; i++) es[i] = 1.0f + 0.75f * urand();
    void *des;
    CHECK(cudaMalloc(&des, E * 4) == cudaSuccess);
    cudaMemcpy(des, es, E * 4, cudaMemcpyHostToDevice);
    a.router_expert_scale = (const float *)des;
    in.expert_scale = es;
#endif
#ifdef VENDORED_FP8
    CASE("vendored fp8: NAME_quantize on the device is the host quantizer, NAME_pack_fp8 packs a checkpoint's e4m3");
    /* the host's: moe_fp8_quantize_weight per expert (runtime/fp8.c), plain rows */
    moe_ref_fp8_t f8;
    cudaError_t e8;
    CHECK(moe_ref_fp8_weights(&s, w1, w2, &f8) == 0);
    const int block = s.quant.scaling == MOE_SCALING_BLOCK;
    const size_t n1s = block ? E * (2 * F / 128) * (H / 128) : E * 2 * F, n2s = block ? E * (H / 128) * (F / 128) : E * H;
    void *dw1, *dw2b, *dw1q, *dw2q, *dw1s, *dw2s;
    CHECK(cudaMalloc(&dw1, E * 2 * F * H * 2) == cudaSuccess && cudaMalloc(&dw2b, E * H * F * 2) == cudaSuccess &&
          cudaMalloc(&dw1q, E * 2 * F * H) == cudaSuccess && cudaMalloc(&dw2q, E * H * F) == cudaSuccess &&
          cudaMalloc(&dw1s, n1s * 4) == cudaSuccess && cudaMalloc(&dw2s, n2s * 4) == cudaSuccess);
    cudaMemcpy(dw1, w1, E * 2 * F * H * 2, cudaMemcpyHostToDevice);   /* plain [E, 2F, H]: gate rows, then up */
    cudaMemcpy(dw2b, w2, E * H * F * 2, cudaMemcpyHostToDevice);
    uint8_t *q1 = (uint8_t *)malloc(E * 2 * F * H), *q2 = (uint8_t *)malloc(E * H * F), *w1q = (uint8_t *)malloc(E * 2 * F * H);
    float *s1 = (float *)malloc(n1s * 4), *s2 = (float *)malloc(n2s * 4);
    for (size_t ex = 0; ex < E; ex++) /* the packed e4m3 rows the device must write */
        for (size_t r = 0; r < 2 * F; r++)
            memcpy(w1q + (ex * 2 * F + moe_pack_row((long long)r, (long long)F)) * H, f8.w1q + (ex * 2 * F + r) * H, H);
    const long long t1[3] = {(long long)(2 * F * H), (long long)H, 1}, t2[3] = {(long long)(H * F), (long long)F, 1};
    /* poisoned, so an unwritten byte or scale shows */
    cudaMemset(dw1q, 0x7f, E * 2 * F * H), cudaMemset(dw2q, 0x7f, E * H * F);
    cudaMemset(dw1s, 0xff, n1s * 4), cudaMemset(dw2s, 0xff, n2s * 4);
    e8 = N(_quantize)(0, dw1q, (float *)dw1s, dw1, (const uint16_t *)dw1 + F * H, t1, t1, 0, (int)E, 0);
    CHECKF(e8 == cudaSuccess, "quantize W1: %s", cudaGetErrorString(e8));
    e8 = N(_quantize)(2, dw2q, (float *)dw2s, dw2b, NULL, t2, NULL, 0, (int)E, 0);
    CHECKF(e8 == cudaSuccess, "quantize W2: %s", cudaGetErrorString(e8));
    e8 = cudaDeviceSynchronize();
    CHECKF(e8 == cudaSuccess, "quantize kernel fault: %s", cudaGetErrorString(e8));
    cudaMemcpy(q1, dw1q, E * 2 * F * H, cudaMemcpyDeviceToHost), cudaMemcpy(q2, dw2q, E * H * F, cudaMemcpyDeviceToHost);
    cudaMemcpy(s1, dw1s, n1s * 4, cudaMemcpyDeviceToHost), cudaMemcpy(s2, dw2s, n2s * 4, cudaMemcpyDeviceToHost);
    CHECKF(memcmp(q1, w1q, E * 2 * F * H) == 0, "the device's e4m3 W1 differs from the host quantizer's (packed rows)");
    CHECKF(memcmp(s1, f8.w1s, n1s * 4) == 0, "the device's W1 scales differ from the host quantizer's");
    CHECKF(memcmp(q2, f8.w2q, E * H * F) == 0, "the device's e4m3 W2 differs from the host quantizer's");
    CHECKF(memcmp(s2, f8.w2s, n2s * 4) == 0, "the device's W2 scales differ from the host quantizer's");
    CHECK(N(_quantize)(1, dw1q, (float *)dw1s, dw1, dw1, t1, t1, 0, (int)E, 0) == cudaErrorInvalidValue);   /* b1 */
    CHECK(N(_quantize)(0, dw1q, (float *)dw1s, dw1, NULL, t1, t1, 0, (int)E, 0) == cudaErrorInvalidValue);  /* no up */
    CHECK(N(_quantize)(2, dw2q, (float *)dw2s, dw2b, NULL, t2, NULL, 1, (int)E, 0) == cudaErrorInvalidValue); /* past E */
    {
        /* a checkpoint's e4m3 weights and weight_scale_inv (the host quantizer's, plain rows): packed again */
        void *cq1, *cq2, *cs1, *cs2, *pq1, *pq2, *ps1, *ps2;
        CHECK(cudaMalloc(&cq1, E * 2 * F * H) == cudaSuccess && cudaMalloc(&cq2, E * H * F) == cudaSuccess &&
              cudaMalloc(&cs1, n1s * 4) == cudaSuccess && cudaMalloc(&cs2, n2s * 4) == cudaSuccess &&
              cudaMalloc(&pq1, E * 2 * F * H) == cudaSuccess && cudaMalloc(&pq2, E * H * F) == cudaSuccess &&
              cudaMalloc(&ps1, n1s * 4) == cudaSuccess && cudaMalloc(&ps2, n2s * 4) == cudaSuccess);
        cudaMemcpy(cq1, f8.w1q, E * 2 * F * H, cudaMemcpyHostToDevice), cudaMemcpy(cq2, f8.w2q, E * H * F, cudaMemcpyHostToDevice);
        cudaMemcpy(cs1, f8.w1s, n1s * 4, cudaMemcpyHostToDevice), cudaMemcpy(cs2, f8.w2s, n2s * 4, cudaMemcpyHostToDevice);
        cudaMemset(pq1, 0x7f, E * 2 * F * H), cudaMemset(pq2, 0x7f, E * H * F);
        cudaMemset(ps1, 0xff, n1s * 4), cudaMemset(ps2, 0xff, n2s * 4);
        /* scales: block [E, N/128, K/128]; channel [E, N] (column index 0) */
        const long long u1[3] = {(long long)(n1s / E), block ? (long long)(H / 128) : 1, 1},
                        u2[3] = {(long long)(n2s / E), block ? (long long)(F / 128) : 1, 1};
        const size_t up1 = block ? (F / 128) * (H / 128) : F; /* the up half's first scale */
        e8 = N(_pack_fp8)(0, pq1, (float *)ps1, cq1, (const uint8_t *)cq1 + F * H, t1, t1, (const float *)cs1,
                          (const float *)cs1 + up1, u1, u1, 0, (int)E, 0);
        CHECKF(e8 == cudaSuccess, "pack_fp8 W1: %s", cudaGetErrorString(e8));
        e8 = N(_pack_fp8)(2, pq2, (float *)ps2, cq2, NULL, t2, NULL, (const float *)cs2, NULL, u2, NULL, 0, (int)E, 0);
        CHECKF(e8 == cudaSuccess, "pack_fp8 W2: %s", cudaGetErrorString(e8));
        e8 = cudaDeviceSynchronize();
        CHECKF(e8 == cudaSuccess, "pack_fp8 kernel fault: %s", cudaGetErrorString(e8));
        cudaMemcpy(q1, pq1, E * 2 * F * H, cudaMemcpyDeviceToHost), cudaMemcpy(q2, pq2, E * H * F, cudaMemcpyDeviceToHost);
        cudaMemcpy(s1, ps1, n1s * 4, cudaMemcpyDeviceToHost), cudaMemcpy(s2, ps2, n2s * 4, cudaMemcpyDeviceToHost);
        CHECKF(memcmp(q1, w1q, E * 2 * F * H) == 0 && memcmp(s1, f8.w1s, n1s * 4) == 0,
               "pack_fp8's W1 differs from the quantized pack");
        CHECKF(memcmp(q2, f8.w2q, E * H * F) == 0 && memcmp(s2, f8.w2s, n2s * 4) == 0,
               "pack_fp8's W2 differs from the quantized pack");
        void *all[] = {cq1, cq2, cs1, cs2, pq1, pq2, ps1, ps2};
        for (void *pt : all)
            cudaFree(pt);
    }
    cudaFree(dw1), cudaFree(dw2b);
    free(q1), free(q2), free(s1), free(s2);
    /* the forward reads the device-quantized weights; the reference the host's (the same bytes) */
    a.w1p = dw1q, a.w2 = dw2q, a.w1s = (const float *)dw1s, a.w2s = (const float *)dw2s;
    in.fp8 = &f8;
    {
        N(_args_t) no = a;
        no.w2s = NULL;
        CHECK(N(_forward)(&no, 0) == cudaErrorInvalidValue);   /* an fp8 forward needs the scales */
    }
    CASE("vendored fp8: the forward");
#endif
    /* an empty batch: valid, nothing enqueued, y untouched */
    N(_args_t) z = a;
    z.tokens = 0;
    z.x = NULL;
    CHECK(N(_forward)(&z, 0) == cudaSuccess);
    z.tokens = -1;
    CHECK(N(_forward)(&z, 0) == cudaErrorInvalidValue);
    /* rows moved 16 bytes at a time: a misaligned x or y, or a workspace off 256, is refused */
    z = a;
    z.x = (const char *)a.x + 2;
    CHECK(N(_forward)(&z, 0) == cudaErrorInvalidValue);
    z = a;
    z.y = (char *)a.y + 8;
    CHECK(N(_forward)(&z, 0) == cudaErrorInvalidValue);
    z = a;
    z.workspace = (char *)a.workspace + 16;
    CHECK(N(_forward)(&z, 0) == cudaErrorInvalidValue);
    /* the first calls from several threads at once (the per-device state is
     * filled once, under a lock): each must succeed; their outputs race on
     * the shared workspace, so only the checked call below is compared */
    {
        cudaError_t te[4];
        std::thread th[4];
        for (int i = 0; i < 4; i++)
            th[i] = std::thread([&, i] { te[i] = N(_forward)(&a, 0); });
        for (int i = 0; i < 4; i++)
            th[i].join();
        for (int i = 0; i < 4; i++)
            CHECKF(te[i] == cudaSuccess, "first call from thread %d: %s", i, cudaGetErrorString(te[i]));
        cudaError_t se = cudaDeviceSynchronize();
        CHECKF(se == cudaSuccess, "kernel fault after the threads' calls: %s", cudaGetErrorString(se));
        cudaMemset(dy, 0xff, T * H * 2);
        cudaMemset(dws, 0xff, N(_WORKSPACE_BYTES));
    }
    cudaError_t e = N(_forward)(&a, 0);
    CHECKF(e == cudaSuccess, "forward: %s", cudaGetErrorString(e));
    e = cudaDeviceSynchronize();
    CHECKF(e == cudaSuccess, "kernel fault: %s", cudaGetErrorString(e));
    uint16_t *y = (uint16_t *)malloc(T * H * 2);
    cudaMemcpy(y, dy, T * H * 2, cudaMemcpyDeviceToHost);
#ifdef VENDORED_GIVEN
    int dropped = -1;
    cudaMemcpy(&dropped, (char *)dws + N(_BAD_IDS_AT), sizeof dropped, cudaMemcpyDeviceToHost);
    CHECKF(dropped == ndrop, "NAME_BAD_IDS_AT counts %d dropped ids, %d given", dropped, ndrop);
#endif
    int *idx = (int *)malloc(T * K * 4);
    float *w = (float *)malloc(T * K * 4), *yref = (float *)malloc(T * H * 4);
    CHECK(moe_ref_route(&s, &in, idx, w, NULL) == 0);
    int sample[32], ns = 0;
    for (int t = 0; t < T && ns < 32; t += T / 32 + 1) sample[ns++] = t;
    CHECK(moe_ref_ffn(&s, &in, idx, w, sample, ns, yref, NULL, NULL) == 0);
    double num = 0, den = 0;
    int finite = 1;
    for (size_t i = 0; i < T * H; i++) finite &= isfinite(moe_half_to_float(y[i], dt)) != 0;
    for (int i = 0; i < ns; i++)
        for (size_t h = 0; h < H; h++) {
            double g = moe_half_to_float(y[sample[i] * H + h], dt), r = yref[sample[i] * H + h];
            num += (g - r) * (g - r);
            den += r * r;
        }
    /* bf16: rounding of the intermediates; fp8: against the quantized math's reference, test_quant_gpu's bound */
    double err = sqrt(num / den), tol = dt == MOE_DTYPE_BF16 ? 1.5e-2 : 4e-3;
    fprintf(stderr, "  vendored %s T=%d: layer error %.2e (tolerance %.1e)\n", s.name, T, err, tol);
    CHECKF(finite, "y has unwritten (poisoned) or non-finite elements");
    CHECKF(err <= tol, "layer error %.3e > %.1e", err, tol);

    CASE("vendored: calls of several sizes, each on its GEMM variant (NAME_variant: the largest bucket <= T) and route path");
    {
        /* the tuned example specs hold a GEMM variant per tuning-table bucket (manifest.json, "variants");
         * each size runs the variant of its bucket with the workspace of the capacity's layout */
        /* and each route path (moe_route_fuse_mode; Qwen3: 1 and 4 scatter in route, 5 .. 64 plan in route,
         * 65 on separate; all separate with MOEGEN_ROUTE_FUSE=off) */
        static const int sizes[] = {1, 4, 5, 7, 64, 65, 127, 128, 500, 4095, 4096};
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            const int Tn = sizes[si];
            if (Tn > N(_MAX_TOKENS))
                continue;
            uint16_t *xn = (uint16_t *)malloc((size_t)Tn * H * 2), *yn = (uint16_t *)malloc((size_t)Tn * H * 2);
            for (size_t i = 0; i < (size_t)Tn * H; i++) xn[i] = moe_float_to_half(urand(), dt);
            void *dxn = NULL, *dyn = NULL;
            CHECK(cudaMalloc(&dxn, (size_t)Tn * H * 2) == cudaSuccess && cudaMalloc(&dyn, (size_t)Tn * H * 2) == cudaSuccess);
            cudaMemcpy(dxn, xn, (size_t)Tn * H * 2, cudaMemcpyHostToDevice);
            cudaMemset(dyn, 0xff, (size_t)Tn * H * 2);
            cudaMemset(dws, 0xff, N(_WORKSPACE_BYTES));
            N(_args_t) an = a;
            an.tokens = Tn, an.x = dxn, an.y = dyn;
#ifdef VENDORED_OWN
            an.router_x = dxn;   /* Tn rows: x itself serves as the router's input here */
#endif
            e = N(_forward)(&an, 0);
            CHECKF(e == cudaSuccess, "forward at T=%d: %s", Tn, cudaGetErrorString(e));
            e = cudaDeviceSynchronize();
            CHECKF(e == cudaSuccess, "kernel fault at T=%d: %s", Tn, cudaGetErrorString(e));
            cudaMemcpy(yn, dyn, (size_t)Tn * H * 2, cudaMemcpyDeviceToHost);
            int *idn = (int *)malloc((size_t)Tn * K * 4);
            float *wn = (float *)malloc((size_t)Tn * K * 4), *yrn = (float *)malloc((size_t)Tn * H * 4);
            moe_ref_inputs_t inn = in;
            inn.x = xn, inn.tokens = Tn;
#ifdef VENDORED_OWN
            inn.router_x = xn;   /* as the forward's */
#endif
            CHECK(moe_ref_route(&s, &inn, idn, wn, NULL) == 0);
            int sn[32], nsn = 0;
            for (int t = 0; t < Tn && nsn < 32; t += Tn / 32 + 1) sn[nsn++] = t;
            CHECK(moe_ref_ffn(&s, &inn, idn, wn, sn, nsn, yrn, NULL, NULL) == 0);
            double nn = 0, dd = 0;
            int fin = 1;
            for (size_t i = 0; i < (size_t)Tn * H; i++) fin &= isfinite(moe_half_to_float(yn[i], dt)) != 0;
            for (int i = 0; i < nsn; i++)
                for (size_t h = 0; h < H; h++) {
                    double g = moe_half_to_float(yn[sn[i] * H + h], dt), r = yrn[sn[i] * H + h];
                    nn += (g - r) * (g - r);
                    dd += r * r;
                }
            const double en = sqrt(nn / dd);
            fprintf(stderr, "  vendored %s T=%d: layer error %.2e (tolerance %.1e)\n", s.name, Tn, en, tol);
            CHECKF(fin, "T=%d: y has unwritten (poisoned) or non-finite elements", Tn);
            CHECKF(en <= tol, "T=%d: layer error %.3e > %.1e", Tn, en, tol);
            free(xn), free(yn), free(idn), free(wn), free(yrn);
            cudaFree(dxn), cudaFree(dyn);
        }
    }

    CASE("vendored: the device pack of gate_up_proj [E, H, 2F] (gate at even columns) is the host pack");
    {
        uint16_t *gu = (uint16_t *)malloc(E * 2 * F * H * 2), *got = (uint16_t *)malloc(E * 2 * F * H * 2);
        for (size_t ex = 0; ex < E; ex++)
            for (size_t f = 0; f < F; f++)
                for (size_t h = 0; h < H; h++) {
                    gu[(ex * H + h) * 2 * F + 2 * f] = w1[(ex * 2 * F + f) * H + h];
                    gu[(ex * H + h) * 2 * F + 2 * f + 1] = w1[(ex * 2 * F + F + f) * H + h];
                }
        void *dgu = NULL, *dout = NULL;
        CHECK(cudaMalloc(&dgu, E * 2 * F * H * 2) == cudaSuccess && cudaMalloc(&dout, E * 2 * F * H * 2) == cudaSuccess);
        cudaMemcpy(dgu, gu, E * 2 * F * H * 2, cudaMemcpyHostToDevice);
        cudaMemset(dout, 0xff, E * 2 * F * H * 2);
        const long long st[3] = {(long long)(2 * F * H), 2, (long long)(2 * F)};
        e = N(_pack)(0, dout, dgu, (const uint16_t *)dgu + 1, st, st, 0, (int)E, 0);
        CHECKF(e == cudaSuccess, "pack: %s", cudaGetErrorString(e));
        e = cudaDeviceSynchronize();
        CHECKF(e == cudaSuccess, "pack kernel fault: %s", cudaGetErrorString(e));
        cudaMemcpy(got, dout, E * 2 * F * H * 2, cudaMemcpyDeviceToHost);
        CHECK(memcmp(got, w1p, E * 2 * F * H * 2) == 0);
        CHECK(N(_pack)(0, dout, dgu, NULL, st, st, 0, (int)E, 0) == cudaErrorInvalidValue);
        CHECK(N(_pack)(0, dout, dgu, dgu, st, st, 1, (int)E, 0) == cudaErrorInvalidValue);
        cudaFree(dgu);
        cudaFree(dout);
        free(gu);
        free(got);
    }
    CASE("vendored: one process drives two GPUs (the per-device state), each forward bit for bit the first's");
    if (count < 2) {
        SKIP("one GPU (%d): needs two in this process", count);
    } else {
        /* the same inputs on device 1, its forward, then device 0's again: the
         * kernels are deterministic, so every y equals the checked one */
#ifdef VENDORED_FP8 /* the e4m3 weights and scales the forward reads (device 0's, read back) */
        const size_t wb1 = E * 2 * F * H, wb2 = E * H * F, sb1 = n1s * 4, sb2 = n2s * 4;
        void *hw1 = malloc(wb1), *hw2 = malloc(wb2), *hs1 = malloc(sb1), *hs2 = malloc(sb2);
        cudaMemcpy(hw1, a.w1p, wb1, cudaMemcpyDeviceToHost), cudaMemcpy(hw2, a.w2, wb2, cudaMemcpyDeviceToHost);
        cudaMemcpy(hs1, a.w1s, sb1, cudaMemcpyDeviceToHost), cudaMemcpy(hs2, a.w2s, sb2, cudaMemcpyDeviceToHost);
        const void *host[] = {x, wr, hw1, hw2, b1p, b2, sb, lb, wsg, hs1, hs2};
        const size_t bytes[] = {T * H * 2, E * H * 2, wb1, wb2, E * 2 * F * 2, E * H * 2, E * 4, E * 4, H * 2, sb1, sb2};
        const int nd = 11;
#else
        const void *host[] = {x, wr, w1p, w2, b1p, b2, sb, lb, wsg};
        const size_t bytes[] = {T * H * 2, E * H * 2, ES * 2 * F * H * 2, ES * H * F * 2, E * 2 * F * 2,
                                E * H * 2, E * 4, E * 4, H * 2};
        const int nd = 9;
#endif
        void *d1[11] = {NULL}, *y1 = NULL, *ws1d = NULL;
        int ok = cudaSetDevice(1) == cudaSuccess;
        for (int i = 0; ok && i < nd; i++)
            ok = cudaMalloc(&d1[i], bytes[i]) == cudaSuccess &&
                 cudaMemcpy(d1[i], host[i], bytes[i], cudaMemcpyHostToDevice) == cudaSuccess;
        ok = ok && cudaMalloc(&y1, T * H * 2) == cudaSuccess && cudaMalloc(&ws1d, N(_WORKSPACE_BYTES)) == cudaSuccess &&
             cudaMemset(y1, 0xff, T * H * 2) == cudaSuccess &&
             cudaMemset(ws1d, 0xff, N(_WORKSPACE_BYTES)) == cudaSuccess;
        CHECKF(ok, "device 1: setting up: %s", cudaGetErrorString(cudaGetLastError()));
        if (ok) {
            N(_args_t) b = {T, d1[0], d1[1], (const float *)d1[6], (const float *)d1[7], d1[2], d1[4], d1[3], d1[5],
                            y1, ws1d, d1[8]};
#ifdef VENDORED_FP8
            b.w1s = (const float *)d1[9], b.w2s = (const float *)d1[10];
#endif
            uint16_t *got = (uint16_t *)malloc(T * H * 2);
            e = N(_forward)(&b, 0);
            CHECKF(e == cudaSuccess, "device 1 forward: %s", cudaGetErrorString(e));
            e = cudaDeviceSynchronize();
            CHECKF(e == cudaSuccess, "device 1 kernel fault: %s", cudaGetErrorString(e));
            cudaMemcpy(got, y1, T * H * 2, cudaMemcpyDeviceToHost);
            CHECKF(memcmp(got, y, T * H * 2) == 0, "device 1's y differs from device 0's");
            cudaSetDevice(0);
            cudaMemset(dy, 0xff, T * H * 2);
            e = N(_forward)(&a, 0);
            CHECKF(e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "device 0 after device 1: %s",
                   cudaGetErrorString(e));
            cudaMemcpy(got, dy, T * H * 2, cudaMemcpyDeviceToHost);
            CHECKF(memcmp(got, y, T * H * 2) == 0, "device 0's y after device 1's call differs");
            free(got);
        }
        cudaSetDevice(1);
        for (int i = 0; i < nd; i++)
            cudaFree(d1[i]);
#ifdef VENDORED_FP8
        free(hw1), free(hw2), free(hs1), free(hs2);
#endif
        cudaFree(y1);
        cudaFree(ws1d);
        cudaSetDevice(0);
    }
    return check_report("test_vendored");
}
