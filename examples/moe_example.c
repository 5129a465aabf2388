/* moe_example.c — use libmoegen from C: load a spec, fill random weights,
 * run the forward pass, print its time and its error against the CPU
 * reference on a few tokens.
 *
 *   build/moe_example examples/specs/qwen3-30b-a3b.moe [TOKENS]
 *
 * Device memory is handled through the CUDA driver API that libmoegen loads
 * (runtime/driver.h), so this program, like the library, starts on a
 * machine without a GPU and says so. */
#include "driver.h"
#include "moe.h"
#include "ref.h"
#include "spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t seed = 0x1234567;
static void fill(uint16_t *p, size_t n, float scale, moe_dtype_t dt) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = moe_float_to_half(((float)(seed >> 40) / 16777216.0f * 2 - 1) * scale, dt);
    }
}

static CUdeviceptr upload(const void *h, size_t bytes) {
    CUdeviceptr d = 0;
    if (moe_cu.cuMemAlloc(&d, bytes) != CUDA_SUCCESS || (h && moe_cu.cuMemcpyHtoD(d, h, bytes) != CUDA_SUCCESS)) {
        fprintf(stderr, "moe_example: cannot allocate or copy %zu bytes on the GPU\n", bytes);
        exit(1);
    }
    return d;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: moe_example SPEC [TOKENS]\n");
        return 2;
    }
    moe_plan *plan;
    moe_status s = moe_plan_create(&plan, argv[1], NULL);
    if (s != MOE_OK) {
        fprintf(stderr, "moe_example: %s: %s\n", moe_status_string(s), moe_last_error());
        return 1;
    }
    moe_spec_t spec;
    moe_diag_t d;
    moe_spec_load(&spec, argv[1], NULL, NULL, 0, &d);
    int T = argc > 2 ? atoi(argv[2]) : (spec.tokens < 512 ? spec.tokens : 512);
    size_t E = spec.experts, H = spec.hidden, F = spec.ffn, K = spec.top_k;
    size_t ES = (size_t)moe_spec_slots(&spec), FS = (size_t)spec.shared.ffn; /* a shared expert: slots E.. */
    moe_dtype_t dt = spec.dtype;
    uint16_t *x = malloc(T * H * 2), *wr = malloc(E * H * 2), *w1 = malloc(E * 2 * F * H * 2);
    uint16_t *w1p = malloc(ES * 2 * F * H * 2), *w2 = malloc(ES * H * F * 2);
    uint16_t *ws1 = malloc(2 * FS * H * 2 + 2), *ws2 = malloc(H * FS * 2 + 2), *wsg = malloc(H * 2);
    uint16_t *b1 = malloc(E * 2 * F * 2), *b1p = malloc(E * 2 * F * 2), *b2 = malloc(E * H * 2);
    float *bias = calloc(E, 4);
    fill(x, T * H, 1, dt);
    fill(wr, E * H, 4 / sqrtf(H), dt);
    fill(w1, E * 2 * F * H, 2 / sqrtf(H), dt);
    fill(w2, E * H * F, 2 / sqrtf(F), dt);
    fill(b1, E * 2 * F, 0.5f, dt);
    fill(b2, E * H, 0.5f, dt);
    fill(ws1, 2 * FS * H, 2 / sqrtf(H), dt);
    fill(ws2, H * FS, FS ? 2 / sqrtf(FS) : 0, dt);
    fill(wsg, H, 2 / sqrtf(H), dt);
    moe_plan_pack_w1(plan, w1, w1p);
    moe_plan_pack_b1(plan, b1, b1p);
    if (FS) /* the shared expert's unsplit weights into slots E .. ES-1 */
        moe_plan_pack_shared(plan, ws1, ws2, w1p, w2);
    moe_forward_args a = {.tokens = T, .x = (void *)upload(x, T * H * 2), .router_w = (void *)upload(wr, E * H * 2),
                          .router_bias = (float *)upload(bias, E * 4), .router_logit_bias = (float *)upload(bias, E * 4),
                          .w1p = (void *)upload(w1p, ES * 2 * F * H * 2), .b1p = (void *)upload(b1p, E * 2 * F * 2),
                          .w2 = (void *)upload(w2, ES * H * F * 2), .b2 = (void *)upload(b2, E * H * 2),
                          .y = (void *)upload(NULL, T * H * 2),
                          .workspace = (void *)upload(NULL, moe_plan_workspace_size(plan, T)),
                          .shared_gate = (void *)upload(wsg, H * 2)};
    CUevent e0, e1;
    moe_cu.cuEventCreate(&e0, 0);
    moe_cu.cuEventCreate(&e1, 0);
    float ms = 0;
    for (int i = 0; i < 4; i++) { /* the last of warm-ups and runs is timed */
        moe_cu.cuEventRecord(e0, NULL);
        if ((s = moe_forward(plan, &a, NULL)) != MOE_OK) {
            fprintf(stderr, "moe_example: forward: %s\n", moe_last_error());
            return 1;
        }
        moe_cu.cuEventRecord(e1, NULL);
        moe_cu.cuEventSynchronize(e1);
        moe_cu.cuEventElapsedTime(&ms, e0, e1);
    }
    uint16_t *y = malloc(T * H * 2);
    moe_cu.cuMemcpyDtoH(y, (CUdeviceptr)a.y, T * H * 2);
    int *idx = malloc(T * K * 4), list[8], n = 0;
    float *w = malloc(T * K * 4), *yref = malloc(T * H * 4);
    moe_ref_inputs_t in = {.x = x, .wr = wr, .w1 = w1, .w2 = w2, .b1 = b1, .b2 = b2, .sel_bias = bias,
                           .logit_bias = bias, .tokens = T, .ws1 = ws1, .ws2 = ws2, .wsg = wsg};
    moe_ref_route(&spec, &in, idx, w, NULL);
    for (int t = 0; t < T && n < 8; t += T / 8 + 1)
        list[n++] = t;
    moe_ref_ffn(&spec, &in, idx, w, list, n, yref, NULL, NULL);
    double num = 0, den = 0;
    for (int i = 0; i < n; i++)
        for (size_t h = 0; h < H; h++) {
            double g = moe_half_to_float(y[list[i] * H + h], dt), r = yref[list[i] * H + h];
            num += (g - r) * (g - r);
            den += r * r;
        }
    printf("%s: %d tokens in %.3f ms; error vs the CPU reference on %d tokens: %.2e (normalized L2)\n", spec.name, T,
           ms, n, sqrt(num / den));
    moe_plan_destroy(plan);
    return 0;
}
