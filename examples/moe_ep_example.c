/* moe_ep_example.c — one expert-parallel MoE layer over several GPUs: one
 * process per rank, NCCL between them.
 *
 *   build/moe_ep_example [SPEC RANKS [TOKENS]]   (default examples/specs/deepseek-v3-ep8-mesh.moe 8 128)
 *
 * RANKS is the spec's mesh size (dp x fsdp x ep); a different number makes
 * every plan fail with the reason.
 *
 * The launcher makes an NCCL unique id and starts one process per rank of
 * the spec's mesh (rank r on GPU r); each joins the communicator, creates its
 * plan with it, fills its stored expert shard with random weights, gathers
 * its held experts over its FSDP group, runs the layer on its own random
 * tokens and prints the time and a checksum. Needs as many GPUs as the mesh
 * has devices and libnccl.so.2 on LD_LIBRARY_PATH. */
#define _POSIX_C_SOURCE 200809L
#include <moe.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The types of the few CUDA driver (cuda.h) and NCCL (nccl.h) calls the
 * example makes, spelled here so that moe.h is the only header it needs. */
typedef int CUresult, CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId; /* NCCL_UNIQUE_ID_BYTES */
enum { ncclSuccess = 0 };

/* The driver and NCCL calls, from the libraries the process loads
 * (libmoegen loads the same ones). */
static void *sym(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) {
        fprintf(stderr, "moe_ep_example: %s not found: %s\n", name, dlerror());
        exit(1);
    }
    return f;
}

/* A library the example needs (what: "the CUDA driver", "NCCL"), or exit
 * saying why it did not load. */
static void *need(const char *lib, const char *what) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "moe_ep_example: %s did not load: %s\n", what, dlerror());
        exit(1);
    }
    return h;
}

static unsigned short rnd(unsigned *s) { /* small bf16 values */
    *s = *s * 1664525u + 1013904223u;
    float f = ((float)(*s >> 8) / 16777216.f - 0.5f) * 0.1f;
    unsigned u;
    memcpy(&u, &f, 4);
    return (unsigned short)(u >> 16);
}

static void *upload(CUresult (*alloc)(CUdeviceptr *, size_t), CUresult (*h2d)(CUdeviceptr, const void *, size_t),
                    size_t n, unsigned seed) {
    unsigned short *h = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        h[i] = rnd(&seed);
    CUdeviceptr d = 0;
    if (alloc(&d, 2 * n) || h2d(d, h, 2 * n)) {
        fprintf(stderr, "moe_ep_example: device allocation of %zu bytes failed\n", 2 * n);
        exit(1);
    }
    free(h);
    return (void *)(uintptr_t)d;
}

