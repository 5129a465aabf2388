/* test_ep_gpu.c — the expert-parallel forward of every rank of a mesh, on
 * one GPU: each rank is its own plan (moe_plan_create_unconnected) with its
 * own tokens, workspace and held weights, and this harness moves the data
 * between the ranks exactly as each step's transfer list says (the lists
 * NCCL executes on a real mesh). Each rank's output is checked against the
 * CPU reference of the whole, unsharded layer on that rank's tokens.
 *
 * Meshes: EP2, EP4, EP8, DP2/FSDP2/EP2 under both expert shardings, EP4 in
 * capacity mode with room to spare, and EP4 in capacity mode too small (the
 * overflow must be reported by every rank that lost rows); router.apply =
 * "input" (the EP scatter scales the rows it sends) on EP4 and on EP2 in
 * capacity mode. The FSDP gather
 * runs through the same harness (and its pack hook once), and the gathered
 * weights are compared with the experts the mesh plan says the rank holds.
 * Fresh random inputs (MOEGEN_TEST_SEED repeats), outputs poisoned.
 * Tolerance: normalized L2 error <= 1.5e-2 (bf16). Skips without a GPU.
 *
 * Each case's checks fall in two families, each a case of its own
 * ("gather: ep4", "ep: ep4"):
 *   gather  the FSDP gather (pack hook, then plain): every rank's held
 *           weights are the experts the mesh plan says it holds
 *   ep      the EP dispatch kernels (send plan, scatter, receive plan,
 *           rows), the FFN on received rows, the return and combine: every
 *           rank's output against the unsharded reference; overflow
 *           reported exactly when the capacity is too small
 * Usage: test_ep_gpu [--family gather|ep] [CASE-FILTER...]: only the named
 * family's checks (the gather always runs: the forward reads its output),
 * only the cases whose name contains a filter (e.g. "ep4", "fsdp").
 *
 * fp8 weights (cases "fp8_...", `test_ep_gpu fp8`; sm_90a only, skipped
 * elsewhere): fp8 specs on FSDP meshes without EP (fsdp2, dp2 x fsdp2 with
 * per-channel scales, fsdp4 sharded over fsdp alone) and on EP meshes (EP2,
 * EP4 with per-channel scales, EP8, DP2/FSDP2/EP2 under both shardings, EP4
 * in capacity mode with room and too small, router.apply = "input" in both
 * modes, a rank with an empty batch in both modes, experts no token picks).
 * Each rank
 * holds its stored experts in bf16; moe_gather_weights_fp8's local part
 * (moe_gather_prepare_fp8: the device quantizer writes the rank's shard
 * into its place) and the harness's transfers must leave every rank's
 * held e4m3 weights and scales equal, byte for byte, to the host's
 * moe_plan_pack_quantize of the whole checkpoint; then the same through
 * moe_gather_weights' fp8 parts from stored e4m3 shards and scales. Every
 * rank's forward on its gathered weights (with EP: the four steps, the rows
 * moved as e4m3 and scales by the transfer lists, the results home in
 * bf16; workspace poisoned, a guard after it) is checked against the CPU's
 * quantized recipe on the rank's tokens (moe_ref_ffn with the fp8 weights:
 * the sender's quantization is the single-device one, bit for bit),
 * normalized L2 error <= 1.5e-2 (test_quant_gpu's layer tolerance). */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "ep_data.h"
#include "ep_play.h"
#include "driver.h"
#include "ep.h"
#include "mesh.h"
#include "moe.h"
#include "moe_internal.h"
#include "ref.h"
#include "spec.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *text;
    int tokens;           /* per rank */
    int want_overflow;
    int empty;            /* 1 + the rank whose batch is empty (tokens = 0); 0: none */
} ep_case_t;

#define BASE "experts = 16 top_k = 4 hidden = 256 ffn = 136 tokens = 300 arch = { 'sm_90a', 'sm_80' }\n"
static const ep_case_t cases[] = {
    {"ep2", "name = 'ep2' " BASE "mesh = { ep = 2 }\n", 300, 0, 0},
    {"ep4", "name = 'ep4' " BASE "mesh = { ep = 4 }\n", 257, 0, 0},
    {"ep8", "name = 'ep8' " BASE "mesh = { ep = 8 }\n", 100, 0, 0},
    {"dp2_fsdp2_ep2", "name = 'dfe' " BASE "mesh = { dp = 2, fsdp = 2, ep = 2 }\n", 129, 0, 0},
    {"dp2_fsdp2_ep2_fsdp_major",
     "name = 'dfe2' " BASE "mesh = { dp = 2, fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }\n", 129, 0, 0},
    {"ep4_capacity", "name = 'ep4c' " BASE "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 600 }\n",
     300, 0, 0},
    {"ep4_capacity_overflow",
     "name = 'ep4o' " BASE "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 40 }\n", 300, 1, 0},
    {"ep4_apply_input", "name = 'ep4i' " BASE "mesh = { ep = 4 }\nrouter = { score = 'sigmoid', apply = 'input' }\n",
     257, 0, 0},
    {"ep2_apply_input_capacity",
     "name = 'ep2ic' " BASE "mesh = { ep = 2 }\nrouter = { apply = 'input' }\n"
     "dispatch = { mode = 'capacity', capacity = 900 }\n", 300, 0, 0},
    /* a rank with an empty batch still joins the exchange and runs its
     * peers' rows; its y stays untouched */
    {"ep4_rank_empty", "name = 'ep4z' " BASE "mesh = { ep = 4 }\n", 257, 0, 1 + 2},
    {"ep4_capacity_rank_empty",
     "name = 'ep4cz' " BASE "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 600 }\n", 300, 0, 1 + 0},
    {"dp2_fsdp2_ep2_rank_empty", "name = 'dfez' " BASE "mesh = { dp = 2, fsdp = 2, ep = 2 }\n", 129, 0, 1 + 3},
    /* given routing: each rank's own tokens' ids (some dropped, counted per rank), weighted by the scores or
     * given with them */
    {"ep4_given_ids", "name = 'ep4g' " BASE "mesh = { ep = 4 }\nrouter = { select = 'given', score = 'sigmoid' }\n",
     257, 0, 0},
    {"ep2_given_weights_capacity",
     "name = 'ep2gw' " BASE "mesh = { ep = 2 }\nrouter = { select = 'given', score = 'given', renormalize = false }\n"
     "dispatch = { mode = 'capacity', capacity = 900 }\n", 300, 0, 1 + 1},
};

