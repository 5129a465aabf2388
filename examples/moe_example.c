/* moe_example.c — use libmoegen from C with its public header alone: load a
 * spec, fill random weights, run the forward pass, check the output and
 * print its time.
 *
 *   cc moe_example.c $(pkg-config --cflags --libs moegen) -o moe_example
 *   ./moe_example examples/specs/qwen3-30b-a3b.moe [TOKENS]
 *
 * The plan says every tensor's shape and type (moe_plan_tensor), so the
 * program needs nothing from the spec itself. Device memory goes through
 * the CUDA driver, loaded with dlopen as libmoegen loads it, so this
 * program, like the library, starts on a machine without a GPU and says so.
 * The output is poisoned before the forward and checked after it: every
 * element written and finite. (The tests check the layer against a CPU
 * reference: tests/test_gpu.c.) */
#define _POSIX_C_SOURCE 200809L
#include <moe.h>

#include <dlfcn.h>
#include <math.h> /* isfinite */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA driver calls the example makes (cuda.h's types, spelled here so
 * that moe.h is the only header needed). */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
    CUresult (*EventCreate)(void **, unsigned);
    CUresult (*EventRecord)(void *, void *);
    CUresult (*EventSynchronize)(void *);
    CUresult (*EventElapsedTime)(float *, void *, void *);
} cu;

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    void **f = (void **)&cu;
    static const char *const names[] = {"cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemsetD16_v2",
                                        "cuEventCreate", "cuEventRecord", "cuEventSynchronize",
                                        "cuEventElapsedTime_v2"};
    for (size_t i = 0; h && i < sizeof names / sizeof *names; i++)
        if (!(f[i] = dlsym(h, names[i])) && i == 7) /* drivers before CUDA 12.8 have no _v2 */
            f[i] = dlsym(h, "cuEventElapsedTime");
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!f[i]) {
            fprintf(stderr, "moe_example: the CUDA driver has no %s\n", names[i]);
            exit(1);
        }
}

/* The square root by Newton's method (so the example needs no -lm). */
static double root(double v) {
    double x = v > 1 ? v : 1;
    for (int i = 0; i < 60 && v > 0; i++)
        x = 0.5 * (x + v / x);
    return v > 0 ? x : 0;
}

