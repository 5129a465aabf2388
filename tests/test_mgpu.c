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
 *
 * Meshes: world1 (one GPU: the plan takes a communicator of one rank), EP2,
 * EP4, EP8, DP2/FSDP2/EP2 under both expert shardings, and EP4 in capacity
 * mode; a mesh needing more GPUs than the machine has is reported skipped.
 * --bench adds, per rank, the time of the dispatch and combine transfers and
 * their GB/s (bytes this GPU sent + received), and the layer time.
 * --mesh also takes a spec file (e.g. examples/specs/deepseek-v3-ep8-mesh.moe).
 * usage: test_mgpu [--mesh NAME|SPEC.moe] [--tokens T] [--bench] */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "driver.h"
#include "ep.h"
#include "ep_data.h"
#include "mesh.h"
#include "moe.h"
#include "moe_internal.h"
#include "nccl_dl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *text;
} mesh_case_t;

#define LAYER "experts = 32 top_k = 4 hidden = 1024 ffn = 512 tokens = 4096 arch = { 'sm_90a', 'sm_80' }\n"
static const mesh_case_t meshes[] = {
    {"world1", "name = 'w1' " LAYER},
    {"ep2", "name = 'ep2' " LAYER "mesh = { ep = 2 }\n"},
    {"ep4", "name = 'ep4' " LAYER "mesh = { ep = 4 }\n"},
    {"ep8", "name = 'ep8' " LAYER "mesh = { ep = 8 }\n"},
    {"dp2_fsdp2_ep2", "name = 'dfe' " LAYER "mesh = { dp = 2, fsdp = 2, ep = 2 }\n"},
    {"dp2_fsdp2_ep2_fsdp_major",
     "name = 'dfe2' " LAYER "mesh = { dp = 2, fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }\n"},
    {"ep4_capacity", "name = 'ep4c' " LAYER "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 8192 }\n"},
};

#define DIE(...)                                                                                     \
    do {                                                                                             \
        fprintf(stderr, "rank %d: ", rank);                                                          \
        fprintf(stderr, __VA_ARGS__);                                                                \
        fprintf(stderr, "\n");                                                                       \
        return 1;                                                                                    \
    } while (0)