enum { FAM_GATHER, FAM_EP, FAM_COUNT };
static const char *const family_names[FAM_COUNT] = {"gather", "ep"};
static unsigned families_on = (1u << FAM_COUNT) - 1;

/* CASE("family: name"), in a buffer that outlives the call. */
static void family_case(int f, const char *name) {
    static char buf[FAM_COUNT][160];
    snprintf(buf[f], sizeof buf[f], "%s: %s", family_names[f], name);
    CASE(buf[f]);
}

#define CU(call)                                                                                     \
    do {                                                                                             \
        CUresult r_ = (call);                                                                        \
        CHECKF(r_ == CUDA_SUCCESS, "%s: %s", #call, moe_cu_error_string(r_));                        \
        if (r_ != CUDA_SUCCESS)                                                                      \
            goto done;                                                                               \
    } while (0)

/* Guard bytes after each rank's workspace. */
#define EP_WS_GUARD 4096

/* After a forward of every rank: no rank wrote the guard after its workspace,
 * and each reports no overflow, or (want_overflow) each reports the
 * capacity's. Returns 1 when the case goes on to check the outputs, 0 when
 * it ends here (a CUDA error, or the overflow it wanted). */
static int ranks_after(moe_plan *const *plan, const CUdeviceptr *ws_at, const CUdeviceptr *dws, size_t wsb,
                       const moe_forward_args *a, int W, int want_overflow) {
    int lost = 0;
    for (int r = 0; r < W; r++) {
        long long rows = -1;
        moe_status st = moe_plan_overflow(plan[r], (void *)(uintptr_t)ws_at[r], NULL, &rows);
        uint8_t guard[EP_WS_GUARD];
        size_t outside = 0;
        CUresult cr = moe_cu.cuMemcpyDtoH(guard, dws[r] + wsb, EP_WS_GUARD);
        CHECKF(cr == CUDA_SUCCESS, "reading rank %d's guard: %s", r, moe_cu_error_string(cr));
        if (cr != CUDA_SUCCESS)
            return 0;
        for (int i = 0; i < EP_WS_GUARD; i++)
            outside += guard[i] != 0xa5;
        CHECKF(outside == 0, "rank %d (%d tokens) wrote %zu bytes of the guard after its workspace", r, a[r].tokens,
               outside);
        if (!want_overflow)
            CHECKF(st == MOE_OK && rows == 0, "rank %d: overflow %lld: %s", r, rows, moe_last_error());
        else
            lost += st == MOE_ERR_OVERFLOW && rows > 0 && strstr(moe_last_error(), "capacity");
    }
    if (want_overflow)
        CHECKF(lost == W, "%d of %d ranks reported the overflow", lost, W);
    return !want_overflow;
}

static moe_status negate_pack(void *user, int tensor, const void *src, void *dst, size_t bytes, void *stream) {
    (void)tensor;
    (void)stream;
    uint16_t *h = user;
    if (moe_cu.cuCtxSynchronize() || moe_cu.cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)src, bytes))
        return MOE_ERR_CUDA;
    for (size_t i = 0; i < bytes / 2; i++)
        h[i] ^= 0x8000u;
    return moe_cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, h, bytes) ? MOE_ERR_CUDA : MOE_OK;
}