/* x = uniform random in [-scale, scale), as bf16 or fp16 bits. */
static uint64_t seed = 0x1234567;
static uint16_t to_half(float x, int bf16) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (bf16)
        return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); /* round to nearest even */
    /* fp16 for the small values used here: normal range, round to nearest */
    uint32_t sign = (u >> 16) & 0x8000;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (exp <= 0)
        return (uint16_t)sign; /* tiny: zero */
    uint32_t h = sign | (uint32_t)exp << 10 | (mant + 0x1000) >> 13;
    return (uint16_t)h;
}
static float from_half(uint16_t h, int bf16) {
    uint32_t u;
    if (bf16) {
        u = (uint32_t)h << 16;
    } else {
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
        u = (uint32_t)(h & 0x8000) << 16 | (e == 31 ? 0xff : e ? e - 15 + 127 : 0) << 23 | (e ? m << 13 : 0);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A device tensor of plan tensor `name` (NULL when the spec takes none),
 * random in [-scale, scale) (fp32 tensors: zero). */
static void *tensor(const moe_plan *plan, const char *name, float scale, size_t *count) {
    int rank = 0;
    int64_t dims[4];
    const char *dtype = "";
    moe_plan_tensor(plan, name, &rank, dims, &dtype);
    if (rank == 0)
        return NULL;
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    size_t esz = strcmp(dtype, "fp32") == 0 ? 4 : 2;
    void *h = calloc(n, esz);
    for (size_t i = 0; esz == 2 && i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        ((uint16_t *)h)[i] = to_half(((float)(seed >> 40) / 16777216.0f * 2 - 1) * scale, strcmp(dtype, "bf16") == 0);
    }
    CUdeviceptr d = 0;
    if (!h || cu.MemAlloc(&d, n * esz) || cu.MemcpyHtoD(d, h, n * esz)) {
        fprintf(stderr, "moe_example: cannot allocate or copy %s (%zu bytes) on the GPU\n", name, n * esz);
        exit(1);
    }
    free(h);
    if (count)
        *count = n;
    return (void *)(uintptr_t)d;
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
    load_driver(); /* the plan loaded it: a GPU is there */
    moe_plan_info info = {0};
    moe_plan_get_info(plan, &info);
    int T = argc > 2 ? atoi(argv[2]) : (info.tokens < 512 ? info.tokens : 512);
    if (T < 1 || T > info.tokens) {
        fprintf(stderr, "moe_example: TOKENS must be 1 .. %d (the spec's tokens)\n", info.tokens);
        return 2;
    }
    const char *dtype = "";
    moe_plan_tensor(plan, "x", NULL, NULL, &dtype);
    int bf16 = strcmp(dtype, "bf16") == 0;
    float H = (float)info.hidden, F = (float)info.ffn;
    /* random weights, already in the packed layouts (a checkpoint's would go
     * through moe_plan_pack, README "Weight layouts") */
    size_t nx;
    moe_forward_args a = {.tokens = T, .x = tensor(plan, "x", 1, &nx), .router_w = tensor(plan, "router_w", 4 / (float)root(H), NULL),
                          .router_bias = tensor(plan, "router_bias", 0, NULL),
                          .router_logit_bias = tensor(plan, "router_logit_bias", 0, NULL),
                          .w1p = tensor(plan, "w1p", 2 / (float)root(H), NULL), .b1p = tensor(plan, "b1p", 0.5f, NULL),
                          .w2 = tensor(plan, "w2", 2 / (float)root(F), NULL), .b2 = tensor(plan, "b2", 0.5f, NULL),
                          .y = tensor(plan, "y", 0, NULL), .shared_gate = tensor(plan, "shared_gate", 2 / (float)root(H), NULL)};
    size_t ny = (size_t)T * info.hidden, wsb = moe_plan_workspace_size(plan, T);
    CUdeviceptr ws;
    if (cu.MemAlloc(&ws, wsb)) {
        fprintf(stderr, "moe_example: no memory for the workspace (%zu bytes)\n", wsb);
        return 1;
    }
    a.workspace = (void *)(uintptr_t)ws;
    cu.MemsetD16((CUdeviceptr)(uintptr_t)a.y, 0x7fff, nx); /* poison: NaN in bf16 and fp16 */
    void *e0, *e1;
    cu.EventCreate(&e0, 0);
    cu.EventCreate(&e1, 0);
    float ms = 0;
    for (int i = 0; i < 4; i++) { /* the last of warm-ups and runs is timed */
        cu.EventRecord(e0, NULL);
        if ((s = moe_forward(plan, &a, NULL)) != MOE_OK) {
            fprintf(stderr, "moe_example: forward: %s: %s\n", moe_status_string(s), moe_last_error());
            return 1;
        }
        cu.EventRecord(e1, NULL);
        cu.EventSynchronize(e1);
        cu.EventElapsedTime(&ms, e0, e1);
    }
    uint16_t *y = malloc(ny * 2);
    if (!y || cu.MemcpyDtoH(y, (CUdeviceptr)(uintptr_t)a.y, ny * 2)) {
        fprintf(stderr, "moe_example: cannot read y back\n");
        return 1;
    }
    size_t bad = 0;
    double rms = 0;
    for (size_t i = 0; i < ny; i++) {
        float v = from_half(y[i], bf16);
        bad += !isfinite(v);
        rms += isfinite(v) ? (double)v * v : 0;
    }
    printf("%s: %d tokens in %.3f ms; output rms %.4g, %zu of %zu values not finite\n", info.name, T, ms,
           root(rms / (double)ny), bad, ny);
    moe_plan_destroy(plan);
    return bad ? 1 : 0;
}
