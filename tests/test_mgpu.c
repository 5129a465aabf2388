/* test_mgpu.c — the expert-parallel layer on several GPUs, one process per
 * rank, over NCCL (`make test-mgpu`).
 *
 * The launcher creates an NCCL unique id, writes it to a file, and starts one
 * child per rank (fork + exec of this program with --child) with
 * NCCL_NVLS_ENABLE=0. Each child puts rank r on GPU r, joins the mesh
 * communicator, creates its plan with it (the plan splits the EP and FSDP
 * groups off it), gathers its held experts from its stored shard over the
 * FSDP group, runs the forward on its own tokens, and checks its output
 * against the CPU reference of the whole, unsharded layer (same random layer
 * on every rank for a seed; tolerance: normalized L2 error <= 1.5e-2, bf16).
 * The router and expert biases a spec asks for (router.bias,
 * router.logit_bias, ffn_bias) are random too, and checked.
 *
 * Meshes: world1 (one GPU: the plan takes a communicator of one rank), EP2,
 * EP4, EP8, DP2/FSDP2/EP2 under both expert shardings, EP4 in capacity
 * mode, fsdp2_train (FSDP2, training = true: after the forward check
 * the training forward and the backward on each rank's tokens, then
 * moe_reduce_scatter_grads; each rank's stored experts' weight gradients
 * against the CPU reference of both ranks' tokens together, train_check),
 * ep2_train and fsdp2_ep2_train (the same over the expert-parallel
 * backward: each rank's stored experts against the reference of every
 * token of its dp slice, and its dx against the reference's of its own),
 * and with fp8 weights (quant.weights = "fp8_e4m3", sm_90a) FSDP2,
 * DP2/FSDP2, EP2, EP8, DP2/FSDP2/EP2 and EP4 in capacity mode: each rank
 * quantizes its bf16 shard on the device and gathers the e4m3 weights and
 * scales (moe_gather_weights_fp8), the EP dispatch moves e4m3 rows and
 * their scales, checked against the CPU's quantized recipe; a mesh needing more GPUs than the
 * machine has is reported skipped.
 * --mesh also takes a spec file (e.g. examples/specs/deepseek-v3-ep8-mesh.moe);
 * --set KEY=VALUE (repeatable) overrides a key of the spec(s) run, as
 * `moegen --set` does (dispatch.mode=capacity, dispatch.capacity=N, mesh.ep=4,
 * tokens=N). --tokens is at most the spec's tokens.
 *
 * --bench adds, per rank, after 3 warm-up forwards: the layer time (mean of
 * 20), and with EP > 1 the time of the dispatch and combine transfers alone
 * and their GB/s (bytes this GPU sent + received, its own rows included),
 * then a plain NCCL all-to-all over the rank's EP group (grouped
 * ncclSend/ncclRecv of equal chunks to every EP peer, itself included)
 * moving the EP group's mean dispatch bytes per GPU, timed the same way: the
 * NVLink reference for those GB/s. --bench --no-check skips the whole layer
 * on the host and the CPU reference (for DeepSeek-V3, ~40 GB per rank and a
 * very slow reference): each rank fills its stored experts, tokens and
 * router on the device with random non-zero bf16 (router biases zero, so
 * routing stays balanced), gathers, runs the layer once and checks only that
 * every output row was written (and, in capacity mode, that nothing
 * overflowed), then benchmarks.
 *
 * A rank that fails the check exits 1 after its part of every collective; a
 * rank that stops early (exit 3) would leave its peers waiting in NCCL, so
 * the launcher kills the rest 20 s later.
 *
 * Issue #8, on a machine of 2-8 GPUs (libnccl.so.2 on LD_LIBRARY_PATH, as
 * bench/gpu_session.sh sets it up), from the repository root:
 *   make -j test-mgpu              # builds and runs every mesh the GPUs allow: EP2,
 *                                  # EP4, EP8, DP2/FSDP2/EP2 both shardings, EP4 capacity
 *   B="build/tests/test_mgpu --bench --no-check --mesh examples/specs/deepseek-v3-ep8-mesh.moe"
 *   $B --tokens 128                # DeepSeek-V3 EP8, exact mode
 *   $B --tokens 4096
 *   $B --tokens 128  --set dispatch.mode=capacity --set dispatch.capacity=256
 *   $B --tokens 4096 --set dispatch.mode=capacity --set dispatch.capacity=5120
 * The capacities are 2x and 1.25x the mean rows per peer (tokens * top_k /
 * ep) under balanced routing, many standard deviations clear of an overflow,
 * which would fail the rank with the count. With 4 GPUs add --set mesh.ep=4
 * (64 experts per rank; capacities 512 and 10240), with 2 --set mesh.ep=2
 * (128 per rank; 1024 and 20480).
 *
 * usage: test_mgpu [--mesh NAME|SPEC.moe] [--tokens T] [--set KEY=VALUE]...
 *                  [--bench [--no-check]] */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "driver.h"
#include "ep.h"
#include "ep_data.h"
#include "mesh.h"
#include "moe.h"
#include "moe_internal.h"
#include "nccl_dl.h"
#include "pack_geom.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *text;
} mesh_case_t;

#define LAYER "experts = 32 top_k = 4 hidden = 1024 ffn = 512 tokens = 4096 arch = { 'sm_90a', 'sm_80' }\n"
#define LAYER_FP8                                                                                    \
    "experts = 32 top_k = 4 hidden = 1024 ffn = 512 tokens = 4096 arch = { 'sm_90a' }\n"                 \
    "quant = { weights = 'fp8_e4m3' }\n"