static void run_case(const ep_case_t *c, uint64_t seed) {
    CASE(c->name);
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, c->name, c->text, NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return;
    }
    moe_mesh_plan_t mp;
    char err[512];
    if (moe_mesh_plan_build(&mp, &spec, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/moegen_test_ep_%d.moe", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(c->text, f);
    fclose(f);
    const int W = mp.world, E = spec.experts, H = spec.hidden, F = spec.ffn, T = c->tokens;
    const int NS = mp.nstored, NH = mp.nheld;
    size_t w1e = 2 * (size_t)F * H, w2e = (size_t)H * F;
    moe_plan *plan[16] = {0};
    moe_ep_call_t *call[16] = {0};
    CUdeviceptr dx[16] = {0}, dy[16] = {0}, dws[16] = {0}, dst1[16] = {0}, dst2[16] = {0}, dh1[16] = {0},
                dh2[16] = {0}, dwr = 0, dids[16] = {0}, dgw[16] = {0};
    ep_layer_t L;
    if (ep_layer_make(&L, &spec, W, T, seed)) {
        CHECKF(0, "out of memory");
        return;
    }
    uint16_t *x = L.x, *wr = L.wr, *w1 = L.w1, *w2 = L.w2;
    uint16_t *w1p = malloc(2 * E * w1e), *y = malloc(2 * (size_t)T * H), *back = malloc(2 * NH * w1e);
    for (int r = 0; r < W; r++) {
        moe_options o = {.rank = r};
        moe_status st = moe_plan_create_unconnected(&plan[r], path, &o);
        CHECKF(st == MOE_OK, "rank %d: %s: %s", r, moe_status_string(st), moe_last_error());
        if (st)
            goto done;
        call[r] = malloc(sizeof *call[r]);
    }
    CHECK(moe_plan_pack_w1(plan[0], w1, w1p) == MOE_OK);
    CU(moe_cu.cuMemAlloc(&dwr, 2 * (size_t)E * H));
    CU(moe_cu.cuMemcpyHtoD(dwr, wr, 2 * (size_t)E * H));
    size_t wsb = moe_plan_workspace_size(plan[0], T);
    CHECK(wsb > 0);
    for (int r = 0; r < W; r++) {
        const moe_mesh_rank_t *rk = &mp.ranks[r];
        CU(moe_cu.cuMemAlloc(&dx[r], 2 * (size_t)T * H));
        CU(moe_cu.cuMemcpyHtoD(dx[r], x + (size_t)r * T * H, 2 * (size_t)T * H));
        CU(moe_cu.cuMemAlloc(&dy[r], 2 * (size_t)T * H));
        CU(moe_cu.cuMemsetD8(dy[r], 0xff, 2 * (size_t)T * H)); /* poison: NaN in bf16 */
        CU(moe_cu.cuMemAlloc(&dws[r], wsb + EP_WS_GUARD));
        CU(moe_cu.cuMemsetD8(dws[r], 0xff, wsb));
        CU(moe_cu.cuMemsetD8(dws[r] + wsb, 0xa5, EP_WS_GUARD)); /* the guard after the workspace */
        CU(moe_cu.cuMemAlloc(&dst1[r], 2 * NS * w1e));
        CU(moe_cu.cuMemAlloc(&dst2[r], 2 * NS * w2e));
        CU(moe_cu.cuMemAlloc(&dh1[r], 2 * NH * w1e));
        CU(moe_cu.cuMemAlloc(&dh2[r], 2 * NH * w2e));
        CU(moe_cu.cuMemsetD8(dh1[r], 0xff, 2 * NH * w1e));
        CU(moe_cu.cuMemsetD8(dh2[r], 0xff, 2 * NH * w2e));
        CHECK(rk->stored[NS - 1] == rk->stored[0] + NS - 1); /* a rank stores consecutive experts */
        CU(moe_cu.cuMemcpyHtoD(dst1[r], w1p + (size_t)rk->stored[0] * w1e, 2 * NS * w1e));
        CU(moe_cu.cuMemcpyHtoD(dst2[r], w2 + (size_t)rk->stored[0] * w2e, 2 * NS * w2e));
        if (L.ids) { /* given routing: rank r's tokens' ids and weights */
            const size_t nk = (size_t)T * spec.top_k;
            CU(moe_cu.cuMemAlloc(&dids[r], sizeof(int) * nk));
            CU(moe_cu.cuMemcpyHtoD(dids[r], L.ids + (size_t)r * nk, sizeof(int) * nk));
            CU(moe_cu.cuMemAlloc(&dgw[r], sizeof(float) * nk));
            CU(moe_cu.cuMemcpyHtoD(dgw[r], L.gw + (size_t)r * nk, sizeof(float) * nk));
        }
    }
    /* the gather: w2 through the pack hook (negated), then again plainly */
    family_case(FAM_GATHER, c->name);
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < W; r++) {
            moe_gather_args g = {.stored = {(void *)(uintptr_t)dst1[r], NULL, (void *)(uintptr_t)dst2[r], NULL},
                                 .held_w1p = (void *)(uintptr_t)dh1[r], .held_w2 = (void *)(uintptr_t)dh2[r],
                                 .pack = pass == 0 ? negate_pack : NULL, .user = back};
            moe_status st = moe_gather_prepare(plan[r], &g, NULL, call[r]);
            CHECKF(st == MOE_OK, "gather, rank %d: %s", r, moe_last_error());
        }
        CHECK(ep_play_xfers(&mp, call, 1) == 0);
        for (int r = 0; r < W; r++) {
            CU(moe_cu.cuMemcpyDtoH(back, dh1[r], 2 * NH * w1e));
            int ok = 1;
            for (int j = 0; j < NH && ok; j++)
                for (size_t i = 0; i < w1e && ok; i++)
                    ok = back[j * w1e + i] == (uint16_t)(w1p[(size_t)mp.ranks[r].held[j] * w1e + i] ^
                                                         (pass == 0 ? 0x8000u : 0));
            if (families_on >> FAM_GATHER & 1u)
                CHECKF(ok, "pass %d: rank %d's gathered w1p is not the packed weights of the experts it holds", pass,
                       r);
        }
    }
    /* the forward, step by step, every rank */
    family_case(FAM_EP, c->name);
    if (!(families_on >> FAM_EP & 1u))
        goto done;
    moe_forward_args a[16];
    CUdeviceptr ws_at[16] = {0}; /* each rank's workspace: exactly moe_plan_workspace_size at its tokens, at the
                                    end of the capacity's (a write past it lands in the guard) */
    for (int r = 0; r < W; r++) {
        const int Tr = r == c->empty - 1 ? 0 : T;
        const size_t n = moe_plan_workspace_size(plan[r], Tr);
        CHECKF(n > 0 && n <= wsb && n % 256 == 0, "rank %d: moe_plan_workspace_size(%d) = %zu of %zu", r, Tr, n,
               wsb);
        ws_at[r] = dws[r] + (n <= wsb ? wsb - n : 0);
        a[r] = (moe_forward_args){.tokens = Tr, .x = (void *)(uintptr_t)dx[r],
                                  .router_w = (void *)(uintptr_t)dwr,
                                  .w1p = (void *)(uintptr_t)dh1[r], .w2 = (void *)(uintptr_t)dh2[r],
                                  .y = (void *)(uintptr_t)dy[r], .workspace = (void *)(uintptr_t)ws_at[r],
                                  .topk_ids = (const int *)(uintptr_t)dids[r],
                                  .topk_weights = (const float *)(uintptr_t)dgw[r]};
    }
    for (int step = 0; step < MOE_EP_STEPS; step++) {
        for (int r = 0; r < W; r++) {
            moe_status st = moe_ep_step(plan[r], &a[r], NULL, step, call[r]);
            CHECKF(st == MOE_OK, "step %d, rank %d: %s", step, r, moe_last_error());
            if (st)
                goto done;
        }
        CU(moe_cu.cuCtxSynchronize());
        CHECK(ep_play_xfers(&mp, call, 0) == 0);
    }
    CU(moe_cu.cuCtxSynchronize());
    if (!ranks_after(plan, ws_at, dws, wsb, a, W, c->want_overflow))
        goto done;
    for (int r = 0; L.ids && r < W; r++) { /* given routing: each rank counts its own dropped ids */
        long long got = -1;
        const long long want = r == c->empty - 1 ? 0 : ep_layer_dropped(&L, &spec, r, T);
        const moe_status st = moe_plan_routing_errors(plan[r], (void *)(uintptr_t)ws_at[r], NULL, &got);
        CHECKF(got == want && (st == MOE_OK) == (want == 0), "rank %d: moe_plan_routing_errors %lld, %lld dropped",
               r, got, want);
    }
    /* each rank's tokens against the unsharded layer */
    for (int r = 0; r < W; r++) {
        CU(moe_cu.cuMemcpyDtoH(y, dy[r], 2 * (size_t)T * H));
        if (r == c->empty - 1) { /* no tokens: y keeps its poison */
            size_t changed = 0;
            for (size_t i = 0; i < (size_t)T * H; i++)
                changed += y[i] != 0xffff;
            CHECKF(changed == 0, "rank %d had no tokens but %zu of its outputs were written", r, changed);
            continue;
        }
        int nan = 0;
        double e = ep_layer_error(&L, &spec, r, T, y, &nan, NULL);
        CHECKF(nan == 0 && e <= 1.5e-2, "rank %d: error %.3g, %d outputs unwritten", r, e, nan);
        if (r == 0)
            printf("  %s: %d ranks x %d tokens, rank 0 error %.2e\n", c->name, W, T, e);
    }