#define CUX(call)                                                                                    \
    do {                                                                                             \
        CUresult r_ = (call);                                                                        \
        if (r_ != CUDA_SUCCESS)                                                                      \
            DIE("%s: %s", #call, moe_cu_error_string(r_));                                           \
    } while (0)

/* A built-in mesh by name, or a spec file (NAME.moe) read whole. */
static int find_mesh(const char *name, mesh_case_t *out) {
    for (size_t i = 0; i < sizeof meshes / sizeof *meshes; i++)
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

static int child(const mesh_case_t *m, int rank, const char *idfile, int T, int bench, uint64_t seed) {
    char why[512];
    if (moe_cu_load(why, sizeof why) || moe_cu.cuInit(0))
        DIE("no driver: %s", why);
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, m->name, m->text, NULL, 0, &d))
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
    char path[128];
    snprintf(path, sizeof path, "/tmp/moegen_mgpu_%d_%d.moe", (int)getppid(), rank);
    f = fopen(path, "w");
    fputs(m->text, f);
    fclose(f);
    moe_options o = {.device = rank, .rank = rank, .nccl_comm = comm};
    moe_plan *plan;
    moe_status st = moe_plan_create(&plan, path, &o);
    unlink(path);
    if (st)
        DIE("moe_plan_create: %s: %s", moe_status_string(st), moe_last_error());
    moe_plan_info info;
    moe_plan_get_info(plan, &info);
    ep_layer_t L;
    if (ep_layer_make(&L, &spec, W, T, seed))
        DIE("out of memory");
    size_t E = (size_t)spec.experts, H = (size_t)spec.hidden, F = (size_t)spec.ffn;
    size_t w1e = 2 * F * H, w2e = H * F;
    uint16_t *w1p = malloc(2 * E * w1e), *y = malloc(2 * (size_t)T * H);
    moe_plan_pack_w1(plan, L.w1, w1p);
    const moe_mesh_rank_t *me = &mp.ranks[rank];
    CUdeviceptr dx, dy, dwr, dws, s1, s2, h1, h2;
    size_t wsb = moe_plan_workspace_size(plan, T);
    CUX(moe_cu.cuMemAlloc(&dx, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemcpyHtoD(dx, L.x + (size_t)rank * T * H, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemAlloc(&dy, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemsetD8(dy, 0xff, 2 * (size_t)T * H));
    CUX(moe_cu.cuMemAlloc(&dwr, 2 * E * H));
    CUX(moe_cu.cuMemcpyHtoD(dwr, L.wr, 2 * E * H));
    CUX(moe_cu.cuMemAlloc(&dws, wsb));
    CUX(moe_cu.cuMemsetD8(dws, 0xff, wsb));
    CUX(moe_cu.cuMemAlloc(&s1, 2 * mp.nstored * w1e));
    CUX(moe_cu.cuMemAlloc(&s2, 2 * mp.nstored * w2e));
    CUX(moe_cu.cuMemAlloc(&h1, 2 * mp.nheld * w1e));
    CUX(moe_cu.cuMemAlloc(&h2, 2 * mp.nheld * w2e));
    CUX(moe_cu.cuMemcpyHtoD(s1, w1p + me->stored[0] * w1e, 2 * mp.nstored * w1e));
    CUX(moe_cu.cuMemcpyHtoD(s2, L.w2 + me->stored[0] * w2e, 2 * mp.nstored * w2e));
    moe_gather_args g = {.stored = {(void *)(uintptr_t)s1, NULL, (void *)(uintptr_t)s2, NULL},
                         .held_w1p = (void *)(uintptr_t)h1, .held_w2 = (void *)(uintptr_t)h2};
    if ((st = moe_gather_weights(plan, &g, NULL)))
        DIE("moe_gather_weights: %s", moe_last_error());
    moe_forward_args a = {.tokens = T, .x = (void *)(uintptr_t)dx, .router_w = (void *)(uintptr_t)dwr,
                          .w1p = (void *)(uintptr_t)h1, .w2 = (void *)(uintptr_t)h2, .y = (void *)(uintptr_t)dy,
                          .workspace = (void *)(uintptr_t)dws};
    if ((st = moe_forward(plan, &a, NULL)))
        DIE("moe_forward: %s", moe_last_error());
    CUX(moe_cu.cuCtxSynchronize());
    long long lost = 0;
    if ((st = moe_plan_overflow(plan, (void *)(uintptr_t)dws, NULL, &lost)))
        DIE("%s", moe_last_error());
    CUX(moe_cu.cuMemcpyDtoH(y, dy, 2 * (size_t)T * H));
    int nan = 0;
    double e = ep_layer_error(&L, &spec, rank, T, y, &nan);
    int ok = e >= 0 && e <= 1.5e-2 && nan == 0;
    printf("  %s rank %d (ep rank %d, fsdp rank %d, %d held experts): %d tokens, error %.2e, %d unwritten: %s\n",
           m->name, rank, info.ep_rank, info.fsdp_rank, info.held, T, e, nan, ok ? "ok" : "FAIL");
    if (bench && ok) {
        CUevent ev[2];
        moe_cu.cuEventCreate(&ev[0], 0), moe_cu.cuEventCreate(&ev[1], 0);
        int iters = 20;
        moe_cu.cuEventRecord(ev[0], NULL);
        for (int i = 0; i < iters; i++)
            moe_forward(plan, &a, NULL);
        moe_cu.cuEventRecord(ev[1], NULL);
        moe_cu.cuEventSynchronize(ev[1]);
        float ms = 0;
        moe_cu.cuEventElapsedTime(&ms, ev[0], ev[1]);
        printf("  bench %s rank %d: layer %.3f ms", m->name, rank, ms / iters);
        if (info.ep > 1) { /* the dispatch and combine transfers alone */
            moe_ep_call_t *c = malloc(sizeof *c);
            float t[2] = {0, 0};
            double bytes[2] = {0, 0};
            for (int i = 0; i < iters; i++)
                for (int step = 0; step < MOE_EP_STEPS; step++) {
                    moe_ep_step(plan, &a, NULL, step, c);
                    if (!c->nx)
                        continue;
                    int timed = step == 1 || step == 2;
                    if (timed)
                        moe_cu.cuEventRecord(ev[0], NULL);
                    moe_ep_run_xfers(plan, c, NULL);
                    if (timed) {
                        moe_cu.cuEventRecord(ev[1], NULL);
                        moe_cu.cuEventSynchronize(ev[1]);
                        moe_cu.cuEventElapsedTime(&ms, ev[0], ev[1]);
                        t[step - 1] += ms;
                        for (int x = 0; x < c->nx; x++)
                            bytes[step - 1] += (double)c->x[x].bytes;
                    }
                }
            for (int k = 0; k < 2; k++)
                printf(", %s %.3f ms %.1f GB/s", k ? "combine" : "dispatch", t[k] / iters,
                       bytes[k] / (t[k] * 1e-3) / 1e9);
            free(c);
        }
        printf("\n");
    }
    moe_plan_destroy(plan);
    moe_nccl.ncclCommDestroy(comm);
    ep_layer_free(&L);
    moe_mesh_plan_free(&mp);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int T = 512, bench = 0;
    const char *only = NULL;
    const char *env = getenv("MOEGEN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    if (argc >= 8 && strcmp(argv[1], "--child") == 0) { /* --child MESH RANK IDFILE TOKENS BENCH SEED */
        mesh_case_t m;
        if (find_mesh(argv[2], &m))
            return 2;
        return child(&m, atoi(argv[3]), argv[4], atoi(argv[5]), atoi(argv[6]), strtoull(argv[7], NULL, 10));
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0)
            bench = 1;
        else if (strcmp(argv[i], "--mesh") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            T = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: test_mgpu [--mesh NAME] [--tokens T] [--bench]\n");
            return 2;
        }
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
    printf("test_mgpu: %d GPUs, seed %llu (MOEGEN_TEST_SEED), %d tokens per rank\n", ngpu, (unsigned long long)seed, T);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    mesh_case_t given;
    if (only && find_mesh(only, &given)) {
        fprintf(stderr, "test_mgpu: --mesh %s: no such mesh or spec file\n", only);
        return 2;
    }
    size_t ncase = only ? 1 : sizeof meshes / sizeof *meshes;
    for (size_t i = 0; i < ncase; i++) {
        const mesh_case_t *m = only ? &given : &meshes[i];
        CASE(m->name);
        moe_spec_t spec;
        moe_diag_t d;
        if (moe_spec_load(&spec, m->name, m->text, NULL, 0, &d)) {
            CHECKF(0, "%s", d.msg);
            continue;
        }
        int W = moe_spec_world(&spec);
        if (W > ngpu) {
            SKIP("needs %d GPUs, this machine has %d", W, ngpu);
            continue;
        }
        ncclUniqueId id;
        ncclResult_t nr = moe_nccl.ncclGetUniqueId(&id);
        CHECKF(nr == ncclSuccess, "ncclGetUniqueId: %s", moe_nccl_error_string(nr));
        char idfile[64], sr[16], st[16], sb[4], ss[32];
        snprintf(idfile, sizeof idfile, "/tmp/moegen_mgpu_id_%d", (int)getpid());
        FILE *f = fopen(idfile, "wb");
        fwrite(&id, sizeof id, 1, f);
        fclose(f);
        pid_t pids[64];
        for (int r = 0; r < W; r++) {
            snprintf(sr, sizeof sr, "%d", r);
            snprintf(st, sizeof st, "%d", T);
            snprintf(sb, sizeof sb, "%d", bench);
            snprintf(ss, sizeof ss, "%llu", (unsigned long long)seed);
            fflush(stdout);
            pids[r] = fork();
            if (pids[r] == 0) {
                execl("/proc/self/exe", argv[0], "--child", m->name, sr, idfile, st, sb, ss, (char *)NULL);
                _exit(127);
            }
        }
        int failed = 0;
        for (int r = 0; r < W; r++) {
            int status = 0;
            waitpid(pids[r], &status, 0);
            failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        CHECKF(failed == 0, "%s: %d of %d ranks failed", m->name, failed, W);
        unlink(idfile);
    }
    return check_report("test_mgpu");
}