static const mesh_case_t meshes[] = {
    {"world1", "name = 'w1' " LAYER},
    {"ep2", "name = 'ep2' " LAYER "mesh = { ep = 2 }\n"},
    {"ep4", "name = 'ep4' " LAYER "mesh = { ep = 4 }\n"},
    {"ep8", "name = 'ep8' " LAYER "mesh = { ep = 8 }\n"},
    {"dp2_fsdp2_ep2", "name = 'dfe' " LAYER "mesh = { dp = 2, fsdp = 2, ep = 2 }\n"},
    {"dp2_fsdp2_ep2_fsdp_major",
     "name = 'dfe2' " LAYER "mesh = { dp = 2, fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }\n"},
    {"ep4_capacity", "name = 'ep4c' " LAYER "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 8192 }\n"},
    {"fsdp2_train", "name = 'f2t' experts = 8 top_k = 2 hidden = 256 ffn = 128 tokens = 1024 ffn_bias = true "
                    "router = { logit_bias = true } training = true arch = { 'sm_90a', 'sm_80' }\n"
                    "mesh = { fsdp = 2 }\n"},
    {"ep2_train", "name = 'e2t' experts = 8 top_k = 2 hidden = 256 ffn = 128 tokens = 1024 ffn_bias = true "
                  "router = { logit_bias = true } training = true arch = { 'sm_90a', 'sm_80' }\n"
                  "mesh = { ep = 2 }\n"},
    {"fsdp2_ep2_train", "name = 'fe2t' experts = 8 top_k = 2 hidden = 256 ffn = 128 tokens = 1024 "
                        "training = true arch = { 'sm_90a', 'sm_80' }\n"
                        "mesh = { fsdp = 2, ep = 2 }\n"},
    {"fp8_fsdp2", "name = 'f8f2' " LAYER_FP8 "mesh = { fsdp = 2 }\n"},
    {"fp8_dp2_fsdp2", "name = 'f8df' " LAYER_FP8 "mesh = { dp = 2, fsdp = 2 }\n"},
    {"fp8_ep2", "name = 'f8e2' " LAYER_FP8 "mesh = { ep = 2 }\n"},
    {"fp8_ep8", "name = 'f8e8' " LAYER_FP8 "mesh = { ep = 8 }\n"},
    {"fp8_dp2_fsdp2_ep2", "name = 'f8dfe' " LAYER_FP8 "mesh = { dp = 2, fsdp = 2, ep = 2 }\n"},
    {"fp8_ep4_capacity",
     "name = 'f8e4c' " LAYER_FP8 "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 8192 }\n"},
};
#define NMESH (sizeof meshes / sizeof *meshes)

#define MAX_SETS 64
#define MAX_RANKS 64
#define WARMUP 3
#define ITERS 20
#define KILL_AFTER_S 20

/* What a child runs: check only, check then bench, bench only (--no-check). */
enum { RUN_CHECK, RUN_CHECK_BENCH, RUN_BENCH };

static const char usage[] =
    "usage: test_mgpu [--mesh NAME|SPEC.moe] [--tokens T] [--set KEY=VALUE]... [--bench [--no-check]]\n";

/* A child's early stop (exit 3): its peers may be waiting for it in NCCL. */
#define DIE(...)                                                                                     \
    do {                                                                                             \
        fprintf(stderr, "rank %d: ", rank);                                                          \
        fprintf(stderr, __VA_ARGS__);                                                                \
        fprintf(stderr, "\n");                                                                       \
        return 3;                                                                                    \
    } while (0)