done:
    for (int r = 0; r < W; r++) {
        CUdeviceptr all[] = {dx[r], dy[r], dws[r], dst1[r], dst2[r], dh1[r], dh2[r], dids[r], dgw[r]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i])
                moe_cu.cuMemFree(all[i]);
        free(call[r]);
    }
    for (int r = 0; r < W; r++)
        moe_plan_destroy(plan[r]);
    if (dwr)
        moe_cu.cuMemFree(dwr);
    ep_layer_free(&L);
    free(w1p), free(y), free(back);
    moe_mesh_plan_free(&mp);
    unlink(path);
}

/* ---- the quantized gather (fp8 specs, FSDP without EP) ------------------ */

typedef struct {
    const char *name, *text;
    int tokens;        /* per rank */
    int want_overflow; /* EP in capacity mode, too small: every rank reports it */
    int empty;         /* 1 + the rank whose batch is empty (tokens = 0); 0: none */
    int dead;          /* router.bias: every fifth expert's selection bias -100 (never routed: empty experts) */
} fp8_case_t;

#define FP8_BASE "experts = 8 top_k = 2 hidden = 256 ffn = 384 tokens = 200 arch = { 'sm_90a' }\n"
#define FP8_EP "experts = 16 top_k = 4 hidden = 256 ffn = 384 tokens = 300 arch = { 'sm_90a' }\n"
#define FP8_Q "quant = { weights = 'fp8_e4m3' }\n"
static const fp8_case_t fp8_cases[] = {
    {"fp8_fsdp2", "name = 'f8f2' " FP8_BASE FP8_Q "mesh = { fsdp = 2 }\n", 200, 0, 0, 0},
    {"fp8_dp2_fsdp2_channel",
     "name = 'f8df' " FP8_BASE "quant = { weights = 'fp8_e4m3', scaling = 'channel' }\nmesh = { dp = 2, fsdp = 2 }\n",
     129, 0, 0, 0},
    {"fp8_fsdp4_fsdp_sharding",
     "name = 'f8f4' " FP8_BASE FP8_Q "mesh = { fsdp = 4, expert_sharding = { 'fsdp' } }\n", 77, 0, 0, 0},
    /* the EP dispatch with fp8 weights: the rows travel quantized (e4m3 and
     * a scale per 128 columns), the fp8 GEMMs run on the received rows */
    {"fp8_ep2", "name = 'f8e2' " FP8_EP FP8_Q "mesh = { ep = 2 }\n", 300, 0, 0, 0},
    {"fp8_ep4_channel",
     "name = 'f8e4c' " FP8_EP "quant = { weights = 'fp8_e4m3', scaling = 'channel' }\nmesh = { ep = 4 }\n", 257, 0, 0,
     0},
    {"fp8_ep8", "name = 'f8e8' " FP8_EP FP8_Q "mesh = { ep = 8 }\n", 100, 0, 0, 0},
    {"fp8_dp2_fsdp2_ep2", "name = 'f8dfe' " FP8_EP FP8_Q "mesh = { dp = 2, fsdp = 2, ep = 2 }\n", 129, 0, 0, 0},
    {"fp8_dp2_fsdp2_ep2_fsdp_major",
     "name = 'f8dfe2' " FP8_EP FP8_Q "mesh = { dp = 2, fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }\n", 129,
     0, 0, 0},
    {"fp8_ep4_capacity",
     "name = 'f8e4k' " FP8_EP FP8_Q "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 1200 }\n", 300, 0,
     0, 0},
    {"fp8_ep4_capacity_overflow",
     "name = 'f8e4o' " FP8_EP FP8_Q "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 40 }\n", 300, 1, 0,
     0},
    {"fp8_ep4_apply_input",
     "name = 'f8e4i' " FP8_EP FP8_Q "mesh = { ep = 4 }\nrouter = { score = 'sigmoid', apply = 'input' }\n", 257, 0, 0,
     0},
    {"fp8_ep2_apply_input_capacity",
     "name = 'f8e2ik' " FP8_EP FP8_Q "mesh = { ep = 2 }\nrouter = { apply = 'input' }\n"
     "dispatch = { mode = 'capacity', capacity = 1200 }\n", 300, 0, 0, 0},
    /* a rank with an empty batch still joins the exchange and runs its
     * peers' rows; its y stays untouched */
    {"fp8_ep4_rank_empty", "name = 'f8e4z' " FP8_EP FP8_Q "mesh = { ep = 4 }\n", 257, 0, 1 + 2, 0},
    {"fp8_ep4_capacity_rank_empty",
     "name = 'f8e4kz' " FP8_EP FP8_Q "mesh = { ep = 4 }\ndispatch = { mode = 'capacity', capacity = 1200 }\n", 300, 0,
     1 + 0, 0},
    /* experts no token picks (empty slots on their ranks), the rest ragged */
    {"fp8_ep4_empty_experts",
     "name = 'f8e4d' " FP8_EP FP8_Q "mesh = { ep = 4 }\nrouter = { score = 'sigmoid', bias = true }\n", 37, 0, 0, 1},
};