static int run_rank(const char *spec, int rank, int world, const char *idfile, int T) {
    void *cu = need("libcuda.so.1", "the CUDA driver"), *nc = need("libnccl.so.2", "NCCL");
    CUresult (*cuInit)(unsigned) = sym(cu, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym(cu, "cuDeviceGet");
    CUresult (*cuRetain)(CUcontext *, CUdevice) = sym(cu, "cuDevicePrimaryCtxRetain");
    CUresult (*cuSetCurrent)(CUcontext) = sym(cu, "cuCtxSetCurrent");
    CUresult (*cuAlloc)(CUdeviceptr *, size_t) = sym(cu, "cuMemAlloc_v2");
    CUresult (*cuH2D)(CUdeviceptr, const void *, size_t) = sym(cu, "cuMemcpyHtoD_v2");
    CUresult (*cuD2H)(void *, CUdeviceptr, size_t) = sym(cu, "cuMemcpyDtoH_v2");
    CUresult (*cuSync)(void) = sym(cu, "cuCtxSynchronize");
    ncclResult_t (*commInit)(ncclComm_t *, int, ncclUniqueId, int) = sym(nc, "ncclCommInitRank");
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, rank) || cuRetain(&ctx, dev) || cuSetCurrent(ctx)) {
        fprintf(stderr, "rank %d: no GPU %d\n", rank, rank);
        return 1;
    }
    ncclUniqueId id;
    FILE *f = fopen(idfile, "rb");
    if (!f || fread(&id, sizeof id, 1, f) != 1)
        return 1;
    fclose(f);
    ncclComm_t comm;
    if (commInit(&comm, world, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommInitRank failed\n", rank);
        return 1;
    }
    moe_options o = {.device = rank, .rank = rank, .nccl_comm = comm};
    moe_plan *plan;
    moe_status s = moe_plan_create(&plan, spec, &o);
    if (s) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, moe_status_string(s), moe_last_error());
        return 1;
    }
    moe_plan_info in;
    moe_plan_get_info(plan, &in);
    size_t H = in.hidden, F = in.ffn;
    /* this rank's stored shard (random weights stand in for a checkpoint's, already packed) */
    moe_gather_args g = {.stored = {upload(cuAlloc, cuH2D, in.stored * 2 * F * H, 1 + rank), NULL,
                                    upload(cuAlloc, cuH2D, in.stored * H * F, 2 + rank), NULL},
                         .held_w1p = upload(cuAlloc, cuH2D, in.held * 2 * F * H, 3),
                         .held_w2 = upload(cuAlloc, cuH2D, in.held * H * F, 4)};
    float *bias = calloc(in.experts, sizeof *bias);
    CUdeviceptr db;
    cuAlloc(&db, 4 * in.experts);
    cuH2D(db, bias, 4 * in.experts);
    moe_forward_args a = {.tokens = T, .x = upload(cuAlloc, cuH2D, (size_t)T * H, 5 + rank),
                          .router_w = upload(cuAlloc, cuH2D, (size_t)in.experts * H, 6),
                          .router_bias = (const float *)(uintptr_t)db, .w1p = g.held_w1p, .w2 = g.held_w2,
                          .y = upload(cuAlloc, cuH2D, (size_t)T * H, 7)};
    CUdeviceptr ws;
    if (cuAlloc(&ws, moe_plan_workspace_size(plan, T))) {
        fprintf(stderr, "rank %d: no memory for the workspace\n", rank);
        return 1;
    }
    a.workspace = (void *)(uintptr_t)ws;
    if ((s = moe_gather_weights(plan, &g, NULL)) || (s = moe_forward(plan, &a, NULL)) || cuSync()) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, moe_status_string(s), moe_last_error());
        return 1;
    }
    unsigned short *y = malloc(2 * (size_t)T * H);
    cuD2H(y, (CUdeviceptr)(uintptr_t)a.y, 2 * (size_t)T * H);
    double sum = 0;
    for (size_t i = 0; i < (size_t)T * H; i++) {
        unsigned u = (unsigned)y[i] << 16;
        float v;
        memcpy(&v, &u, 4);
        sum += v;
    }
    printf("rank %d (EP rank %d of %d, %d held experts): %d tokens, output checksum %.6g\n", rank, in.ep_rank, in.ep,
           in.held, T, sum);
    moe_plan_destroy(plan);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "--rank") == 0)
        return run_rank(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5], atoi(argv[6]));
    const char *spec = argc > 2 ? argv[1] : "examples/specs/deepseek-v3-ep8-mesh.moe";
    int world = argc > 2 ? atoi(argv[2]) : 8;
    const char *tokens = argc > 3 ? argv[3] : "128";
    if (world < 1) {
        fprintf(stderr, "usage: moe_ep_example [SPEC RANKS [TOKENS]]\n");
        return 2;
    }
    need("libcuda.so.1", "the CUDA driver"); /* said once here, not by every rank */
    void *nc = need("libnccl.so.2", "NCCL");
    ncclResult_t (*getId)(ncclUniqueId *) = sym(nc, "ncclGetUniqueId");
    ncclUniqueId id;
    getId(&id);
    char idfile[64];
    snprintf(idfile, sizeof idfile, "/tmp/moe_ep_example_%d", (int)getpid());
    FILE *f = fopen(idfile, "wb");
    fwrite(&id, sizeof id, 1, f);
    fclose(f);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int failed = 0;
    for (int r = 0; r < world; r++)
        if (fork() == 0) {
            char rs[16], ws[16];
            snprintf(rs, sizeof rs, "%d", r);
            snprintf(ws, sizeof ws, "%d", world);
            execl("/proc/self/exe", argv[0], "--rank", spec, rs, ws, idfile, tokens, (char *)NULL);
            _exit(127);
        }
    for (int r = 0; r < world; r++) {
        int st;
        wait(&st);
        failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    unlink(idfile);
    return failed ? 1 : 0;
}