#define CUX(call)                                                                                    \
    do {                                                                                             \
        CUresult r_ = (call);                                                                        \
        if (r_ != CUDA_SUCCESS)                                                                      \
            DIE("%s: %s", #call, moe_cu_error_string(r_));                                           \
    } while (0)
#define NCX(call)                                                                                    \
    do {                                                                                             \
        ncclResult_t r_ = (call);                                                                    \
        if (r_ != ncclSuccess)                                                                       \
            DIE("%s: %s", #call, moe_nccl_error_string(r_));                                         \
    } while (0)
#define DEV(p) ((void *)(uintptr_t)(p))

/* A built-in mesh by name, or a spec file (NAME.moe) read whole. */
static int find_mesh(const char *name, mesh_case_t *out) {
    for (size_t i = 0; i < NMESH; i++)
        if (strcmp(meshes[i].name, name) == 0) {
            *out = meshes[i];
            return 0;
        }
    size_t n = strlen(name);
    FILE *f = n > 4 && strcmp(name + n - 4, ".moe") == 0 ? fopen(name, "r") : NULL;
    if (!f)
        return -1;
    static char text[1 << 16];
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    *out = (mesh_case_t){name, text};
    return 0;
}

/* The inputs a spec may add to ep_layer_t (NULL when it does not): router
 * biases fp32 [E], plain b1 [E, 2F] and b2 [E, H]; with fp8 weights the
 * reference's e4m3 weights (made by the caller). Same on every rank. */
typedef struct {
    float *sel, *logit;
    uint16_t *b1, *b2;
    moe_ref_fp8_t f8;
} extras_t;

static int extras_make(extras_t *b, const moe_spec_t *s, uint64_t seed) {
    size_t E = (size_t)s->experts, H = (size_t)s->hidden, F = (size_t)s->ffn;
    *b = (extras_t){0};
    seed += 0x5eed;
    if (s->router.bias && !(b->sel = malloc(4 * E)))
        return -1;
    if (s->router.logit_bias && !(b->logit = malloc(4 * E)))
        return -1;
    for (size_t e = 0; e < E; e++) {
        if (b->sel)
            b->sel[e] = ((float)(ep_rng(&seed) >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
        if (b->logit)
            b->logit[e] = ((float)(ep_rng(&seed) >> 40) / (float)(1 << 24) - 0.5f) * 2.0f;
    }
    if (s->ffn_bias) {
        if (!(b->b1 = malloc(2 * E * 2 * F)) || !(b->b2 = malloc(2 * E * H)))
            return -1;
        ep_fill(b->b1, E * 2 * F, 0.1f, &seed);
        ep_fill(b->b2, E * H, 0.1f, &seed);
    }
    return 0;
}

static void extras_free(extras_t *b) {
    free(b->sel), free(b->logit), free(b->b1), free(b->b2);
    moe_ref_fp8_free(&b->f8);
}

/* ep_layer_error with the spec's biases: normalized L2 error of rank r's y
 * [T, H] against the reference on its tokens; *unwritten counts NaNs (the
 * poison). Returns -1 on failure. */
static double layer_error(const ep_layer_t *l, const extras_t *b, const moe_spec_t *s, int r, int T,
                          const uint16_t *y, int *unwritten) {
    moe_ref_inputs_t bias = {.b1 = b->b1, .b2 = b->b2, .sel_bias = b->sel, .logit_bias = b->logit,
                             .fp8 = moe_spec_fp8(s) ? &b->f8 : NULL};
    return ep_layer_error(l, s, r, T, y, unwritten, &bias);
}

/* `bytes` of device memory at p: random bf16 in (-scale, scale), none zero.
 * Up to 64 MiB is made on the host; the rest are device copies of what is
 * already filled (a larger buffer repeats that block). Synchronous. */
static CUresult fill_device(CUdeviceptr p, size_t bytes, float scale, uint64_t seed) {
    size_t first = bytes < ((size_t)64 << 20) ? bytes : (size_t)64 << 20;
    uint16_t *h = malloc(first ? first : 2);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ep_fill(h, first / 2, scale, &seed);
    uint16_t tiny = moe_float_to_half(scale / 1024, MOE_DTYPE_BF16);
    for (size_t i = 0; i < first / 2; i++)
        if (!(h[i] & 0x7fff))
            h[i] = tiny;
    CUresult r = moe_cu.cuMemcpyHtoD(p, h, first);
    free(h);
    for (size_t done = first; r == CUDA_SUCCESS && done < bytes;) {
        size_t n = done < bytes - done ? done : bytes - done;
        r = moe_cu.cuMemcpyDtoDAsync(p + done, p, n, NULL);
        done += n;
    }
    return r == CUDA_SUCCESS ? moe_cu.cuCtxSynchronize() : r;
}

/* Milliseconds between the events, after waiting for the second. */
static float elapsed_ms(CUevent ev[2]) {
    float ms = 0;
    moe_cu.cuEventSynchronize(ev[1]);
    moe_cu.cuEventElapsedTime(&ms, ev[0], ev[1]);
    return ms;
}

#define LINE_ADD(...) (len += snprintf(line + len, len < sizeof line ? sizeof line - len : 0, __VA_ARGS__))

/* --bench: the layer time, then with EP > 1 the dispatch and combine
 * transfers alone and the NCCL all-to-all reference, as one printed line.
 * Collective over the mesh: every rank runs it, even one whose check failed. */
static int bench_layer(const moe_plan *plan, const moe_forward_args *a, const moe_plan_info *info, const char *name,
                       int rank) {
    char line[1024];
    size_t len = 0;
    CUevent ev[2];
    moe_status st;
    CUX(moe_cu.cuEventCreate(&ev[0], 0));
    CUX(moe_cu.cuEventCreate(&ev[1], 0));
    for (int i = 0; i < WARMUP; i++)
        if ((st = moe_forward(plan, a, NULL)))
            DIE("moe_forward: %s", moe_last_error());
    CUX(moe_cu.cuCtxSynchronize());
    CUX(moe_cu.cuEventRecord(ev[0], NULL));
    for (int i = 0; i < ITERS; i++)
        if ((st = moe_forward(plan, a, NULL)))
            DIE("moe_forward: %s", moe_last_error());
    CUX(moe_cu.cuEventRecord(ev[1], NULL));
    LINE_ADD("  bench %s rank %d: %d tokens, layer %.3f ms", name, rank, a->tokens, elapsed_ms(ev) / ITERS);
    if (info->ep > 1) { /* the dispatch and combine transfers alone */
        moe_ep_call_t *c = malloc(sizeof *c);
        if (!c)
            DIE("out of memory");
        float t[2] = {0, 0};
        double bytes[2] = {0, 0};
        for (int i = 0; i < ITERS; i++)
            for (int step = 0; step < MOE_EP_STEPS; step++) {
                if ((st = moe_ep_step(plan, a, NULL, step, c)))
                    DIE("moe_ep_step %d: %s", step, moe_last_error());
                if (!c->nx)
                    continue;
                int timed = step == 1 || step == 2;
                if (timed)
                    CUX(moe_cu.cuEventRecord(ev[0], NULL));
                if ((st = moe_ep_run_xfers(plan, c, NULL)))
                    DIE("moe_ep_run_xfers: %s", moe_last_error());
                if (timed) {
                    CUX(moe_cu.cuEventRecord(ev[1], NULL));
                    t[step - 1] += elapsed_ms(ev);
                    for (int x = 0; x < c->nx; x++)
                        bytes[step - 1] += (double)c->x[x].bytes;
                }
            }
        free(c);
        for (int k = 0; k < 2; k++)
            LINE_ADD(", %s %.3f ms %.1f GB/s", k ? "combine" : "dispatch", t[k] / ITERS,
                     bytes[k] / (t[k] * 1e-3) / 1e9);

        /* The NVLink reference: the EP group agrees on its mean dispatch bytes
         * per GPU (an all-gather), then moves them as a plain all-to-all. */
        ncclComm_t comm = moe_plan_ep(plan)->ep_comm;
        int P = info->ep;
        double mine = bytes[0] / ITERS, all[MAX_RANKS], mean = 0;
        CUdeviceptr dv, sbuf, rbuf;
        CUX(moe_cu.cuMemAlloc(&dv, sizeof(double) * (size_t)(P + 1)));
        CUX(moe_cu.cuMemcpyHtoD(dv, &mine, sizeof mine));
        NCX(moe_nccl.ncclAllGather(DEV(dv), DEV(dv + sizeof(double)), sizeof(double), ncclUint8, comm, NULL));
        CUX(moe_cu.cuCtxSynchronize());
        CUX(moe_cu.cuMemcpyDtoH(all, dv + sizeof(double), sizeof(double) * (size_t)P));
        moe_cu.cuMemFree(dv);
        for (int p = 0; p < P; p++)
            mean += all[p] / P;
        size_t chunk = (size_t)(mean / (2.0 * P)) / 256 * 256; /* to and from each peer */
        if (chunk) {
            CUX(moe_cu.cuMemAlloc(&sbuf, chunk * (size_t)P));
            CUX(moe_cu.cuMemAlloc(&rbuf, chunk * (size_t)P));
            CUX(moe_cu.cuMemsetD8(sbuf, 0x3c, chunk * (size_t)P));
            float ta = 0;
            for (int i = 0; i < WARMUP + ITERS; i++) {
                if (i >= WARMUP)
                    CUX(moe_cu.cuEventRecord(ev[0], NULL));
                NCX(moe_nccl.ncclGroupStart());
                for (int p = 0; p < P; p++) {
                    NCX(moe_nccl.ncclSend(DEV(sbuf + chunk * (size_t)p), chunk, ncclUint8, p, comm, NULL));
                    NCX(moe_nccl.ncclRecv(DEV(rbuf + chunk * (size_t)p), chunk, ncclUint8, p, comm, NULL));
                }
                NCX(moe_nccl.ncclGroupEnd());
                if (i >= WARMUP) {
                    CUX(moe_cu.cuEventRecord(ev[1], NULL));
                    ta += elapsed_ms(ev);
                } else {
                    CUX(moe_cu.cuCtxSynchronize());
                }
            }
            moe_cu.cuMemFree(sbuf), moe_cu.cuMemFree(rbuf);
            LINE_ADD(", nccl all-to-all %.3f ms %.1f GB/s (%zu bytes per peer)", ta / ITERS,
                     2.0 * P * chunk / (ta / ITERS * 1e-3) / 1e9, chunk);
        } else {
            LINE_ADD(", nccl all-to-all: no bytes to move");
        }
    }
    printf("%s\n", line);
    moe_cu.cuEventDestroy(ev[0]), moe_cu.cuEventDestroy(ev[1]);
    return 0;
}

/* A training spec: the training forward and the backward on this rank's
 * tokens and a random dy (every rank's the same for a seed), on the held
 * weights, then moe_reduce_scatter_grads into poisoned stored buffers.
 * Tokens the GPU routes otherwise than the reference get dy = 0 and the
 * pair runs again; every rank learns which (an all-gather over the mesh
 * communicator `world`). A stored expert's gradients sum the tokens of every
 * rank of this rank's dp slice (its FSDP peers' EP groups: the FSDP group
 * with mesh.ep = 1, the EP group with mesh.fsdp = 1): each stored expert's
 * dw1p, db1p, dw2, db2 must be the CPU reference's gradient of those tokens
 * together, and dx the reference's of this rank's own (normalized L2 error
 * <= 1.5e-2). Then the backward again and accumulate = 1 into random
 * priors: prior + the first call's sums (1e-6).
 * Collective over the mesh. 0 ok, 1 failed, 3 stopped. */
static int train_check(const moe_plan *plan, const moe_spec_t *spec, const moe_mesh_plan_t *mp, int rank, int T,
                       const ep_layer_t *L, const extras_t *X, const moe_forward_args *fa, uint64_t seed,
                       const char *name, ncclComm_t world) {
    const int W = mp->world, K = spec->top_k;
    /* the dp slice: the ranks whose tokens reach this rank's stored experts */
    int slice[MAX_RANKS], fs = 0;
    for (int r = 0; r < W; r++)
        if (mp->ranks[r].coord[MOE_AXIS_DP] == mp->ranks[rank].coord[MOE_AXIS_DP])
            slice[fs++] = r;
    const size_t E = (size_t)spec->experts, H = (size_t)spec->hidden, F = (size_t)spec->ffn;
    const size_t nst = (size_t)mp->nstored, nh = (size_t)mp->nheld;
    const moe_mesh_rank_t *me = &mp->ranks[rank];
    const size_t per[4] = {2 * F * H, spec->ffn_bias ? 2 * F : 0, H * F, spec->ffn_bias ? H : 0};
    static const char *const tname[4] = {"dw1p", "db1p", "dw2", "db2"};
    uint16_t *dy = malloc(2 * (size_t)W * T * H);
    unsigned char *bad = malloc((size_t)T);
    int *gidx = malloc(sizeof(int) * (size_t)T * K), *ridx = malloc(sizeof(int) * (size_t)T * K);
    float *rw = malloc(sizeof(float) * (size_t)T * K);
    if (!dy || !bad || !gidx || !ridx || !rw)
        DIE("out of memory");
    uint64_t dseed = seed + 0xd1;
    ep_fill(dy, (size_t)W * T * H, 1.f, &dseed);
    uint16_t *mine = dy + (size_t)rank * T * H;
    size_t svb = moe_plan_saved_size(plan, T, 0), bwb = moe_plan_backward_workspace_size(plan, T, 0), off = 0, n = 0;
    if (!svb || !bwb)
        DIE("moe_plan_saved_size / moe_plan_backward_workspace_size(%d) are 0: %s", T, moe_last_error());
    CUdeviceptr ddy, saved, bws, gdx, gdwr, gdlb, hg[4] = {0}, sg[4] = {0}, dbad;
    CUX(moe_cu.cuMemAlloc(&ddy, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemAlloc(&saved, svb));
    CUX(moe_cu.cuMemAlloc(&bws, bwb));
    CUX(moe_cu.cuMemAlloc(&gdx, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemAlloc(&gdwr, 4 * E * H));
    CUX(moe_cu.cuMemAlloc(&gdlb, 4 * E));
    CUX(moe_cu.cuMemAlloc(&dbad, (size_t)W * T));
    for (int i = 0; i < 4; i++)
        if (per[i]) {
            CUX(moe_cu.cuMemAlloc(&hg[i], 4 * nh * per[i]));
            CUX(moe_cu.cuMemAlloc(&sg[i], 4 * nst * per[i]));
        }
    moe_train_forward_args ta = {.fwd = *fa, .saved = DEV(saved), .recompute_u = 0};
    moe_backward_args ba = {.tokens = T, .saved = DEV(saved), .x = fa->x, .router_w = fa->router_w, .w1p = fa->w1p,
                            .b1p = fa->b1p, .w2 = fa->w2, .b2 = fa->b2, .dy = DEV(ddy), .workspace = DEV(bws),
                            .dx = DEV(gdx), .d_router_w = (float *)DEV(gdwr),
                            .d_logit_bias = spec->router.logit_bias ? (float *)DEV(gdlb) : NULL,
                            .dw1p = (float *)DEV(hg[0]), .db1p = (float *)DEV(hg[1]), .dw2 = (float *)DEV(hg[2]),
                            .db2 = (float *)DEV(hg[3])};
    moe_ref_inputs_t own = {.x = L->x + (size_t)rank * T * H, .wr = L->wr, .w1 = L->w1, .w2 = L->w2, .b1 = X->b1,
                            .b2 = X->b2, .sel_bias = X->sel, .logit_bias = X->logit, .tokens = T};
    if (moe_ref_route(spec, &own, ridx, rw, NULL))
        DIE("the reference's routing");
    int nbad = 0;
    for (int pass = 0; pass < 2; pass++) { /* the second only when tokens route otherwise */
        CUX(moe_cu.cuMemcpyHtoD(ddy, mine, 2 * (size_t)T * H));
        for (int i = 0; i < 4; i++)
            if (per[i])
                CUX(moe_cu.cuMemsetD8(hg[i], 0xff, 4 * nh * per[i]));
        moe_status st;
        if ((st = moe_forward_train(plan, &ta, NULL)))
            DIE("moe_forward_train: %s", moe_last_error());
        if ((st = moe_backward(plan, &ba, NULL)))
            DIE("moe_backward: %s", moe_last_error());
        CUX(moe_cu.cuCtxSynchronize());
        if (moe_plan_saved_region(plan, 0, T, 0, "topk_idx", &off, &n) || n < sizeof(int) * (size_t)T * K)
            DIE("moe_plan_saved_region(topk_idx): %s", moe_last_error());
        CUX(moe_cu.cuMemcpyDtoH(gidx, saved + off, sizeof(int) * (size_t)T * K));
        int now = 0;
        for (int t = 0; t < T; t++) {
            int differs = 0;
            for (int k = 0; k < K; k++) {
                int found = 0;
                for (int j = 0; j < K; j++)
                    found |= gidx[t * K + k] == ridx[t * K + j];
                differs |= !found;
            }
            bad[t] = (unsigned char)differs;
            now += differs;
            if (differs)
                memset(mine + (size_t)t * H, 0, 2 * H);
        }
        if (pass == 0)
            nbad = now;
        if (!now || pass == 1)
            break;
    }
    /* which tokens each rank zeroed, for the reference */
    CUX(moe_cu.cuMemcpyHtoD(dbad + (size_t)rank * T, bad, (size_t)T));
    NCX(moe_nccl.ncclAllGather(DEV(dbad + (size_t)rank * T), DEV(dbad), (size_t)T, ncclUint8, world, NULL));
    for (int i = 0; i < 4; i++)
        if (per[i])
            CUX(moe_cu.cuMemsetD8(sg[i], 0xff, 4 * nst * per[i]));
    moe_grad_scatter_args ga = {(float *)DEV(hg[0]), (float *)DEV(hg[1]), (float *)DEV(hg[2]), (float *)DEV(hg[3]),
                                (float *)DEV(sg[0]), (float *)DEV(sg[1]), (float *)DEV(sg[2]), (float *)DEV(sg[3]), 0};
    moe_status st = moe_reduce_scatter_grads(plan, &ga, NULL);
    if (st)
        DIE("moe_reduce_scatter_grads: %s", moe_last_error());
    CUX(moe_cu.cuCtxSynchronize());
    unsigned char *allbad = malloc((size_t)W * T);
    if (!allbad)
        DIE("out of memory");
    CUX(moe_cu.cuMemcpyDtoH(allbad, dbad, (size_t)W * T));

    /* the reference of the dp slice's tokens together */
    const int Tg = fs * T;
    uint16_t *xg = malloc(2 * (size_t)Tg * H), *dyg = malloc(2 * (size_t)Tg * H);
    moe_ref_grads_t rg = {.dw1 = malloc(4 * E * 2 * F * H), .db1 = malloc(4 * E * 2 * F), .dw2 = malloc(4 * E * H * F),
                          .db2 = malloc(4 * E * H), .dx = malloc(4 * (size_t)Tg * H)};
    uint16_t *gx = malloc(2 * (size_t)T * H);
    if (!xg || !dyg || !rg.dw1 || !rg.db1 || !rg.dw2 || !rg.db2 || !rg.dx || !gx)
        DIE("out of memory");
    int at = 0; /* this rank's tokens in the slice */
    for (int f = 0; f < fs; f++) {
        const int p = slice[f];
        at = p == rank ? f : at;
        memcpy(xg + (size_t)f * T * H, L->x + (size_t)p * T * H, 2 * (size_t)T * H);
        memcpy(dyg + (size_t)f * T * H, dy + (size_t)p * T * H, 2 * (size_t)T * H);
        for (int t = 0; t < T; t++)
            if (allbad[(size_t)p * T + t])
                memset(dyg + ((size_t)f * T + t) * H, 0, 2 * H);
    }
    moe_ref_inputs_t in = own;
    in.x = xg;
    in.tokens = Tg;
    if (moe_ref_backward(spec, &in, dyg, 0, &rg, NULL))
        DIE("the reference's backward");
    const float *want[4] = {rg.dw1, rg.db1, rg.dw2, rg.db2};
    double err[4] = {0, 0, 0, 0}, dxerr = 0;
    int ok = nbad * 20 <= T + 20;
    { /* dx of this rank's tokens */
        CUX(moe_cu.cuMemcpyDtoH(gx, gdx, 2 * (size_t)T * H));
        double num = 0, den = 0;
        for (size_t k = 0; k < (size_t)T * H; k++) {
            double w = rg.dx[(size_t)at * T * H + k], dd = moe_half_to_float(gx[k], spec->dtype) - w;
            num += dd * dd;
            den += w * w;
        }
        dxerr = sqrt(num / (den > 0 ? den : 1));
        ok &= dxerr <= 1.5e-2;
    }
    for (int i = 0; i < 4; i++) {
        if (!per[i])
            continue;
        size_t cnt = nst * per[i], cols = i == 0 ? H : 1;
        float *got = malloc(4 * cnt), *ref = malloc(4 * cnt);
        if (!got || !ref)
            DIE("out of memory");
        CUX(moe_cu.cuMemcpyDtoH(got, sg[i], 4 * cnt));
        for (size_t q = 0; q < nst; q++) /* dw1p, db1p: plain row r is packed row moe_pack_row(r, F) */
            for (size_t k = 0; k < per[i]; k++) {
                size_t dst = i <= 1 ? (size_t)moe_pack_row((long long)(k / cols), (long long)F) * cols + k % cols : k;
                ref[q * per[i] + dst] = want[i][(size_t)me->stored[q] * per[i] + k];
            }
        double num = 0, den = 0;
        for (size_t k = 0; k < cnt; k++) {
            double dd = (double)got[k] - ref[k];
            num += dd * dd;
            den += (double)ref[k] * ref[k];
        }
        err[i] = sqrt(num / (den > 0 ? den : 1)); /* NaN (the poison) fails below */
        ok &= err[i] <= 1.5e-2;
        free(got), free(ref);
    }
    /* accumulate = 1: the same sums added into random priors (the collectives in place in the held
     * buffers, spent: the backward runs again first) */
    double aerr = 0;
    {
        float *first[4] = {0}, *prior[4] = {0};
        uint64_t prng = seed ^ (0xacc + (uint64_t)rank);
        for (int i = 0; i < 4; i++) {
            if (!per[i])
                continue;
            size_t cnt = nst * per[i];
            if (!(first[i] = malloc(4 * cnt)) || !(prior[i] = malloc(4 * cnt)))
                DIE("out of memory");
            CUX(moe_cu.cuMemcpyDtoH(first[i], sg[i], 4 * cnt));
            for (size_t k = 0; k < cnt; k++)
                prior[i][k] = (float)(ep_rng(&prng) >> 40) / (float)(1 << 24) - 0.5f;
            CUX(moe_cu.cuMemcpyHtoD(sg[i], prior[i], 4 * cnt));
        }
        if ((st = moe_backward(plan, &ba, NULL))) /* the same held gradients again (dy as the last pass) */
            DIE("moe_backward: %s", moe_last_error());
        ga.accumulate = 1;
        if ((st = moe_reduce_scatter_grads(plan, &ga, NULL)))
            DIE("moe_reduce_scatter_grads (accumulate): %s", moe_last_error());
        CUX(moe_cu.cuCtxSynchronize());
        for (int i = 0; i < 4; i++) {
            if (!per[i])
                continue;
            size_t cnt = nst * per[i];
            float *got = malloc(4 * cnt);
            if (!got)
                DIE("out of memory");
            CUX(moe_cu.cuMemcpyDtoH(got, sg[i], 4 * cnt));
            double num = 0, den = 0;
            for (size_t k = 0; k < cnt; k++) {
                double w = (double)first[i][k] + prior[i][k], dd = got[k] - w;
                num += dd * dd;
                den += w * w;
            }
            double e = sqrt(num / (den > 0 ? den : 1));
            aerr = e > aerr || e != e ? e : aerr;
            free(got), free(first[i]), free(prior[i]);
        }
        ok &= aerr <= 1e-6;
    }
    printf("  %s rank %d (ep rank %d, fsdp rank %d, stores experts %d..%d): training, %d tokens (%d routed otherwise, "
           "dy 0), dx %.2e, reduce-scattered gradients against the dp slice's reference: %s %.2e, %s %.2e, %s %.2e, "
           "%s %.2e; accumulate = 1 %.2e: %s\n",
           name, rank, me->ep_rank, me->fsdp_rank, me->stored[0], me->stored[nst - 1], T, nbad, dxerr, tname[0],
           err[0], tname[1], err[1], tname[2], err[2], tname[3], err[3], aerr, ok ? "ok" : "FAIL");
    fflush(stdout);
    CUdeviceptr all[] = {ddy, saved, bws, gdx, gdwr, gdlb, dbad, hg[0], hg[1], hg[2], hg[3], sg[0], sg[1], sg[2], sg[3]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            moe_cu.cuMemFree(all[i]);
    free(dy), free(bad), free(gidx), free(ridx), free(rw), free(allbad), free(xg), free(dyg);
    free(rg.dw1), free(rg.db1), free(rg.dw2), free(rg.db2), free(rg.dx), free(gx);
    return ok ? 0 : 1;
}

static int child(const mesh_case_t *m, int rank, const char *idfile, int T, int mode, uint64_t seed,
                 const moe_override_t *sets, int nsets) {
    char why[512];
    int check = mode != RUN_BENCH;
    if (moe_cu_load(why, sizeof why) || moe_cu.cuInit(0))
        DIE("no driver: %s", why);
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, m->name, m->text, sets, nsets, &d))
        DIE("%s", d.msg);
    moe_mesh_plan_t mp;
    if (moe_mesh_plan_build(&mp, &spec, why, sizeof why))
        DIE("%s", why);
    int W = mp.world;
    CUdevice dev;
    CUcontext ctx;
    CUX(moe_cu.cuDeviceGet(&dev, rank));
    CUX(moe_cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CUX(moe_cu.cuCtxSetCurrent(ctx));
    if (moe_nccl_load(why, sizeof why))
        DIE("%s", why);
    ncclUniqueId id;
    FILE *f = fopen(idfile, "rb");
    if (!f || fread(&id, sizeof id, 1, f) != 1)
        DIE("cannot read the NCCL id from %s", idfile);
    fclose(f);
    ncclComm_t comm;
    ncclResult_t nr = moe_nccl.ncclCommInitRank(&comm, W, id, rank);
    if (nr != ncclSuccess)
        DIE("ncclCommInitRank: %s", moe_nccl_error_string(nr));
    /* the plan reads a spec file: the given text, or with --set the canonical
     * text of the overridden spec */
    char *canon = nsets ? moe_spec_canonical(&spec) : NULL;
    if (nsets && !canon)
        DIE("out of memory");
    char path[128];
    snprintf(path, sizeof path, "/tmp/moegen_mgpu_%d_%d.moe", (int)getppid(), rank);
    f = fopen(path, "w");
    if (!f)
        DIE("cannot write %s", path);
    fputs(canon ? canon : m->text, f);
    fclose(f);
    free(canon);
    moe_options o = {.device = rank, .rank = rank, .nccl_comm = comm};
    moe_plan *plan;
    moe_status st = moe_plan_create(&plan, path, &o);
    unlink(path);
    if (st)
        DIE("moe_plan_create: %s: %s", moe_status_string(st), moe_last_error());
    moe_plan_info info = MOE_PLAN_INFO_INIT;
    moe_plan_get_info(plan, &info);
    size_t E = (size_t)spec.experts, H = (size_t)spec.hidden, F = (size_t)spec.ffn;
    size_t w1e = 2 * F * H, w2e = H * F, nst = (size_t)mp.nstored, nh = (size_t)mp.nheld;
    size_t xb = 2 * (size_t)T * H;
    const moe_mesh_rank_t *me = &mp.ranks[rank];
    const int fp8 = moe_spec_fp8(&spec); /* the stored shard stays bf16 (plain layouts), quantized before the gather */
    ep_layer_t L = {0};
    extras_t X = {0};
    uint16_t *w1p = NULL, *b1p = NULL, *y = malloc(xb);
    if (!y)
        DIE("out of memory");
    if (check) {
        if (ep_layer_make(&L, &spec, W, T, seed) || extras_make(&X, &spec, seed) || !(w1p = malloc(2 * E * w1e)) ||
            (spec.ffn_bias && !(b1p = malloc(2 * E * 2 * F))) ||
            (fp8 && moe_ref_fp8_weights(&spec, L.w1, L.w2, &X.f8)))
            DIE("out of memory");
        moe_plan_pack_w1(plan, L.w1, w1p);
        if (b1p)
            moe_plan_pack_b1(plan, X.b1, b1p);
    }
    CUdeviceptr dx, dy, dwr, dws, s1, s2, h1, h2, dsel = 0, dlogit = 0, sb1 = 0, sb2 = 0, hb1 = 0, hb2 = 0, hs1 = 0,
                hs2 = 0;
    size_t wsb = moe_plan_workspace_size(plan, T);
    if (!wsb)
        DIE("moe_plan_workspace_size(%d): %s", T, moe_last_error());
    CUX(moe_cu.cuMemAlloc(&dx, xb));
    CUX(moe_cu.cuMemAlloc(&dy, xb));
    CUX(moe_cu.cuMemsetD8(dy, 0xff, xb));
    CUX(moe_cu.cuMemAlloc(&dwr, 2 * E * H));
    CUX(moe_cu.cuMemAlloc(&dws, wsb));
    CUX(moe_cu.cuMemsetD8(dws, 0xff, wsb));
    CUX(moe_cu.cuMemAlloc(&s1, 2 * nst * w1e));
    CUX(moe_cu.cuMemAlloc(&s2, 2 * nst * w2e));
    CUX(moe_cu.cuMemAlloc(&h1, 2 * nh * w1e));
    CUX(moe_cu.cuMemAlloc(&h2, 2 * nh * w2e));
    if (fp8) { /* e4m3 in h1, h2 (half their bytes used); scales: at most one per 128 x 128 block or row */
        CUX(moe_cu.cuMemAlloc(&hs1, 4 * nh * 2 * F));
        CUX(moe_cu.cuMemAlloc(&hs2, 4 * nh * H));
        CUX(moe_cu.cuMemsetD8(h1, 0x7f, 2 * nh * w1e)); /* poison: e4m3 and fp32 NaN */
        CUX(moe_cu.cuMemsetD8(h2, 0x7f, 2 * nh * w2e));
        CUX(moe_cu.cuMemsetD8(hs1, 0xff, 4 * nh * 2 * F));
        CUX(moe_cu.cuMemsetD8(hs2, 0xff, 4 * nh * H));
    }
    if (spec.router.bias)
        CUX(moe_cu.cuMemAlloc(&dsel, 4 * E));
    if (spec.router.logit_bias)
        CUX(moe_cu.cuMemAlloc(&dlogit, 4 * E));
    if (spec.ffn_bias) {
        CUX(moe_cu.cuMemAlloc(&sb1, 2 * nst * 2 * F));
        CUX(moe_cu.cuMemAlloc(&sb2, 2 * nst * H));
        CUX(moe_cu.cuMemAlloc(&hb1, 2 * nh * 2 * F));
        CUX(moe_cu.cuMemAlloc(&hb2, 2 * nh * H));
    }
    if (check) { /* this rank's part of the whole layer */
        CUX(moe_cu.cuMemcpyHtoD(dx, L.x + (size_t)rank * T * H, xb));
        CUX(moe_cu.cuMemcpyHtoD(dwr, L.wr, 2 * E * H));
        CUX(moe_cu.cuMemcpyHtoD(s1, (fp8 ? L.w1 : w1p) + me->stored[0] * w1e, 2 * nst * w1e));
        CUX(moe_cu.cuMemcpyHtoD(s2, L.w2 + me->stored[0] * w2e, 2 * nst * w2e));
        if (dsel)
            CUX(moe_cu.cuMemcpyHtoD(dsel, X.sel, 4 * E));
        if (dlogit)
            CUX(moe_cu.cuMemcpyHtoD(dlogit, X.logit, 4 * E));
        if (spec.ffn_bias) {
            CUX(moe_cu.cuMemcpyHtoD(sb1, b1p + me->stored[0] * 2 * F, 2 * nst * 2 * F));
            CUX(moe_cu.cuMemcpyHtoD(sb2, X.b2 + me->stored[0] * H, 2 * nst * H));
        }
    } else { /* random data made on the device; the router is the same on every
              * rank, zero router biases keep the routing balanced */
        uint64_t r = (uint64_t)rank;
        CUX(fill_device(dx, xb, 1.f, seed + 1000 + r));
        CUX(fill_device(dwr, 2 * E * H, 6.f / sqrtf((float)H), seed));
        CUX(fill_device(s1, 2 * nst * w1e, 3.f / sqrtf((float)H), seed + 2000 + r));
        CUX(fill_device(s2, 2 * nst * w2e, 3.f / sqrtf((float)F), seed + 3000 + r));
        if (dsel)
            CUX(moe_cu.cuMemsetD8(dsel, 0, 4 * E));
        if (dlogit)
            CUX(moe_cu.cuMemsetD8(dlogit, 0, 4 * E));
        if (spec.ffn_bias) {
            CUX(fill_device(sb1, 2 * nst * 2 * F, 0.1f, seed + 4000 + r));
            CUX(fill_device(sb2, 2 * nst * H, 0.1f, seed + 5000 + r));
        }
    }
    moe_gather_args g = {.stored = {DEV(s1), DEV(sb1), DEV(s2), DEV(sb2)},
                         .held_w1p = DEV(h1), .held_b1p = DEV(hb1), .held_w2 = DEV(h2), .held_b2 = DEV(hb2),
                         .held_w1s = (float *)DEV(hs1), .held_w2s = (float *)DEV(hs2)};
    if (fp8) { /* quantize before gather: the bf16 shard (plain layouts) into e4m3 and scales, then the gather */
        moe_pack_args b1, b2;
        if (moe_plan_pack_layout(plan, MOE_LAYOUT_W1_FUSED, DEV(s1), NULL, 0, (int)nst, &b1) ||
            moe_plan_pack_layout(plan, MOE_LAYOUT_W2, DEV(s2), NULL, 0, (int)nst, &b2))
            DIE("moe_plan_pack_layout: %s", moe_last_error());
        g.stored.w1p = g.stored.w2 = NULL;
        if ((st = moe_gather_weights_fp8(plan, &b1, &b2, &g, NULL)))
            DIE("moe_gather_weights_fp8: %s", moe_last_error());
    } else if ((st = moe_gather_weights(plan, &g, NULL))) {
        DIE("moe_gather_weights: %s", moe_last_error());
    }
    moe_forward_args a = {.tokens = T, .x = DEV(dx), .router_w = DEV(dwr), .router_bias = (const float *)DEV(dsel),
                          .router_logit_bias = (const float *)DEV(dlogit), .w1p = DEV(h1), .b1p = DEV(hb1),
                          .w2 = DEV(h2), .b2 = DEV(hb2), .y = DEV(dy), .workspace = DEV(dws),
                          .w1s = (const float *)DEV(hs1), .w2s = (const float *)DEV(hs2)};
    if ((st = moe_forward(plan, &a, NULL)))
        DIE("moe_forward: %s", moe_last_error());
    CUX(moe_cu.cuCtxSynchronize());
    /* an overflow fails the rank, which still takes part in the bench */
    long long lost = 0;
    if ((st = moe_plan_overflow(plan, DEV(dws), NULL, &lost)) && st != MOE_ERR_OVERFLOW)
        DIE("moe_plan_overflow: %s", moe_last_error());
    if (st)
        fprintf(stderr, "rank %d: %s (raise dispatch.capacity)\n", rank, moe_last_error());
    CUX(moe_cu.cuMemcpyDtoH(y, dy, xb));
    int nan = 0, ok;
    if (check) {
        double e = layer_error(&L, &X, &spec, rank, T, y, &nan);
        ok = e >= 0 && e <= 1.5e-2 && nan == 0 && lost == 0;
        printf("  %s rank %d (ep rank %d, fsdp rank %d, %d held experts, %lld bytes gathered): %d tokens, error "
               "%.2e, %d unwritten, %lld overflowed: %s\n",
               m->name, rank, info.ep_rank, info.fsdp_rank, info.held, info.gather_bytes, T, e, nan, lost,
               ok ? "ok" : "FAIL");
    } else {
        for (size_t i = 0; i < (size_t)T * H; i++)
            nan += isnan(moe_half_to_float(y[i], MOE_DTYPE_BF16)); /* the poison, or worse */
        ok = nan == 0 && lost == 0;
        printf("  %s rank %d (ep rank %d, fsdp rank %d, %d held experts): %d tokens, not checked (--no-check), "
               "%d unwritten, %lld overflowed: %s\n",
               m->name, rank, info.ep_rank, info.fsdp_rank, info.held, T, nan, lost, ok ? "ok" : "FAIL");
    }
    fflush(stdout);
    if (check && spec.training) { /* the backward and the gradients' reduce-scatter */
        int tr = train_check(plan, &spec, &mp, rank, T, &L, &X, &a, seed, m->name, comm);
        if (tr == 3)
            return 3;
        ok &= tr == 0;
    }
    int rc = mode != RUN_CHECK ? bench_layer(plan, &a, &info, m->name, rank) : 0;
    moe_plan_destroy(plan);
    moe_nccl.ncclCommDestroy(comm);
    ep_layer_free(&L);
    extras_free(&X);
    free(w1p), free(b1p), free(y);
    moe_mesh_plan_free(&mp);
    return rc ? rc : ok ? 0 : 1;
}

/* Wait for the W children; once one stops early (not a check failure) or
 * dies, the rest get KILL_AFTER_S seconds, then SIGKILL: they would wait
 * in NCCL for it forever. Returns how many failed. */
static int wait_ranks(const pid_t *pids, int W, const char *name) {
    int done[MAX_RANKS] = {0}, left = W, failed = 0, killed = 0;
    time_t stop = 0;
    while (left) {
        for (int r = 0; r < W; r++) {
            int status = 0;
            if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            done[r] = 1, left--;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            failed += code != 0;
            if (code != 0 && code != 1 && !stop)
                stop = time(NULL);
        }
        if (left && stop && !killed && time(NULL) - stop >= KILL_AFTER_S) {
            for (int r = 0; r < W; r++)
                if (!done[r]) {
                    fprintf(stderr, "%s: rank %d killed: another rank stopped %d s ago\n", name, r, KILL_AFTER_S);
                    kill(pids[r], SIGKILL);
                }
            killed = 1;
        }
        if (left)
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    return failed;
}

static int usage_error(const char *what, const char *arg) {
    fprintf(stderr, "test_mgpu: ");
    fprintf(stderr, what, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

int main(int argc, char **argv) {
    int T = 512, bench = 0, check = 1, nsets = 0;
    moe_override_t sets[MAX_SETS];
    const char *only = NULL;
    const char *env = getenv("MOEGEN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    if (argc >= 8 && strcmp(argv[1], "--child") == 0) { /* --child MESH RANK IDFILE TOKENS MODE SEED [KEY=VALUE]... */
        mesh_case_t m;
        if (find_mesh(argv[2], &m) || argc - 8 > MAX_SETS)
            return 3;
        for (int i = 8; i < argc; i++)
            sets[nsets++].text = argv[i];
        return child(&m, atoi(argv[3]), argv[4], atoi(argv[5]), atoi(argv[6]), strtoull(argv[7], NULL, 10), sets,
                     nsets);
    }
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(s, "--bench") == 0) {
            bench = 1;
        } else if (strcmp(s, "--no-check") == 0) {
            check = 0;
        } else if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(s, "--mesh") == 0 || strcmp(s, "--tokens") == 0 || strcmp(s, "--set") == 0) {
            if (!val)
                return usage_error("%s needs a value", s);
            i++;
            if (strcmp(s, "--mesh") == 0) {
                only = val;
            } else if (strcmp(s, "--set") == 0) {
                if (nsets == MAX_SETS)
                    return usage_error("too many --set options (at most 64)%s", "");
                sets[nsets++].text = val;
            } else {
                char *end;
                long v = strtol(val, &end, 10);
                if (!*val || *end || v < 1 || v > (1L << 28))
                    return usage_error("--tokens needs a count of tokens per rank (1 or more), got '%s'", val);
                T = (int)v;
            }
        } else {
            return usage_error("unknown argument '%s'", s);
        }
    }
    if (!check && !bench)
        return usage_error("--no-check only goes with --bench%s", "");

    /* every mesh to run, with the overrides, before looking for GPUs: a bad
     * argument is an error on any machine */
    mesh_case_t given;
    if (only && find_mesh(only, &given))
        return usage_error("--mesh %s: no such mesh or spec file (NAME.moe)", only);
    size_t ncase = only ? 1 : NMESH;
    int world[NMESH];
    for (size_t i = 0; i < ncase; i++) {
        const mesh_case_t *m = only ? &given : &meshes[i];
        moe_spec_t spec;
        moe_diag_t d;
        if (moe_spec_load(&spec, m->name, m->text, sets, nsets, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            return 2;
        }
        if (T > spec.tokens) {
            fprintf(stderr, "test_mgpu: --tokens %d is more than %s's tokens = %d (raise it with --set tokens=%d)\n",
                    T, m->name, spec.tokens, T);
            return 2;
        }
        world[i] = moe_spec_world(&spec);
    }

    char why[512];
    int ngpu = 0;
    CASE("test_mgpu");
    if (moe_cu_load(why, sizeof why) || moe_cu.cuInit(0) || moe_cu.cuDeviceGetCount(&ngpu) || ngpu == 0) {
        SKIP("no CUDA driver or GPU");
        return check_report("test_mgpu");
    }
    if (moe_nccl_load(why, sizeof why)) {
        SKIP("no NCCL: %s", why);
        return check_report("test_mgpu");
    }
    printf("test_mgpu: %d GPUs, seed %llu (MOEGEN_TEST_SEED), %d tokens per rank%s", ngpu, (unsigned long long)seed,
           T, !bench ? "" : check ? ", bench" : ", bench without the check");
    for (int i = 0; i < nsets; i++)
        printf(", --set %s", sets[i].text);
    printf("\n");
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    for (size_t i = 0; i < ncase; i++) {
        const mesh_case_t *m = only ? &given : &meshes[i];
        CASE(m->name);
        int W = world[i];
        if (W > ngpu || W > MAX_RANKS) {
            SKIP("needs %d GPUs, this machine has %d", W, ngpu);
            continue;
        }
        ncclUniqueId id;
        ncclResult_t nr = moe_nccl.ncclGetUniqueId(&id);
        if (nr != ncclSuccess) {
            CHECKF(0, "ncclGetUniqueId: %s", moe_nccl_error_string(nr));
            continue;
        }
        char idfile[64], sr[16], st[16], sm[4], ss[32];
        snprintf(idfile, sizeof idfile, "/tmp/moegen_mgpu_id_%d", (int)getpid());
        FILE *f = fopen(idfile, "wb");
        if (!f || fwrite(&id, sizeof id, 1, f) != 1) {
            CHECKF(0, "cannot write %s", idfile);
            if (f)
                fclose(f);
            continue;
        }
        fclose(f);
        snprintf(st, sizeof st, "%d", T);
        snprintf(sm, sizeof sm, "%d", !bench ? RUN_CHECK : check ? RUN_CHECK_BENCH : RUN_BENCH);
        snprintf(ss, sizeof ss, "%llu", (unsigned long long)seed);
        char *cargv[8 + MAX_SETS + 1] = {argv[0], "--child", (char *)m->name, sr, idfile, st, sm, ss};
        for (int k = 0; k < nsets; k++)
            cargv[8 + k] = (char *)sets[k].text;
        cargv[8 + nsets] = NULL;
        pid_t pids[MAX_RANKS];
        for (int r = 0; r < W; r++) {
            snprintf(sr, sizeof sr, "%d", r);
            fflush(stdout);
            pids[r] = fork();
            if (pids[r] == 0) {
                execv("/proc/self/exe", cargv);
                _exit(127);
            }
            if (pids[r] < 0) { /* the ranks started would wait for this one */
                perror("test_mgpu: fork");
                for (int k = 0; k < r; k++)
                    kill(pids[k], SIGKILL);
                W = r;
                break;
            }
        }
        int failed = wait_ranks(pids, W, m->name);
        failed += W < world[i];
        W = world[i];
        CHECKF(failed == 0, "%s: %d of %d ranks failed", m->name, failed, W);
        unlink(idfile);
    }
    return check_report("test_mgpu");
}