static void run_fp8_case(const fp8_case_t *c, uint64_t seed) {
    family_case(FAM_GATHER, c->name);
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, c->name, c->text, NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return;
    }
    moe_mesh_plan_t mp;
    char err[512];
    if (moe_mesh_plan_build(&mp, &spec, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/moegen_test_ep_fp8_%d.moe", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(c->text, f);
    fclose(f);
    const int W = mp.world, E = spec.experts, H = spec.hidden, F = spec.ffn, T = c->tokens;
    const int NS = mp.nstored, NH = mp.nheld, block = spec.quant.scaling == MOE_SCALING_BLOCK;
    /* per expert: e4m3 bytes, scale floats (independent of the library's formulas) */
    const size_t q1b = 2 * (size_t)F * H, q2b = (size_t)H * F;
    const size_t s1n = block ? (size_t)(2 * F / 128) * (H / 128) : 2 * (size_t)F,
                 s2n = block ? (size_t)(H / 128) * (F / 128) : (size_t)H;
    moe_plan *plan[16] = {0};
    moe_ep_call_t *call[16] = {0};
    CUdeviceptr dx[16] = {0}, dy[16] = {0}, dws[16] = {0}, db1[16] = {0}, db2[16] = {0}, dq1[16] = {0},
                dq2[16] = {0}, ds1[16] = {0}, ds2[16] = {0}, dsq1[16] = {0}, dsq2[16] = {0}, dss1[16] = {0},
                dss2[16] = {0}, dwr = 0, dsel = 0;
    ep_layer_t L;
    moe_ref_fp8_t f8 = {0};
    if (ep_layer_make(&L, &spec, W, T, seed)) {
        CHECKF(0, "out of memory");
        return;
    }
    uint8_t *q1 = malloc(E * q1b), *q2 = malloc(E * q2b), *hq = malloc(NH * q1b);
    float *s1 = malloc(sizeof(float) * E * s1n), *s2 = malloc(sizeof(float) * E * s2n),
          *hs = malloc(sizeof(float) * NH * (s1n > s2n ? s1n : s2n));
    uint16_t *y = malloc(2 * (size_t)T * H);
    float *sel = malloc(sizeof(float) * E);
    if (!q1 || !q2 || !hq || !s1 || !s2 || !hs || !y || !sel || moe_ref_fp8_weights(&spec, L.w1, L.w2, &f8)) {
        CHECKF(0, "out of memory");
        goto done;
    }
    for (int e = 0; e < E; e++) /* with c->dead every fifth expert is never picked (sigmoid scores are in (0, 1)) */
        sel[e] = c->dead && e % 5 == 3 ? -100.f : 0.01f * (float)(e % 7);
    for (int r = 0; r < W; r++) {
        moe_options o = {.rank = r};
        moe_status st = moe_plan_create_unconnected(&plan[r], path, &o);
        CHECKF(st == MOE_OK, "rank %d: %s: %s", r, moe_status_string(st), moe_last_error());
        if (st)
            goto done;
        call[r] = malloc(sizeof *call[r]);
    }
    /* the direct quantize of the whole checkpoint, on the host */
    moe_pack_args a1, a2;
    CHECK(moe_plan_pack_layout(plan[0], MOE_LAYOUT_W1_FUSED, L.w1, NULL, 0, E, &a1) == MOE_OK);
    CHECK(moe_plan_pack_layout(plan[0], MOE_LAYOUT_W2, L.w2, NULL, 0, E, &a2) == MOE_OK);
    CHECKF(moe_plan_pack_quantize(plan[0], &a1, q1, s1) == MOE_OK, "%s", moe_last_error());
    CHECKF(moe_plan_pack_quantize(plan[0], &a2, q2, s2) == MOE_OK, "%s", moe_last_error());
    moe_plan_info info = MOE_PLAN_INFO_INIT;
    CHECK(moe_plan_get_info(plan[0], &info) == MOE_OK);
    CHECKF(info.gather_bytes == (long long)((NH - NS) * (q1b + q2b + 4 * (s1n + s2n))),
           "moe_plan_info.gather_bytes = %lld", info.gather_bytes);
    CU(moe_cu.cuMemAlloc(&dwr, 2 * (size_t)E * H));
    CU(moe_cu.cuMemcpyHtoD(dwr, L.wr, 2 * (size_t)E * H));
    CU(moe_cu.cuMemAlloc(&dsel, sizeof(float) * E));
    CU(moe_cu.cuMemcpyHtoD(dsel, sel, sizeof(float) * E));
    const size_t wsb = moe_plan_workspace_size(plan[0], T);
    CHECK(wsb > 0);
    for (int r = 0; r < W; r++) {
        const int first = mp.ranks[r].stored[0];
        CHECK(mp.ranks[r].stored[NS - 1] == first + NS - 1); /* a rank stores consecutive experts */
        CU(moe_cu.cuMemAlloc(&dx[r], 2 * (size_t)T * H));
        CU(moe_cu.cuMemcpyHtoD(dx[r], L.x + (size_t)r * T * H, 2 * (size_t)T * H));
        CU(moe_cu.cuMemAlloc(&dy[r], 2 * (size_t)T * H));
        CU(moe_cu.cuMemAlloc(&dws[r], wsb + EP_WS_GUARD));
        /* the stored shard: bf16 (plain layouts) for the quantizing gather, e4m3 and scales for the plain one */
        CU(moe_cu.cuMemAlloc(&db1[r], 2 * NS * q1b));
        CU(moe_cu.cuMemAlloc(&db2[r], 2 * NS * q2b));
        CU(moe_cu.cuMemcpyHtoD(db1[r], L.w1 + (size_t)first * q1b, 2 * NS * q1b));
        CU(moe_cu.cuMemcpyHtoD(db2[r], L.w2 + (size_t)first * q2b, 2 * NS * q2b));
        CU(moe_cu.cuMemAlloc(&dsq1[r], NS * q1b));
        CU(moe_cu.cuMemAlloc(&dsq2[r], NS * q2b));
        CU(moe_cu.cuMemAlloc(&dss1[r], 4 * NS * s1n));
        CU(moe_cu.cuMemAlloc(&dss2[r], 4 * NS * s2n));
        CU(moe_cu.cuMemcpyHtoD(dsq1[r], q1 + (size_t)first * q1b, NS * q1b));
        CU(moe_cu.cuMemcpyHtoD(dsq2[r], q2 + (size_t)first * q2b, NS * q2b));
        CU(moe_cu.cuMemcpyHtoD(dss1[r], s1 + (size_t)first * s1n, 4 * NS * s1n));
        CU(moe_cu.cuMemcpyHtoD(dss2[r], s2 + (size_t)first * s2n, 4 * NS * s2n));
        CU(moe_cu.cuMemAlloc(&dq1[r], NH * q1b));
        CU(moe_cu.cuMemAlloc(&dq2[r], NH * q2b));
        CU(moe_cu.cuMemAlloc(&ds1[r], 4 * NH * s1n));
        CU(moe_cu.cuMemAlloc(&ds2[r], 4 * NH * s2n));
    }
    /* pass 0: quantize before gather (bf16 shards); pass 1: the e4m3 shards and scales gathered as they are */
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < W; r++) {
            CU(moe_cu.cuMemsetD8(dq1[r], 0x7f, NH * q1b)); /* poison: e4m3 NaN, fp32 NaN */
            CU(moe_cu.cuMemsetD8(dq2[r], 0x7f, NH * q2b));
            CU(moe_cu.cuMemsetD8(ds1[r], 0xff, 4 * NH * s1n));
            CU(moe_cu.cuMemsetD8(ds2[r], 0xff, 4 * NH * s2n));
            moe_gather_args g = {.held_w1p = (void *)(uintptr_t)dq1[r], .held_w2 = (void *)(uintptr_t)dq2[r],
                                 .held_w1s = (float *)(uintptr_t)ds1[r], .held_w2s = (float *)(uintptr_t)ds2[r]};
            moe_status st;
            if (pass == 0) {
                moe_pack_args b1, b2;
                CHECK(moe_plan_pack_layout(plan[r], MOE_LAYOUT_W1_FUSED, (void *)(uintptr_t)db1[r], NULL, 0, NS,
                                           &b1) == MOE_OK);
                CHECK(moe_plan_pack_layout(plan[r], MOE_LAYOUT_W2, (void *)(uintptr_t)db2[r], NULL, 0, NS, &b2) ==
                      MOE_OK);
                st = moe_gather_prepare_fp8(plan[r], &b1, &b2, &g, NULL, call[r]);
            } else {
                g.stored = (moe_weights){(void *)(uintptr_t)dsq1[r], NULL, (void *)(uintptr_t)dsq2[r], NULL};
                g.stored_w1s = (float *)(uintptr_t)dss1[r], g.stored_w2s = (float *)(uintptr_t)dss2[r];
                st = moe_gather_prepare(plan[r], &g, NULL, call[r]);
            }
            CHECKF(st == MOE_OK, "pass %d, gather, rank %d: %s", pass, r, moe_last_error());
            if (st)
                goto done;
        }
        CU(moe_cu.cuCtxSynchronize());
        CHECK(ep_play_xfers(&mp, call, 1) == 0);
        for (int r = 0; r < W; r++) {
            long long bad[4] = {0};
            CU(moe_cu.cuMemcpyDtoH(hq, dq1[r], NH * q1b));
            for (int j = 0; j < NH; j++)
                bad[0] += memcmp(hq + j * q1b, q1 + (size_t)mp.ranks[r].held[j] * q1b, q1b) != 0;
            CU(moe_cu.cuMemcpyDtoH(hs, ds1[r], 4 * NH * s1n));
            for (int j = 0; j < NH; j++)
                bad[1] += memcmp(hs + j * s1n, s1 + (size_t)mp.ranks[r].held[j] * s1n, 4 * s1n) != 0;
            CU(moe_cu.cuMemcpyDtoH(hq, dq2[r], NH * q2b));
            for (int j = 0; j < NH; j++)
                bad[2] += memcmp(hq + j * q2b, q2 + (size_t)mp.ranks[r].held[j] * q2b, q2b) != 0;
            CU(moe_cu.cuMemcpyDtoH(hs, ds2[r], 4 * NH * s2n));
            for (int j = 0; j < NH; j++)
                bad[3] += memcmp(hs + j * s2n, s2 + (size_t)mp.ranks[r].held[j] * s2n, 4 * s2n) != 0;
            if (families_on >> FAM_GATHER & 1u)
                CHECKF(!bad[0] && !bad[1] && !bad[2] && !bad[3], "pass %d, rank %d: held slots not the direct "
                       "quantize of their experts: w1q %lld, w1s %lld, w2q %lld, w2s %lld of %d", pass, r, bad[0],
                       bad[1], bad[2], bad[3], NH);
        }
        if (pass == 0 && (families_on >> FAM_GATHER & 1u))
            printf("  %s: %d ranks, %lld bytes gathered into each (bf16: %lld)\n", c->name, W, info.gather_bytes,
                   (long long)((NH - NS) * 2 * (q1b + q2b)));
    }
    /* every rank's forward on its gathered weights (the last pass's): a mesh
     * without EP runs moe_forward per rank; with EP every rank runs the
     * four steps and the harness moves the data as each step's list says
     * (the rows out as e4m3 and scales, the results home in bf16) */
    family_case(FAM_EP, c->name);
    if (!(families_on >> FAM_EP & 1u))
        goto done;
    moe_forward_args a[16];
    CUdeviceptr ws_at[16] = {0}; /* exactly moe_plan_workspace_size at the rank's tokens, before the guard */
    for (int r = 0; r < W; r++) {
        const int Tr = r == c->empty - 1 ? 0 : T;
        const size_t n = moe_plan_workspace_size(plan[r], Tr);
        CHECKF(n > 0 && n <= wsb && n % 256 == 0, "rank %d: moe_plan_workspace_size(%d) = %zu of %zu", r, Tr, n, wsb);
        ws_at[r] = dws[r] + (n <= wsb ? wsb - n : 0);
        CU(moe_cu.cuMemsetD8(dy[r], 0xff, 2 * (size_t)T * H)); /* poison: NaN in bf16 */
        CU(moe_cu.cuMemsetD8(dws[r], 0xff, wsb));              /* e4m3 and fp32 NaN */
        CU(moe_cu.cuMemsetD8(dws[r] + wsb, 0xa5, EP_WS_GUARD)); /* the guard after the workspace */
        a[r] = (moe_forward_args){.tokens = Tr, .x = (void *)(uintptr_t)dx[r], .router_w = (void *)(uintptr_t)dwr,
                                  .router_bias = spec.router.bias ? (const float *)(uintptr_t)dsel : NULL,
                                  .w1p = (void *)(uintptr_t)dq1[r], .w2 = (void *)(uintptr_t)dq2[r],
                                  .w1s = (float *)(uintptr_t)ds1[r], .w2s = (float *)(uintptr_t)ds2[r],
                                  .y = (void *)(uintptr_t)dy[r], .workspace = (void *)(uintptr_t)ws_at[r]};
    }
    if (mp.size[MOE_AXIS_EP] > 1) {
        for (int step = 0; step < MOE_EP_STEPS; step++) {
            for (int r = 0; r < W; r++) {
                moe_status st = moe_ep_step(plan[r], &a[r], NULL, step, call[r]);
                CHECKF(st == MOE_OK, "step %d, rank %d: %s", step, r, moe_last_error());
                if (st)
                    goto done;
            }
            if (step == 1) { /* the rows go out quantized: H e4m3 bytes and H/128 fp32 scales a row */
                long long rows = 0, bytes = 0;
                for (int q = 0; q < mp.size[MOE_AXIS_EP]; q++)
                    rows += call[0]->send_rows[q];
                for (int i = 0; i < call[0]->nx; i++)
                    bytes += call[0]->x[i].recv ? 0 : (long long)call[0]->x[i].bytes;
                CHECKF(bytes == rows * (H + H / 32), "rank 0 sends %lld bytes for %lld rows", bytes, rows);
                printf("  %s: rank 0 sends %lld rows in %lld bytes (bf16: %lld)\n", c->name, rows, bytes,
                       rows * 2 * H);
            }
            CU(moe_cu.cuCtxSynchronize());
            CHECK(ep_play_xfers(&mp, call, 0) == 0);
        }
    } else {
        for (int r = 0; r < W; r++) {
            moe_status st = moe_forward(plan[r], &a[r], NULL);
            CHECKF(st == MOE_OK, "forward, rank %d: %s", r, moe_last_error());
            if (st)
                goto done;
        }
    }
    CU(moe_cu.cuCtxSynchronize());
    if (!ranks_after(plan, ws_at, dws, wsb, a, W, c->want_overflow))
        goto done;
    moe_ref_inputs_t extra = {.fp8 = &f8, .sel_bias = sel};
    for (int r = 0; r < W; r++) {
        CU(moe_cu.cuMemcpyDtoH(y, dy[r], 2 * (size_t)T * H));
        if (r == c->empty - 1) { /* no tokens: y keeps its poison */
            size_t changed = 0;
            for (size_t i = 0; i < (size_t)T * H; i++)
                changed += y[i] != 0xffff;
            CHECKF(changed == 0, "rank %d had no tokens but %zu of its outputs were written", r, changed);
            continue;
        }
        int nan = 0;
        double e = ep_layer_error(&L, &spec, r, T, y, &nan, &extra);
        CHECKF(e >= 0 && nan == 0 && e <= 1.5e-2, "rank %d: error %.3g against the quantized recipe, %d outputs "
               "unwritten", r, e, nan);
        if (r == 0)
            printf("  %s: %d ranks x %d tokens, rank 0 error %.2e (against the CPU's quantized recipe)\n", c->name,
                   W, T, e);
    }
done:
    for (int r = 0; r < W; r++) {
        CUdeviceptr all[] = {dx[r], dy[r], dws[r], db1[r], db2[r], dq1[r], dq2[r], ds1[r], ds2[r], dsq1[r], dsq2[r],
                             dss1[r], dss2[r]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            if (all[i])
                moe_cu.cuMemFree(all[i]);
        free(call[r]);
    }
    for (int r = 0; r < W; r++)
        moe_plan_destroy(plan[r]);
    if (dwr)
        moe_cu.cuMemFree(dwr);
    if (dsel)
        moe_cu.cuMemFree(dsel);
    moe_ref_fp8_free(&f8);
    ep_layer_free(&L);
    free(q1), free(q2), free(hq), free(s1), free(s2), free(hs), free(y), free(sel);
    moe_mesh_plan_free(&mp);
    unlink(path);
}

int main(int argc, char **argv) {
    int nfilter = 0;
    const char *filter[16];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--family") == 0 && i + 1 < argc) {
            const char *name = argv[++i];
            int f = 0;
            while (f < FAM_COUNT && strcmp(family_names[f], name) != 0)
                f++;
            if (f == FAM_COUNT) {
                fprintf(stderr, "test_ep_gpu: --family %s: the families are gather and ep\n", name);
                return 2;
            }
            families_on = (families_on == (1u << FAM_COUNT) - 1 ? 0 : families_on) | 1u << f;
        } else if (nfilter < 16) {
            filter[nfilter++] = argv[i];
        }
    }
    char why[256];
    CUdevice dev;
    int n = 0;
    if (moe_cu_load(why, sizeof why) || moe_cu.cuInit(0) || moe_cu.cuDeviceGetCount(&n) || n == 0) {
        CASE("test_ep_gpu");
        SKIP("no CUDA driver or GPU: %s", why[0] ? why : "no device");
        return check_report("test_ep_gpu");
    }
    CUcontext ctx;
    moe_cu.cuDeviceGet(&dev, 0);
    moe_cu.cuDevicePrimaryCtxRetain(&ctx, dev);
    moe_cu.cuCtxSetCurrent(ctx);
    const char *env = getenv("MOEGEN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    printf("test_ep_gpu: seed %llu (MOEGEN_TEST_SEED)\n", (unsigned long long)seed);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int want = nfilter == 0;
        for (int j = 0; j < nfilter; j++)
            want |= strstr(cases[i].name, filter[j]) != NULL;
        if (want)
            run_case(&cases[i], seed + i);
    }
    int major = 0;
    moe_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    for (size_t i = 0; i < sizeof fp8_cases / sizeof *fp8_cases; i++) {
        int want = nfilter == 0;
        for (int j = 0; j < nfilter; j++)
            want |= strstr(fp8_cases[i].name, filter[j]) != NULL;
        if (want && major != 9) {
            CASE(fp8_cases[i].name);
            SKIP("the fp8 GEMMs are sm_90a and device 0 is compute capability %d.x", major);
        } else if (want) {
            run_fp8_case(&fp8_cases[i], seed + 100 + i);
        }
    }
    return check_report("test_ep_gpu");
}
