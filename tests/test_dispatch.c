/* test_dispatch.c — expert-parallel dispatch/combine layouts, R ranks in memory.
 *
 * Hand-checked goldens for the send, capacity and receive layouts, then a
 * harness that runs every EP group of real mesh plans: each rank routes its
 * own tokens, rows move between ranks in memory exactly as the layouts say,
 * each receiver "runs its experts" as out = in*1000 + (the global expert the
 * plan says it holds at that slot), results go back, and combine must give
 * Σ_k w·(x*1000 + expert) computed straight from the routing. A row that
 * meets the wrong expert, lands in the wrong place or comes back to the
 * wrong (t, k) gives a wrong number. Every expected layout is recomputed here
 * by plain loops, independently of tests/support/dispatch.c.
 *
 * The same groups then run the backward on those layouts (every mode that
 * sends; capacity mode's dropped rows get no gradient):
 * the dys rows leave by the return's transfer list reversed, each receiver
 * runs a linear expert's backward on its slot-major rows (with the rows it
 * kept from the forward), the dXs rows come home by the dispatch's list
 * reversed, and every rank's dx and each expert's weight gradients (found
 * on the one EP rank that holds it) must equal the single-device gradients
 * computed straight from the routing (run_backward).
 *
 * Then the weight gradients' way back (moe_reduce_scatter_grads, training on
 * dp x fsdp meshes): every rank of a mesh fills the gradients of the experts
 * it holds with its own numbers, the collectives that moe_fsdp_grad_parts
 * describes run over each FSDP group in memory as NCCL defines them
 * (reduce-scatter: group rank f ends with the sum of every member's chunk f;
 * all-reduce: every member with the sum), and each rank must end with, for
 * each expert it stores, the sum of that expert's gradient over its FSDP
 * peers, found by expert in each peer's held list (dp x fsdp meshes, and
 * with ep > 1, where an EP rank's FSDP peers hold the same experts). The numbers are small
 * integers, so the sums are exact.
 *
 * Then the rows' transfer lists of the expert-parallel forward
 * (moe_ep_row_xfers, the lists NCCL runs), bf16 and fp8, on several meshes
 * in both dispatch modes: every rank of an EP group lists its step-1 (rows
 * out) and step-2 (results home) transfers over its own workspace in host
 * memory, laid out by moe_ep_ws_layout at its own tokens (one rank with
 * none); the lists run in memory as NCCL matches them, and each receiver
 * must hold every byte each source sent where the layout says (with fp8
 * the e4m3 rows and, as a second part, their scales: H + H/32 bytes a row
 * against bf16's 2H), the results must come back in bf16 to the rows they
 * left from, and nothing else may change.
 *
 * The seed is fresh each run and named in every failure; set MOEGEN_TEST_SEED
 * to replay one. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "dispatch.h"
#include "ep.h"
#include "fsdp_grad.h"
#include "mesh.h"
#include "plan.h"
#include "tuning.h"

/* ---- small tools -------------------------------------------------------- */

static uint64_t rng_state;
static unsigned long long seed;

static uint32_t rnd(void) {                  /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}
static int rnd_below(int n) { return n > 0 ? (int)(rnd() % (uint32_t)n) : 0; }
static float rnd_unit(void) { return (float)((rnd() >> 8) + 1) / 16777217.0f; }   /* (0, 1) */

/* Test allocations, freed together. */
static void *allocs[4096];
static int nallocs;
static void *talloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p || nallocs == (int)(sizeof allocs / sizeof allocs[0])) {
        fprintf(stderr, "test_dispatch: out of memory\n");
        exit(2);
    }
    allocs[nallocs++] = p;
    return p;
}
static void tfree_all(void) {
    while (nallocs) free(allocs[--nallocs]);
}
static int *ialloc(size_t n, int fill) {
    int *p = talloc(sizeof(int) * n);
    for (size_t i = 0; i < n; i++) p[i] = fill;
    return p;
}
static float *falloc(size_t n) {           /* poisoned with NaN */
    float *p = talloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static int list_eq(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}
static int all_eq(const int *a, int n, int v) {
    for (int i = 0; i < n; i++)
        if (a[i] != v) return 0;
    return 1;
}

#include "mesh_fixture.h"

static const int order_ep_outer[3] = {MOE_AXIS_EP, MOE_AXIS_DP, MOE_AXIS_FSDP};

/* ---- goldens ------------------------------------------------------------ */

/* DP2/FSDP2/EP2, 8 experts, {fsdp,ep}: EP rank 0 holds 0,1,4,5. One rank,
 * T = 3, K = 2: t0 -> {4, 1}, t1 -> {2, 5}, t2 -> {0, 7}. */
static const int g_idx[6] = {4, 1, 2, 5, 0, 7};

static void test_golden_send(void) {
    char err[512] = "";
    moe_mesh_plan_t mp;
    moe_spec_t s = make_spec(8, 2, 2, 2, order_default, SH_FSDP_EP);
    CASE("golden: {fsdp,ep} send layout (ep rank 0 holds 0,1,4,5)");
    if (moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    moe_dispatch_route_t rt = moe_dispatch_route_of_plan(&mp);
    CHECK(rt.ep == 2 && rt.nheld == 4 && rt.experts == 8);
    int sc[2], so[3], slc[8], sp[6];
    CHECK(moe_dispatch_send_layout(&rt, g_idx, 3, 2, sc, so, slc, sp) == MOE_DISPATCH_OK);
    /* dest 0 by slot: e0 (2,0) s0, e1 (0,1) s1, e4 (0,0) s2, e5 (1,1) s3; dest 1: e2 (1,0) s0, e7 (2,1) s3 */
    static const int want_sp[6] = {2, 1, 4, 3, 0, 5}, want_sc[2] = {4, 2}, want_so[3] = {0, 4, 6};
    static const int want_slc[8] = {1, 1, 1, 1, 1, 0, 0, 1};
    CHECK(list_eq(sp, want_sp, 6));
    CHECK(list_eq(sc, want_sc, 2) && list_eq(so, want_so, 3) && list_eq(slc, want_slc, 8));

    CASE("golden: {fsdp,ep} capacity 2 with the drop policy: highest (t,k) dropped first");
    int ex = -1, exd[2] = {-1, -1};
    CHECK(moe_dispatch_send_layout_capacity(&rt, g_idx, 3, 2, 2, MOE_DISPATCH_DROP, sc, slc, sp, &ex, exd) ==
          MOE_DISPATCH_OK);
    /* dest 0 keeps (0,0) e4, (0,1) e1, drops (1,1) e5, (2,0) e0; block 0..1 by slot: e1, e4.
     * dest 1 keeps both at 2..3: e2 s0, e7 s3. */
    static const int want_csp[6] = {1, 0, 2, -1, -1, 3}, want_csc[2] = {2, 2};
    static const int want_cslc[8] = {0, 1, 1, 0, 1, 0, 0, 1}, want_exd[2] = {2, 0};
    CHECK(ex == 2 && list_eq(exd, want_exd, 2));
    CHECK(list_eq(sp, want_csp, 6) && list_eq(sc, want_csc, 2) && list_eq(slc, want_cslc, 8));

    CASE("golden: {fsdp,ep} capacity 2, policy off: overflow reported, nothing written");
    int sc2[2] = {77, 77}, slc2[8], sp2[6];
    for (int i = 0; i < 8; i++) slc2[i] = 77;
    for (int i = 0; i < 6; i++) sp2[i] = 77;
    ex = -1;
    exd[0] = exd[1] = -1;
    int rc = moe_dispatch_send_layout_capacity(&rt, g_idx, 3, 2, 2, 0, sc2, slc2, sp2, &ex, exd);
    CHECK(rc == MOE_DISPATCH_OVERFLOW);
    CHECK_STREQ(moe_dispatch_status_name(rc), "overflow");
    CHECK(ex == 2 && list_eq(exd, want_exd, 2));
    CHECK(all_eq(sc2, 2, 77) && all_eq(slc2, 8, 77) && all_eq(sp2, 6, 77));

    CASE("golden: capacity 4 fits: same order as exact mode, dest 1 at row 4");
    CHECK(moe_dispatch_send_layout_capacity(&rt, g_idx, 3, 2, 4, 0, sc, slc, sp, &ex, NULL) == MOE_DISPATCH_OK);
    CHECK(ex == 0 && list_eq(sp, want_sp, 6) && list_eq(sc, want_sc, 2) && list_eq(slc, want_slc, 8));

    CASE("golden: capacity 0 with the drop policy drops everything");
    CHECK(moe_dispatch_send_layout_capacity(&rt, g_idx, 3, 2, 0, MOE_DISPATCH_DROP, sc, slc, sp, &ex, exd) ==
          MOE_DISPATCH_OK);
    CHECK(ex == 6 && exd[0] == 4 && exd[1] == 2 && all_eq(sp, 6, -1) && all_eq(sc, 2, 0) && all_eq(slc, 8, 0));

    CASE("golden: {ep,fsdp}: the same routing goes elsewhere (ep rank 0 holds 0..3)");
    moe_mesh_plan_free(&mp);
    s = make_spec(8, 2, 2, 2, order_default, SH_EP_FSDP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    rt = moe_dispatch_route_of_plan(&mp);
    CHECK(moe_dispatch_send_layout(&rt, g_idx, 3, 2, sc, so, slc, sp) == MOE_DISPATCH_OK);
    /* dest 0: e0 (2,0) s0, e1 (0,1) s1, e2 (1,0) s2; dest 1: e4 (0,0) s0, e5 (1,1) s1, e7 (2,1) s3 */
    static const int want_ef_sp[6] = {3, 1, 2, 4, 0, 5}, want_ef_slc[8] = {1, 1, 1, 0, 1, 1, 0, 1};
    CHECK(list_eq(sp, want_ef_sp, 6) && sc[0] == 3 && sc[1] == 3 && list_eq(slc, want_ef_slc, 8));
    moe_mesh_plan_free(&mp);
}

static void test_golden_recv(void) {
    CASE("golden: receive layout, align 4: slot blocks aligned, by source then order");
    /* 2 sources, 4 slots: s0 = {5, 0, 1, 0}, s1 = {3, 0, 0, 0} */
    static const int rc_[8] = {5, 0, 1, 0, 3, 0, 0, 0};
    int csrc[8], cdst[8], soff[5], nt = -1;
    moe_dispatch_tile_t tiles[8];
    CHECK(moe_dispatch_recv_layout(2, 4, 4, rc_, csrc, cdst, soff, NULL, 0, &nt) == MOE_DISPATCH_ESPACE);
    CHECK(nt == 3);
    CHECK(moe_dispatch_recv_layout(2, 4, 4, rc_, csrc, cdst, soff, tiles, 2, &nt) == MOE_DISPATCH_ESPACE);
    CHECK(nt == 3);
    CHECK(moe_dispatch_recv_layout(2, 4, 4, rc_, csrc, cdst, soff, tiles, 8, &nt) == MOE_DISPATCH_OK);
    static const int want_soff[5] = {0, 8, 8, 12, 12};
    static const int want_csrc[8] = {0, 5, 5, 6, 0, 3, 3, 3}, want_cdst[8] = {0, 8, 8, 12, 5, 8, 9, 12};
    CHECK(nt == 3 && list_eq(soff, want_soff, 5) && list_eq(csrc, want_csrc, 8) && list_eq(cdst, want_cdst, 8));
    static const int want_tiles[3][4] = {{0, 0, 4, 0}, {0, 4, 4, 0}, {2, 8, 1, 0}};
    for (int i = 0; i < 3; i++)
        CHECKF(tiles[i].slot == want_tiles[i][0] && tiles[i].row_start == want_tiles[i][1] &&
               tiles[i].rows == want_tiles[i][2] && tiles[i].pad == 0,
               "tile %d = {%d, %d, %d}", i, tiles[i].slot, tiles[i].row_start, tiles[i].rows);
    CHECK(sizeof(moe_dispatch_tile_t) == 4 * sizeof(int));

    CASE("golden: receive layout, nothing received: no rows, no tiles");
    static const int zero[8] = {0};
    CHECK(moe_dispatch_recv_layout(2, 4, 16, zero, csrc, cdst, soff, NULL, 0, &nt) == MOE_DISPATCH_OK);
    CHECK(nt == 0 && all_eq(soff, 5, 0) && all_eq(cdst, 8, 0) && all_eq(csrc, 8, 0));
}

static void test_errors(void) {
    static const int owner[4] = {0, 0, 1, 1}, slot[4] = {0, 1, 0, 1};
    moe_dispatch_route_t rt = {4, 2, 2, owner, slot};
    int sc[2] = {9, 9}, so[3] = {9, 9, 9}, slc[4] = {9, 9, 9, 9}, sp[2] = {9, 9}, ex = 9;

    CASE("errors: expert id out of range -> EINVAL, nothing written");
    static const int bad_idx[2] = {1, 4};
    CHECK(moe_dispatch_send_layout(&rt, bad_idx, 1, 2, sc, so, slc, sp) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_send_layout_capacity(&rt, bad_idx, 1, 2, 4, 0, sc, slc, sp, &ex, NULL) ==
          MOE_DISPATCH_EINVAL);
    CHECK(all_eq(sc, 2, 9) && all_eq(so, 3, 9) && all_eq(slc, 4, 9) && all_eq(sp, 2, 9) && ex == 9);

    CASE("errors: routing table entry out of range -> EINVAL");
    static const int bad_owner[4] = {0, 0, 2, 1}, bad_slot[4] = {0, 2, 0, 1};
    static const int idx[2] = {0, 3};
    moe_dispatch_route_t r1 = {4, 2, 2, bad_owner, slot}, r2 = {4, 2, 2, owner, bad_slot};
    CHECK(moe_dispatch_send_layout(&r1, idx, 1, 2, sc, so, slc, sp) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_send_layout(&r2, idx, 1, 2, sc, so, slc, sp) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_send_layout(&rt, idx, -1, 2, sc, so, slc, sp) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_send_layout(&rt, idx, 1, 0, sc, so, slc, sp) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_send_layout_capacity(&rt, idx, 1, 2, -1, 0, sc, slc, sp, &ex, NULL) == MOE_DISPATCH_EINVAL);
    CHECK(all_eq(sc, 2, 9) && all_eq(sp, 2, 9));

    CASE("errors: a rank with no tokens sends nothing (send_pos may be NULL)");
    CHECK(moe_dispatch_send_layout(&rt, NULL, 0, 2, sc, so, slc, NULL) == MOE_DISPATCH_OK);
    CHECK(all_eq(sc, 2, 0) && all_eq(so, 3, 0) && all_eq(slc, 4, 0));
    CHECK(moe_dispatch_send_layout_capacity(&rt, NULL, 0, 2, 0, 0, sc, slc, NULL, &ex, NULL) == MOE_DISPATCH_OK);
    CHECK(ex == 0 && all_eq(sc, 2, 0));

    CASE("errors: receive layout arguments");
    static const int neg[4] = {1, -1, 0, 0};
    int csrc[4], cdst[4], soff[3], nt = 0;
    CHECK(moe_dispatch_recv_layout(2, 2, 4, neg, csrc, cdst, soff, NULL, 0, &nt) == MOE_DISPATCH_EINVAL);
    CHECK(moe_dispatch_recv_layout(2, 2, 0, slot, csrc, cdst, soff, NULL, 0, &nt) == MOE_DISPATCH_EINVAL);

    CASE("errors: combine position past the return buffer -> EINVAL, y untouched");
    float w[2] = {1, 1}, ret[2] = {1, 2}, y[1] = {42};
    int pos[2] = {0, 2};
    CHECK(moe_dispatch_combine(1, 2, 1, w, pos, ret, 2, y) == MOE_DISPATCH_EINVAL && y[0] == 42);
    CHECK_STREQ(moe_dispatch_status_name(MOE_DISPATCH_EINVAL), "invalid argument");
    CHECK_STREQ(moe_dispatch_status_name(99), "unknown");
}

/* Combine sums in increasing k, in fp32, from 0: with 1, 1e8, -1e8 that is
 * (1 + 1e8) - 1e8 = 0 in fp32; any other order gives 1 or 0 differently. */
static void test_combine_order(void) {
    CASE("combine: y = Σ_k w·ret[pos(t,k)] in increasing k, dropped slots add nothing");
    /* return rows deliberately out of k order: pos = {2, 0, 1} */
    const float ret[3] = {1e8f, -1e8f, 1.0f};
    const int pos[3] = {2, 0, 1};
    const float w[3] = {1, 1, 1};
    float y = -1;
    CHECK(moe_dispatch_combine(1, 3, 1, w, pos, ret, 3, &y) == MOE_DISPATCH_OK);
    CHECKF(y == 0.0f, "y = %g, want 0 = (1 + 1e8) - 1e8 in fp32", (double)y);
    const int pos_rev[3] = {1, 0, 2};   /* k order -1e8, 1e8, 1 -> 1 */
    CHECK(moe_dispatch_combine(1, 3, 1, w, pos_rev, ret, 3, &y) == MOE_DISPATCH_OK && y == 1.0f);
    const int pos_drop[3] = {2, -1, 1}; /* 1 + (-1e8) */
    CHECK(moe_dispatch_combine(1, 3, 1, w, pos_drop, ret, 3, &y) == MOE_DISPATCH_OK && y == 1.0f - 1e8f);
    const int all_drop[3] = {-1, -1, -1};
    CHECK(moe_dispatch_combine(1, 3, 1, w, all_drop, ret, 3, &y) == MOE_DISPATCH_OK && y == 0.0f);
}

/* ---- the in-memory EP group --------------------------------------------- */

enum { W = 3 };   /* row: value, source ep rank, token */

enum { R_RANDOM, R_SPARSE, R_ONE, R_TO_RANK0, R_EMPTY_SENDER, R_T1, R_REPEATS, R_COUNT };
static const char *r_name[R_COUNT] = {"random", "some experts empty", "all tokens to one expert set",
                                      "all to ep rank 0 (others receive nothing)", "one rank sends nothing",
                                      "T = 1", "experts repeated within a token (given routing's ids)"};
enum { M_EXACT, M_CAP_AMPLE, M_CAP_TIGHT, M_CAP_DROP, M_COUNT };
static const char *m_name[M_COUNT] = {"exact", "capacity (fits)", "capacity (too small, policy off)",
                                      "capacity (too small, drop)"};

typedef struct {
    int T;
    int *idx;        /* [T*K] */
    float *w;        /* [T*K] */
    float *x;        /* [T*W] */
    int *keep;       /* [T*K] expected kept (capacity mode), else 1 */
    int *sc, *so, *slc, *sp;
    float *sbuf, *ret;
    int ret_rows;
} src_t;

/* K distinct experts from pool[0..n) into out (n >= K). */
static void pick(const int *pool, int n, int K, int *out) {
    int tmp[64];
    memcpy(tmp, pool, sizeof(int) * (size_t)n);
    for (int k = 0; k < K; k++) {
        int j = k + rnd_below(n - k);
        int t = tmp[k];
        tmp[k] = tmp[j];
        tmp[j] = t;
        out[k] = tmp[k];
    }
}

/* Whether every float of rows [a, a+n) of buf (W wide) is NaN (never written). */
static int rows_poisoned(const float *buf, int a, int n) {
    for (int i = a * W; i < (a + n) * W; i++)
        if (!isnan(buf[i])) return 0;
    return 1;
}

static void copy_rows(float *dst, int drow, const float *src, int srow, int n) {
    memcpy(dst + (size_t)drow * W, src + (size_t)srow * W, sizeof(float) * (size_t)n * W);
}

/* ---- the backward: the forward's transfer lists reversed ------------------
 *
 * A row movement of one exchange: `rows` rows from EP rank `from`'s buffer at
 * row from_row to rank `to`'s at to_row. The forward's dispatch goes from
 * each source's send layout to the receivers' slot-major layout, its return
 * back; the backward moves the dys rows by the return's list reversed and
 * the dXs rows home by the dispatch's list reversed (docs/DESIGN.md,
 * "Expert-parallel backward"). */
typedef struct {
    int from, from_row, to, to_row, rows;
} move_t;

typedef struct {         /* a receiver's layout and the rows it kept (the forward's xs) */
    int *rcnt, *csrc, *cdst, *soff;
    float *xs;
} recv_t;

/* The forward's moves of an EP group: dispatch (ret = 0) or return (ret =
 * 1), chunk by chunk (capacity mode: each source's block at d·C, as its
 * send offsets say); returns their number. */
static int forward_moves(int ep, int nh, const src_t *src, const recv_t *rx, int ret, move_t *mv) {
    int n = 0;
    for (int j = 0; j < ep; j++)
        for (int s = 0; s < ep; s++)
            for (int sl = 0; sl < nh; sl++) {
                const int c = rx[j].rcnt[s * nh + sl];
                if (!c) continue;
                const move_t d = {s, src[s].so[j] + rx[j].csrc[s * nh + sl], j, rx[j].cdst[s * nh + sl], c};
                mv[n++] = ret ? (move_t){d.to, d.to_row, d.from, d.from_row, c} : d;
            }
    return n;
}

static void reverse_moves(move_t *mv, int n) {
    for (int i = 0; i < n; i++)
        mv[i] = (move_t){mv[i].to, mv[i].to_row, mv[i].from, mv[i].from_row, mv[i].rows};
}

/* Expert g's linear map M_g [W, W] (O = M_g·x): small integers, so every
 * gradient below is exact in fp32 whatever the order of its sums. */
static float m_of(int g, int a, int b) { return (float)((g * 7 + a * 3 + b * 5) % 5 - 2); }

/* The backward of one EP group after its exact forward: each home rank's
 * dys = w·dy rows (integer weights) leave by the return's list reversed,
 * each receiver computes dXs = M_gᵀ·dys on its slot-major rows and the
 * weight gradients of the experts it holds (dM_g = Σ dys ⊗ xs over the
 * slot's rows, db_g = Σ dys), the dXs rows come home by the dispatch's list
 * reversed, and dx[t] = Σ_k dXs. Checked against the single-device
 * gradients computed straight from the routing: every rank's dx, dw =
 * <dy, O> from the O that came home, and each expert's gradient found on
 * the EP rank that holds it and nowhere else. A (t, k) that capacity mode
 * dropped adds nothing anywhere (as it added nothing to y). */
static void run_backward(const moe_mesh_plan_t *mp, int grp, int K, src_t *src, const recv_t *rx) {
    const int ep = mp->size[MOE_AXIS_EP], nh = mp->nheld, E = mp->experts;
    const int *peers = mp->ep_groups + grp * ep;
    int nmv = 0;
    for (int j = 0; j < ep; j++)
        for (int i = 0; i < ep * nh; i++) nmv += rx[j].rcnt[i] > 0;
    move_t *disp = talloc(sizeof *disp * (size_t)(nmv + 1)), *out = talloc(sizeof *out * (size_t)(nmv + 1));
    CHECK(forward_moves(ep, nh, src, rx, 0, disp) == nmv && forward_moves(ep, nh, src, rx, 1, out) == nmv);
    reverse_moves(out, nmv); /* the return's list reversed: the dys rows' way out */
    int same = 1;
    for (int i = 0; i < nmv; i++)
        same &= !memcmp(&out[i], &disp[i], sizeof *out);
    CHECKF(same, "the return's list reversed is not the dispatch's (seed %llu)", seed);

    /* home: dys per (t, k) at its send row; the reference from the routing alone */
    float *dy[8], *wb[8], *home[8], *dx_ref[8];
    float *dm_ref = falloc((size_t)E * W * W), *db_ref = falloc((size_t)E * W);
    for (int i = 0; i < E * W * W; i++) dm_ref[i] = 0;
    for (int i = 0; i < E * W; i++) db_ref[i] = 0;
    int dw_ok = 1;
    for (int i = 0; i < ep; i++) {
        src_t *s = &src[i];
        const int n = s->T * K;
        dy[i] = falloc((size_t)s->T * W + 1);
        wb[i] = falloc((size_t)n + 1);
        home[i] = falloc((size_t)(s->ret_rows + 4) * W);
        dx_ref[i] = falloc((size_t)s->T * W + 1);
        for (int q = 0; q < s->T * W; q++) dy[i][q] = (float)(rnd_below(11) - 5), dx_ref[i][q] = 0;
        for (int q = 0; q < n; q++) {
            const int t = q / K, g = s->idx[q], r = s->sp[q];
            wb[i][q] = (float)(1 + rnd_below(4));
            if (r < 0) /* dropped */
                continue;
            float dw = 0, want = 0;
            for (int h = 0; h < W; h++) {
                const float d = wb[i][q] * dy[i][t * W + h];
                home[i][r * W + h] = d;
                dw += dy[i][t * W + h] * s->ret[r * W + h];
                want += dy[i][t * W + h] * (s->x[t * W + h] * 1000.0f + (float)g);
                db_ref[g * W + h] += d;
                for (int b = 0; b < W; b++) {
                    dm_ref[(g * W + h) * W + b] += d * s->x[t * W + b];
                    dx_ref[i][t * W + b] += m_of(g, h, b) * d;
                }
            }
            dw_ok &= dw == want;
        }
    }
    CHECKF(dw_ok, "dw = <dy, O>: an O row that came home is not its (t, k)'s (seed %llu)", seed);

    /* the dys rows go out; each receiver's dgrad and weight gradients */
    float *dys[8], *dxs[8], *dm[8], *db[8];
    for (int j = 0; j < ep; j++) {
        const int nrows = rx[j].soff[nh];
        dys[j] = falloc((size_t)nrows * W + 1);
        dxs[j] = falloc((size_t)nrows * W + 1);
    }
    for (int i = 0; i < nmv; i++)
        copy_rows(dys[out[i].to], out[i].to_row, home[out[i].from], out[i].from_row, out[i].rows);
    for (int j = 0; j < ep; j++) {
        const int *held = mp->ranks[peers[j]].held;
        dm[j] = falloc((size_t)nh * W * W);
        db[j] = falloc((size_t)nh * W);
        for (int sl = 0; sl < nh; sl++) {
            const int g = held[sl];
            int c = 0;
            for (int s = 0; s < ep; s++) c += rx[j].rcnt[s * nh + sl];
            for (int e = 0; e < W * W; e++) dm[j][sl * W * W + e] = 0;
            for (int h = 0; h < W; h++) db[j][sl * W + h] = 0;
            for (int r = rx[j].soff[sl]; r < rx[j].soff[sl] + c; r++)
                for (int h = 0; h < W; h++) {
                    const float d = dys[j][r * W + h];
                    db[j][sl * W + h] += d;
                    for (int b = 0; b < W; b++) dm[j][(sl * W + h) * W + b] += d * rx[j].xs[r * W + b];
                }
            for (int r = rx[j].soff[sl]; r < rx[j].soff[sl] + c; r++)
                for (int b = 0; b < W; b++) {
                    float v = 0;
                    for (int h = 0; h < W; h++) v += m_of(g, h, b) * dys[j][r * W + h];
                    dxs[j][r * W + b] = v;
                }
        }
    }
    /* the dXs rows come home by the dispatch's list reversed, into the send layout */
    for (int i = 0; i < ep; i++)
        for (int q = 0; q < (src[i].ret_rows + 4) * W; q++) home[i][q] = NAN;
    reverse_moves(disp, nmv);
    for (int i = 0; i < nmv; i++)
        copy_rows(home[disp[i].to], disp[i].to_row, dxs[disp[i].from], disp[i].from_row, disp[i].rows);
    for (int i = 0; i < ep; i++) {
        src_t *s = &src[i];
        CHECKF(rows_poisoned(home[i], s->ret_rows, 4), "ep rank %d: dXs written past the send layout", i);
        long long bad = 0;
        for (int t = 0; t < s->T; t++)
            for (int b = 0; b < W; b++) {
                float v = 0;
                for (int k = 0; k < K; k++)
                    if (s->sp[t * K + k] >= 0) v += home[i][s->sp[t * K + k] * W + b];
                bad += !(v == dx_ref[i][t * W + b]);
            }
        CHECKF(bad == 0, "ep rank %d (rank %d): %lld dx values differ from the single-device backward (seed %llu)", i,
               peers[i], bad, seed);
    }
    /* each expert's gradients on the rank that holds it, equal to the reference */
    long long bad = 0, unheld = 0;
    for (int g = 0; g < E; g++) {
        int found = 0;
        for (int j = 0; j < ep; j++)
            for (int sl = 0; sl < nh; sl++) {
                if (mp->ranks[peers[j]].held[sl] != g) continue;
                found++;
                for (int e = 0; e < W * W; e++) bad += dm[j][sl * W * W + e] != dm_ref[g * W * W + e];
                for (int h = 0; h < W; h++) bad += db[j][sl * W + h] != db_ref[g * W + h];
            }
        unheld += found != 1;
    }
    CHECKF(bad == 0 && unheld == 0, "weight gradients: %lld values differ from the single-device backward, %lld experts "
           "not held by exactly one EP rank (seed %llu)", bad, unheld, seed);
}

/* Run one EP group of a plan through dispatch, the experts and combine. */
static void run_group(const moe_mesh_plan_t *mp, int grp, int K, int kind, int mode, int align, const char *plan) {
    const int ep = mp->size[MOE_AXIS_EP], nh = mp->nheld, E = mp->experts;
    const int *peers = mp->ep_groups + grp * ep;
    const moe_dispatch_route_t rt = moe_dispatch_route_of_plan(mp);
    char label[256];
    snprintf(label, sizeof label, "%s, ep group %d, K %d, %s, %s, align %d, seed %llu", plan, grp, K, r_name[kind],
             m_name[mode], align, seed);
    CASE(label);

    /* ---- routing per rank */
    int pool[64], npool = 0, one[64];
    for (int g = 0; g < E; g++) {
        if (kind == R_TO_RANK0 && mp->owner_ep_rank[g] != 0) continue;
        if (kind == R_SPARSE && rnd_below(2)) continue;
        pool[npool++] = g;
    }
    if (kind == R_SPARSE && npool < K)
        for (int g = 0; g < E && npool < K; g++) {   /* top up: still most experts empty */
            int have = 0;
            for (int i = 0; i < npool; i++) have |= pool[i] == g;
            if (!have) pool[npool++] = g;
        }
    pick(pool, npool, K, one);
    const int silent = rnd_below(ep);
    src_t src[8];
    for (int i = 0; i < ep; i++) {
        src_t *s = &src[i];
        s->T = kind == R_T1 ? 1 : (kind == R_EMPTY_SENDER && i == silent) ? 0 : 1 + rnd_below(40);
        s->idx = ialloc((size_t)s->T * K, -1);
        s->w = falloc((size_t)s->T * K);
        s->x = falloc((size_t)s->T * W);
        s->keep = ialloc((size_t)s->T * K, 1);
        for (int t = 0; t < s->T; t++) {
            if (kind == R_ONE)
                memcpy(s->idx + t * K, one, sizeof(int) * (size_t)K);
            else if (kind == R_REPEATS) /* any expert per entry, repeats allowed (router.select = "given") */
                for (int k = 0; k < K; k++) s->idx[t * K + k] = pool[rnd_below(npool)];
            else
                pick(pool, npool, K, s->idx + t * K);
            for (int k = 0; k < K; k++) s->w[t * K + k] = rnd_unit();
            s->x[t * W + 0] = (float)(1 + rnd_below(100));
            s->x[t * W + 1] = (float)i;
            s->x[t * W + 2] = (float)t;
        }
    }

    /* rows per (source, destination), from the routing alone */
    int n_sd[8][8] = {{0}}, ample = 0;
    for (int i = 0; i < ep; i++)
        for (int q = 0; q < src[i].T * K; q++) n_sd[i][mp->owner_ep_rank[src[i].idx[q]]]++;
    for (int i = 0; i < ep; i++)
        for (int d = 0; d < ep; d++) ample = n_sd[i][d] > ample ? n_sd[i][d] : ample;
    if ((mode == M_CAP_TIGHT || mode == M_CAP_DROP) && ample == 0) return;
    const int cap = mode == M_CAP_AMPLE ? ample : ample / 2;
    const int capmode = mode != M_EXACT;

    /* ---- sender layouts, checked against a direct computation */
    for (int i = 0; i < ep; i++) {
        src_t *s = &src[i];
        const int n = s->T * K;
        s->sc = ialloc((size_t)ep, 0x5a5a);
        s->so = ialloc((size_t)ep + 1, 0x5a5a);
        s->slc = ialloc((size_t)ep * nh, 0x5a5a);
        s->sp = ialloc((size_t)n, 0x5a5a);
        if (!capmode) {
            int rc = moe_dispatch_send_layout(&rt, s->idx, s->T, K, s->sc, s->so, s->slc, s->sp);
            CHECKF(rc == MOE_DISPATCH_OK, "ep rank %d: %s", i, moe_dispatch_status_name(rc));
            if (rc) return;
        } else {
            int seen[8] = {0}, want_ex = 0, want_exd[8] = {0}, exd[8], ex = -1;
            for (int q = 0; q < n; q++) {
                int d = mp->owner_ep_rank[s->idx[q]];
                s->keep[q] = seen[d]++ < cap;
                if (!s->keep[q]) {
                    want_ex++;
                    want_exd[d]++;
                }
            }
            unsigned flags = mode == M_CAP_DROP ? MOE_DISPATCH_DROP : 0;
            int rc = moe_dispatch_send_layout_capacity(&rt, s->idx, s->T, K, cap, flags, s->sc, s->slc, s->sp, &ex,
                                                       exd);
            CHECKF(ex == want_ex && list_eq(exd, want_exd, ep), "ep rank %d: excess %d, want %d", i, ex, want_ex);
            if (want_ex > 0 && mode == M_CAP_TIGHT) {
                CHECKF(rc == MOE_DISPATCH_OVERFLOW, "ep rank %d: %s", i, moe_dispatch_status_name(rc));
                CHECKF(all_eq(s->sc, ep, 0x5a5a) && all_eq(s->slc, ep * nh, 0x5a5a) && all_eq(s->sp, n, 0x5a5a),
                       "ep rank %d: the overflowing call wrote its layout", i);
                continue;
            }
            CHECKF(rc == MOE_DISPATCH_OK, "ep rank %d: %s", i, moe_dispatch_status_name(rc));
            if (rc) return;
            for (int d = 0; d <= ep; d++) s->so[d] = d * cap;
        }
        /* the expected send order: destination, then its slot, then (t, k), kept rows only */
        int pos = 0, ok = 1;
        for (int d = 0; d < ep; d++) {
            if (capmode) pos = d * cap;
            if (s->so[d] != pos) ok = 0;
            int rows = 0;
            for (int j = 0; j < nh; j++) {
                int c = 0;
                for (int q = 0; q < n; q++) {
                    int g = s->idx[q];
                    if (!s->keep[q] || mp->owner_ep_rank[g] != d || mp->slot[g] != j) continue;
                    if (s->sp[q] != pos + c) ok = 0;
                    c++;
                }
                if (s->slc[d * nh + j] != c) ok = 0;
                pos += c;
                rows += c;
            }
            if (s->sc[d] != rows) ok = 0;
            if (capmode && (rows > cap || rows != (n_sd[i][d] < cap ? n_sd[i][d] : cap))) ok = 0;
        }
        for (int q = 0; q < n; q++)
            if (!s->keep[q] && s->sp[q] != -1) ok = 0;
        if (!capmode) CHECKF(s->so[ep] == n, "ep rank %d: total %d, want %d", i, s->so[ep], n);
        CHECKF(ok, "ep rank %d: send layout (offsets, counts, send_pos) differs from destination, slot, (t,k) "
                   "order", i);

        /* fill the send buffer (with a poisoned guard past its end) */
        const int rows = capmode ? ep * cap : s->so[ep];
        s->sbuf = falloc((size_t)(rows + 4) * W);
        for (int q = 0; q < n; q++)
            if (s->sp[q] >= 0 && s->sp[q] < rows) copy_rows(s->sbuf, s->sp[q], s->x, q / K, 1);
        CHECKF(rows_poisoned(s->sbuf, rows, 4), "ep rank %d: written past the send buffer", i);
        int filled = 1;
        for (int r = 0; r < rows && !capmode; r++) filled &= !rows_poisoned(s->sbuf, r, 1);
        CHECKF(filled, "ep rank %d: a send row left unwritten in exact mode", i);
        s->ret_rows = rows;
        s->ret = falloc((size_t)(rows + 4) * W);
    }
    if (mode == M_CAP_TIGHT) return;   /* overflow without the policy: nothing may be sent */
    recv_t rx[8];

    /* ---- each receiver: counts arrive, rows arrive, experts run, results leave */
    for (int j = 0; j < ep; j++) {
        const int *held = mp->ranks[peers[j]].held;
        if (mp->ranks[peers[j]].ep_rank != j || mp->ranks[peers[j]].ep_group != grp) CHECKF(0, "peer %d", j);
        int *rcnt = ialloc((size_t)ep * nh, 0);
        for (int s = 0; s < ep; s++) memcpy(rcnt + s * nh, src[s].slc + j * nh, sizeof(int) * (size_t)nh);
        int *csrc = ialloc((size_t)ep * nh, -1), *cdst = ialloc((size_t)ep * nh, -1);
        int *soff = ialloc((size_t)nh + 1, -1), nt = -1;
        int rc = moe_dispatch_recv_layout(ep, nh, align, rcnt, csrc, cdst, soff, NULL, 0, &nt);
        CHECK(rc == MOE_DISPATCH_OK || rc == MOE_DISPATCH_ESPACE);
        moe_dispatch_tile_t *tiles = talloc(sizeof *tiles * (size_t)(nt + 1));
        rc = moe_dispatch_recv_layout(ep, nh, align, rcnt, csrc, cdst, soff, tiles, nt, &nt);
        CHECKF(rc == MOE_DISPATCH_OK, "receiver %d: %s", j, moe_dispatch_status_name(rc));
        if (rc) return;

        /* the layout and the tile table, from the counts alone */
        int row = 0, ti = 0, lay_ok = 1, tiles_ok = 1;
        for (int sl = 0; sl < nh; sl++) {
            int c = 0;
            if (soff[sl] != row || row % align) lay_ok = 0;
            for (int s = 0; s < ep; s++) {
                int before = 0;
                for (int x = 0; x < sl; x++) before += rcnt[s * nh + x];
                if (csrc[s * nh + sl] != before || cdst[s * nh + sl] != row + c) lay_ok = 0;
                if (capmode && before + rcnt[s * nh + sl] > cap) lay_ok = 0;
                c += rcnt[s * nh + sl];
            }
            for (int r = 0; r < c; r += align, ti++)
                if (ti >= nt || tiles[ti].slot != sl || tiles[ti].row_start != row + r ||
                    tiles[ti].rows != (c - r < align ? c - r : align) || tiles[ti].pad != 0)
                    tiles_ok = 0;
            row += (c + align - 1) / align * align;
        }
        CHECKF(lay_ok && soff[nh] == row, "receiver %d: chunk/slot offsets", j);
        CHECKF(tiles_ok && ti == nt, "receiver %d: tile table (%d tiles, want %d)", j, nt, ti);

        /* rows arrive: exact mode straight from each source's send buffer,
         * capacity mode through the fixed [ep, C] buffer */
        const int nrows = soff[nh];
        float *rbuf = falloc((size_t)nrows * W), *obuf = falloc((size_t)nrows * W);
        float *cbuf = capmode ? falloc((size_t)(ep * cap + 4) * W) : NULL;
        if (capmode)
            for (int s = 0; s < ep; s++) copy_rows(cbuf, s * cap, src[s].sbuf, j * cap, cap);
        int overlap = 0;
        for (int s = 0; s < ep; s++)
            for (int sl = 0; sl < nh; sl++) {
                int c = rcnt[s * nh + sl], d = cdst[s * nh + sl];
                if (c == 0) continue;
                if (d < 0 || d + c > nrows || !rows_poisoned(rbuf, d, c)) {
                    overlap = 1;
                    continue;
                }
                if (capmode)
                    copy_rows(rbuf, d, cbuf, s * cap + csrc[s * nh + sl], c);
                else
                    copy_rows(rbuf, d, src[s].sbuf, src[s].so[j] + csrc[s * nh + sl], c);
            }
        CHECKF(!overlap, "receiver %d: chunks overlap or leave the buffer", j);

        /* within a slot: by source rank, then source (t, k) order */
        int order_ok = 1;
        for (int sl = 0; sl < nh; sl++) {
            int r = soff[sl];
            for (int s = 0; s < ep; s++)
                for (int q = 0; q < src[s].T * K; q++) {
                    int g = src[s].idx[q];
                    if (!src[s].keep[q] || mp->owner_ep_rank[g] != j || mp->slot[g] != sl) continue;
                    const float *v = rbuf + (size_t)r * W;
                    if (v[1] != (float)s || v[2] != (float)(q / K) || v[0] != src[s].x[(q / K) * W]) order_ok = 0;
                    r++;
                }
            if (!rows_poisoned(rbuf, r, soff[sl + 1] - r)) order_ok = 0;   /* padding untouched */
        }
        CHECKF(order_ok, "receiver %d: received rows not in slot, source, (t,k) order", j);

        /* the experts: one pass over the tile table, every real row exactly once */
        int *hits = ialloc((size_t)nrows + 1, 0), cover_ok = 1;
        for (int i = 0; i < nt; i++)
            for (int r = tiles[i].row_start; r < tiles[i].row_start + tiles[i].rows; r++) {
                if (r < 0 || r >= nrows) {
                    cover_ok = 0;
                    continue;
                }
                hits[r]++;
                for (int h = 0; h < W; h++)
                    obuf[r * W + h] = rbuf[r * W + h] * 1000.0f + (float)held[tiles[i].slot];
            }
        for (int sl = 0; sl < nh; sl++) {
            int c = 0;
            for (int s = 0; s < ep; s++) c += rcnt[s * nh + sl];
            for (int r = soff[sl]; r < soff[sl + 1]; r++)
                if (hits[r] != (r < soff[sl] + c)) cover_ok = 0;
        }
        CHECKF(cover_ok, "receiver %d: tiles do not cover each received row exactly once", j);

        /* results go back where they came from */
        float *cret = capmode ? falloc((size_t)ep * cap * W) : NULL;
        for (int s = 0; s < ep; s++)
            for (int sl = 0; sl < nh; sl++) {
                int c = rcnt[s * nh + sl], d = cdst[s * nh + sl];
                if (c == 0 || d < 0 || d + c > nrows) continue;
                if (capmode)
                    copy_rows(cret, s * cap + csrc[s * nh + sl], obuf, d, c);
                else
                    copy_rows(src[s].ret, src[s].so[j] + csrc[s * nh + sl], obuf, d, c);
            }
        if (capmode)
            for (int s = 0; s < ep; s++) copy_rows(src[s].ret, j * cap, cret, s * cap, cap);
        rx[j] = (recv_t){rcnt, csrc, cdst, soff, rbuf};
    }

    /* ---- combine on each source, against the routing */
    for (int i = 0; i < ep; i++) {
        src_t *s = &src[i];
        CHECKF(rows_poisoned(s->ret, s->ret_rows, 4), "ep rank %d: written past the return buffer", i);
        float *y = falloc((size_t)s->T * W + 1);
        int rc = moe_dispatch_combine(s->T, K, W, s->w, s->sp, s->ret, s->ret_rows, y);
        CHECKF(rc == MOE_DISPATCH_OK, "ep rank %d: combine %s", i, moe_dispatch_status_name(rc));
        int bad = -1, dropped = 0;
        for (int t = 0; t < s->T && bad < 0; t++)
            for (int h = 0; h < W; h++) {
                float want = 0.0f;
                for (int k = 0; k < K; k++) {
                    int q = t * K + k;
                    if (!s->keep[q]) {
                        dropped += h == 0;
                        continue;
                    }
                    want += s->w[q] * (s->x[t * W + h] * 1000.0f + (float)s->idx[q]);
                }
                if (!(y[t * W + h] == want)) {
                    bad = t;
                    CHECKF(0, "ep rank %d (rank %d) token %d col %d: y = %.9g, want %.9g", i, peers[i], t, h,
                           (double)y[t * W + h], (double)want);
                    break;
                }
            }
        CHECKF(bad < 0 && (dropped == 0 || mode == M_CAP_DROP), "ep rank %d: %d dropped", i, dropped);
    }
    run_backward(mp, grp, K, src, rx); /* every mode that sent (capacity: the kept rows) */
}

typedef struct {
    int E, dp, fsdp, ep, sh;
    const int *order;
    const char *order_name;
} plan_case_t;

static void test_groups(void) {
    static const plan_case_t cases[] = {
        {8, 2, 2, 2, SH_EP_FSDP, order_default, "dp,fsdp,ep"},
        {8, 2, 2, 2, SH_FSDP_EP, order_default, "dp,fsdp,ep"},
        {8, 2, 2, 2, SH_FSDP_EP, order_ep_outer, "ep,dp,fsdp"},
        {16, 1, 1, 2, SH_EP, order_default, "dp,fsdp,ep"},
        {32, 1, 1, 4, SH_EP, order_default, "dp,fsdp,ep"},
        {64, 1, 1, 8, SH_EP, order_default, "dp,fsdp,ep"},
        {32, 1, 2, 4, SH_FSDP_EP, order_default, "dp,fsdp,ep"},
        {32, 1, 2, 4, SH_EP_FSDP, order_default, "dp,fsdp,ep"},
        {64, 2, 1, 4, SH_EP, order_ep_outer, "ep,dp,fsdp"},
    };
    static const int Ks[3] = {1, 2, 4}, aligns[3] = {1, 3, 16};
    int runs = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const plan_case_t *pc = &cases[c];
        moe_spec_t s = make_spec(pc->E, pc->dp, pc->fsdp, pc->ep, pc->order, pc->sh);
        char plan[128], err[512] = "";
        snprintf(plan, sizeof plan, "dp%d fsdp%d ep%d E%d %s order %s", pc->dp, pc->fsdp, pc->ep, pc->E,
                 sh_name[pc->sh], pc->order_name);
        moe_mesh_plan_t mp;
        CASE(plan);
        if (moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0) {
            CHECKF(0, "%s: %s", plan, err);
            continue;
        }
        CHECK(mp.nep_groups == pc->dp * pc->fsdp);
        for (int grp = 0; grp < mp.nep_groups; grp++)
            for (int kind = 0; kind < R_COUNT; kind++)
                for (int ki = 0; ki < 3; ki++)
                    for (int mode = 0; mode < M_COUNT; mode++)
                        for (int ai = 0; ai < 3; ai++) {
                            run_group(&mp, grp, Ks[ki], kind, mode, aligns[ai], plan);
                            tfree_all();
                            runs++;
                        }
        moe_mesh_plan_free(&mp);
    }
    CASE("groups: every case ran");
    CHECK(runs > 0);
}

/* ---- the FSDP gradient reduce-scatter ----------------------------------- */

/* Rank r's gradient of global expert g, element j of tensor i: a small
 * integer (sums stay exact in fp32), different per rank. */
static float grad_value(int r, int g, long long j, int i) {
    uint64_t h = ((uint64_t)r * 1000003u + (uint64_t)g) * 2654435761u + (uint64_t)j * 40503u + (uint64_t)i * 97u + seed;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (float)((int)(h % 2001) - 1000);
}

static void fsdp_grad_case(int E, int dp, int fsdp, int ep, const int *order, int sh, int bias) {
    moe_spec_t s = make_spec(E, dp, fsdp, ep, order, sh);
    s.hidden = 5;
    s.ffn = 3;
    s.ffn_bias = bias;
    char name[160], err[512] = "";
    snprintf(name, sizeof name, "fsdp grads: dp%d fsdp%d ep%d E%d %s%s", dp, fsdp, ep, E, sh_name[sh],
             bias ? " ffn_bias" : "");
    CASE(name);
    moe_mesh_plan_t mp;
    if (moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0) {
        CHECKF(0, "%s", err);
        return;
    }
    const int W = mp.world;
    const long long per[MOE_GRAD_TENSORS] = {2LL * s.ffn * s.hidden, bias ? 2LL * s.ffn : 0, (long long)s.hidden * s.ffn,
                                             bias ? s.hidden : 0};
    moe_grad_part_t *parts = talloc(sizeof *parts * MOE_GRAD_TENSORS * (size_t)W);
    for (int r = 0; r < W; r++) {
        int rc = moe_fsdp_grad_parts(&mp, &s, r, parts + r * MOE_GRAD_TENSORS, err, sizeof err);
        CHECKF(rc == 0, "rank %d: %s", r, err);
        if (rc) {
            moe_mesh_plan_free(&mp);
            return;
        }
    }
    int ops[4] = {0};
    for (int i = 0; i < MOE_GRAD_TENSORS; i++) {
        float **held = talloc(sizeof *held * (size_t)W), **out = talloc(sizeof *out * (size_t)W);
        for (int r = 0; r < W; r++) {
            const moe_grad_part_t *p = &parts[r * MOE_GRAD_TENSORS + i];
            CHECKF(p->op == (per[i] ? p->op : MOE_GRAD_NONE) && p->count == per[i] * mp.nstored &&
                   p->held == per[i] * mp.nheld, "rank %d, %s: op %d, %lld of %lld elements; %lld of %lld expected", r,
                   moe_grad_tensor_names[i], (int)p->op, p->count, p->held, per[i] * mp.nstored, per[i] * mp.nheld);
            ops[p->op]++;
            held[r] = falloc((size_t)p->held);
            out[r] = falloc((size_t)p->count);
            for (int q = 0; q < mp.nheld; q++)
                for (long long j = 0; j < per[i]; j++)
                    held[r][q * per[i] + j] = grad_value(r, mp.ranks[r].held[q], j, i);
        }
        /* the collectives, as NCCL defines them, over each rank's FSDP group */
        for (int r = 0; r < W; r++) {
            const moe_grad_part_t *p = &parts[r * MOE_GRAD_TENSORS + i];
            const moe_mesh_rank_t *rk = &mp.ranks[r];
            for (long long k = 0; k < p->count; k++) {
                float sum = 0;
                if (p->op == MOE_GRAD_COPY)
                    sum = held[r][k];
                for (int f = 0; f < p->group && p->op != MOE_GRAD_COPY; f++)
                    sum += held[rk->fsdp_peers[f]][(p->op == MOE_GRAD_REDUCE_SCATTER ? rk->fsdp_rank * p->count : 0) + k];
                out[r][k] = sum;
            }
        }
        /* expected: per stored expert, Σ over the FSDP peers of their gradient of it, found by expert */
        long long bad = 0, missing = 0;
        for (int r = 0; r < W && per[i]; r++) {
            const moe_mesh_rank_t *rk = &mp.ranks[r];
            for (int q = 0; q < mp.nstored; q++) {
                const int g = rk->stored[q];
                for (long long j = 0; j < per[i]; j++) {
                    float want = 0;
                    for (int f = 0; f < fsdp; f++) {
                        const int peer = rk->fsdp_peers[f];
                        int at = -1;
                        for (int h = 0; h < mp.nheld; h++)
                            if (mp.ranks[peer].held[h] == g)
                                at = h;
                        if (at < 0) {
                            missing++;
                            continue;
                        }
                        want += held[peer][at * per[i] + j];
                    }
                    bad += out[r][q * per[i] + j] != want;
                }
            }
        }
        CHECKF(bad == 0 && missing == 0, "%s: %lld elements differ from the FSDP peers' sum, %lld peer gradients "
               "not held (seed %llu)", moe_grad_tensor_names[i], bad, missing, seed);
    }
    const int want_op = fsdp == 1 ? MOE_GRAD_COPY : mp.nheld > mp.nstored ? MOE_GRAD_REDUCE_SCATTER : MOE_GRAD_ALL_REDUCE;
    CHECKF(ops[want_op] == W * (bias ? 4 : 2) && ops[MOE_GRAD_NONE] == W * (bias ? 0 : 2),
           "the collectives: %d copies, %d reduce-scatters, %d all-reduces, %d absent", ops[MOE_GRAD_COPY],
           ops[MOE_GRAD_REDUCE_SCATTER], ops[MOE_GRAD_ALL_REDUCE], ops[MOE_GRAD_NONE]);
    moe_mesh_plan_free(&mp);
    tfree_all();
}

static void test_fsdp_grads(void) {
    fsdp_grad_case(8, 1, 1, 1, order_default, SH_EP_FSDP, 1);     /* one device: a copy */
    fsdp_grad_case(8, 2, 1, 1, order_default, SH_EP_FSDP, 0);     /* dp only: a copy, the dp sum is the caller's */
    fsdp_grad_case(8, 1, 2, 1, order_default, SH_EP_FSDP, 1);     /* reduce-scatter */
    fsdp_grad_case(8, 2, 2, 1, order_default, SH_EP_FSDP, 1);
    fsdp_grad_case(16, 2, 4, 1, order_ep_outer, SH_FSDP_EP, 0);
    fsdp_grad_case(12, 3, 2, 1, order_default, SH_FSDP, 1);
    fsdp_grad_case(8, 2, 2, 1, order_default, SH_EP, 1);          /* fsdp does not shard: all-reduce */

    /* with EP: an EP rank's FSDP peers hold the same experts (its own EP coordinate) */
    fsdp_grad_case(8, 1, 2, 2, order_default, SH_EP_FSDP, 1);     /* reduce-scatter */
    fsdp_grad_case(16, 2, 2, 2, order_default, SH_FSDP_EP, 1);
    fsdp_grad_case(16, 1, 2, 4, order_ep_outer, SH_EP, 0);        /* fsdp does not shard: all-reduce */
    fsdp_grad_case(8, 1, 1, 2, order_default, SH_EP, 1);          /* ep only: a copy */
}

/* ---- the transfer lists of the rows (moe_ep_row_xfers), bf16 and fp8 -- */

/* Byte i of part `part` of row `row` that EP rank `src` sends to EP rank
 * `dst` (its block's row `row`), as the sender fills it. */
static uint8_t row_byte(int part, int src, int dst, long long row, long long i) {
    return (uint8_t)(part * 101 + src * 37 + dst * 11 + row * 7 + i * 3 + (i >> 8));
}

/* One step's transfers of every rank of an EP group, done in memory as NCCL
 * would: rank r's k-th send to peer q meets q's k-th receive from r, the
 * sizes must agree. The lists hold host addresses. Returns the bytes rank 0
 * sent, or -1 after a failed check. */
static long long xfers_exchange(int P, moe_ep_call_t *const *c) {
    long long sent0 = 0;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < c[r]->nx; i++) {
            const moe_xfer_t *x = &c[r]->x[i];
            if (x->recv)
                continue;
            int nth = 0;
            for (int j = 0; j < i; j++)
                nth += !c[r]->x[j].recv && c[r]->x[j].peer == x->peer;
            const moe_xfer_t *m = NULL;
            for (int j = 0; j < c[x->peer]->nx && !m; j++)
                if (c[x->peer]->x[j].recv && c[x->peer]->x[j].peer == r && nth-- == 0)
                    m = &c[x->peer]->x[j];
            if (!m || m->bytes != x->bytes) {
                CHECKF(0, "ep rank %d sends %zu bytes to ep rank %d, which receives %lld (seed %llu)", r, x->bytes,
                       x->peer, m ? (long long)m->bytes : -1LL, seed);
                return -1;
            }
            memcpy((void *)(uintptr_t)m->ptr, (const void *)(uintptr_t)x->ptr, x->bytes);
            sent0 += r == 0 ? (long long)x->bytes : 0;
        }
    return sent0;
}

/* Every rank of an EP group of spec `text` (its first EP group: the lists
 * do not depend on the others) lists the rows of dispatch step 1 (out) and
 * step 2 (home) over its own workspace in host memory, laid out by
 * moe_ep_ws_layout at its tokens; the lists run in memory. Out: each
 * source's rows land source-major in the receiver's stage, and with fp8
 * weights their scales in stage_sc, every byte as sent; home: the bf16
 * results land back in the source's send buffer at the rows they left
 * from. No byte outside the receiving parts changes. Returns rank 0's
 * bytes out, or -1. */
static long long xfers_case(const char *label, const char *text, int capacity_full) {
    CASE(label);
    moe_spec_t s;
    moe_diag_t d;
    moe_plan_desc_t pd;
    char err[512];
    if (moe_spec_load(&s, "x.moe", text, NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return -1;
    }
    if (moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err)) {
        CHECKF(0, "%s", err);
        return -1;
    }
    const moe_ep_desc_t *ed = moe_plan_ep_desc(&pd);
    const int P = ed->ep, S = ed->nheld, K = s.top_k, C = ed->capacity, fp8 = moe_spec_fp8(&s);
    const long long H = s.hidden, HB = H / 128;
    moe_ep_row_part_t out[MOE_EP_ROW_PARTS], home[MOE_EP_ROW_PARTS];
    const int nout = moe_ep_row_parts(&s, 0, out);
    moe_ep_row_parts(&s, 1, home);
    long long result = -1;
    uint8_t *ws[8] = {0}, *before[8] = {0};
    size_t wsb[8] = {0};
    moe_ws_region_t reg[8][MOE_EW_COUNT];
    CUdeviceptr at[8][MOE_EW_COUNT];
    int T[8];
    long long n[8][8]; /* rows source s sends to destination d */
    moe_ep_call_t *c[8] = {0};
    for (int r = 0; r < P; r++) {
        T[r] = r == P - 1 ? 0 : 1 + rnd_below(s.tokens); /* the last rank's batch is empty */
        const int most = K < S ? K : S;
        long long left = (long long)T[r] * K;
        for (int q = 0; q < P; q++) { /* at most min(K, S) rows a token to one rank, K in all */
            long long v = rnd_below((int)((long long)T[r] * most + 1));
            v = v < left ? v : left;
            if (C)
                v = capacity_full ? C : v < C ? v : C;
            n[r][q] = T[r] ? v : 0;
            left -= n[r][q];
        }
        wsb[r] = moe_ep_ws_layout(ed, &pd, T[r], reg[r]);
        ws[r] = talloc(wsb[r]);
        before[r] = talloc(wsb[r]);
        c[r] = talloc(sizeof *c[r]);
        memset(ws[r], 0xee, wsb[r]);
        for (int i = 0; i < MOE_EW_COUNT; i++)
            at[r][i] = (CUdeviceptr)(uintptr_t)(ws[r] + reg[r][i].offset);
    }
    /* the send side, per destination block (exact: back to back; capacity: C rows each) */
    long long send_rows[8][8], recv_rows[8][8];
    for (int r = 0; r < P; r++)
        for (int q = 0; q < P; q++) {
            send_rows[r][q] = C ? C : n[r][q];
            recv_rows[r][q] = C ? C : n[q][r];
        }
    for (int r = 0; r < P; r++) {
        long long rows = 0, row0 = 0;
        for (int q = 0; q < P; q++)
            rows += send_rows[r][q];
        /* the send buffer's rows fit its regions at this rank's tokens */
        for (int pi = 0; pi < nout; pi++)
            if ((size_t)(rows * out[pi].row_bytes) > reg[r][out[pi].from].bytes) {
                CHECKF(0, "%s: rank %d sends %lld rows past its %s region (seed %llu)", label, r, rows,
                       pi ? "scales" : "rows", seed);
                goto done;
            }
        for (int q = 0; q < P; q++) {
            for (int pi = 0; pi < nout; pi++) {
                uint8_t *base = ws[r] + reg[r][out[pi].from].offset;
                for (long long row = 0; row < send_rows[r][q]; row++)
                    for (long long i = 0; i < out[pi].row_bytes; i++)
                        base[(row0 + row) * out[pi].row_bytes + i] = row_byte(pi, r, q, row, i);
            }
            row0 += send_rows[r][q];
        }
        memcpy(before[r], ws[r], wsb[r]);
        c[r]->nx = 0;
        CHECK(moe_ep_row_xfers(&s, 0, P, at[r], send_rows[r], recv_rows[r], c[r]) == MOE_OK);
        CHECKF(c[r]->nx == 2 * P * nout, "%s: rank %d lists %d transfers, want %d", label, r, c[r]->nx, 2 * P * nout);
    }
    const long long bytes_out = xfers_exchange(P, c);
    if (bytes_out < 0)
        goto done;
    int ok = 1;
    for (int r = 0; r < P && ok; r++) {
        long long row0 = 0;
        for (int q = 0; q < P; q++) { /* source q's block */
            for (int pi = 0; pi < nout; pi++) {
                const moe_ws_region_t *g = &reg[r][out[pi].to];
                const long long rb = out[pi].row_bytes;
                if ((size_t)((row0 + recv_rows[r][q]) * rb) > g->bytes) {
                    CHECKF(0, "%s: rank %d receives past its %s region (seed %llu)", label, r, pi ? "scale" : "row",
                           seed);
                    ok = 0;
                    break;
                }
                for (long long row = 0; row < recv_rows[r][q] && ok; row++)
                    for (long long i = 0; i < rb && ok; i++)
                        if (ws[r][g->offset + (row0 + row) * rb + i] != row_byte(pi, q, r, row, i)) {
                            CHECKF(0, "%s: rank %d, part %d, source %d's row %lld, byte %lld differs (seed %llu)",
                                   label, r, pi, q, row, i, seed);
                            ok = 0;
                        }
                /* mark what arrived as expected, for the untouched check below */
                memcpy(before[r] + g->offset + row0 * rb, ws[r] + g->offset + row0 * rb,
                       (size_t)(recv_rows[r][q] * rb));
            }
            row0 += recv_rows[r][q];
        }
        CHECKF(ok && memcmp(before[r], ws[r], wsb[r]) == 0, "%s: rank %d: bytes outside what it received changed "
               "(seed %llu)", label, r, seed);
    }
    /* home: each receiver's results (bf16, 2H a row) in its stage, source-major, back to the sources */
    for (int r = 0; r < P && ok; r++) {
        long long row0 = 0;
        uint8_t *base = ws[r] + reg[r][home[0].from].offset;
        for (int q = 0; q < P; q++)
            row0 += recv_rows[r][q];
        if ((size_t)(row0 * home[0].row_bytes) > reg[r][home[0].from].bytes) {
            CHECKF(0, "%s: rank %d's results do not fit its staging region (seed %llu)", label, r, seed);
            goto done;
        }
        row0 = 0;
        for (int q = 0; q < P; q++) {
            for (long long row = 0; row < recv_rows[r][q]; row++)
                for (long long i = 0; i < home[0].row_bytes; i++)
                    base[(row0 + row) * home[0].row_bytes + i] = row_byte(5, r, q, row, i);
            row0 += recv_rows[r][q];
        }
        memcpy(before[r], ws[r], wsb[r]);
        c[r]->nx = 0;
        CHECK(moe_ep_row_xfers(&s, 1, P, at[r], send_rows[r], recv_rows[r], c[r]) == MOE_OK);
    }
    if (xfers_exchange(P, c) < 0)
        goto done;
    for (int r = 0; r < P && ok; r++) {
        long long row0 = 0;
        const moe_ws_region_t *g = &reg[r][home[0].to];
        const long long rb = home[0].row_bytes;
        for (int q = 0; q < P && ok; q++) { /* what r sent q comes back from q */
            if ((size_t)((row0 + send_rows[r][q]) * rb) > g->bytes) {
                CHECKF(0, "%s: rank %d: results past its send buffer (seed %llu)", label, r, seed);
                goto done;
            }
            for (long long row = 0; row < send_rows[r][q] && ok; row++)
                for (long long i = 0; i < rb && ok; i++)
                    if (ws[r][g->offset + (row0 + row) * rb + i] != row_byte(5, q, r, row, i)) {
                        CHECKF(0, "%s: rank %d, the result of its row %lld to %d, byte %lld differs (seed %llu)",
                               label, r, row, q, i, seed);
                        ok = 0;
                    }
            memcpy(before[r] + g->offset + row0 * rb, ws[r] + g->offset + row0 * rb, (size_t)(send_rows[r][q] * rb));
            row0 += send_rows[r][q];
        }
        CHECKF(ok && memcmp(before[r], ws[r], wsb[r]) == 0, "%s: rank %d: bytes outside its returned rows changed "
               "(seed %llu)", label, r, seed);
    }
    /* what rank 0 sent: its rows times a row's bytes out (H + H/32 with fp8, 2H in bf16) */
    long long rows0 = 0;
    for (int q = 0; q < P; q++)
        rows0 += send_rows[0][q];
    CHECKF(bytes_out == rows0 * (fp8 ? H + 4 * HB : 2 * H) && moe_ep_row_bytes(&s, 0) == (fp8 ? H + 4 * HB : 2 * H),
           "%s: rank 0 sent %lld bytes for %lld rows", label, bytes_out, rows0);
    result = ok ? bytes_out : -1;
done:
    moe_plan_desc_free(&pd);
    tfree_all();
    return result;
}

static void test_row_xfers(void) {
    static const struct {
        const char *name, *mesh;
    } meshes[] = {
        {"ep2", "mesh = { ep = 2 }"},
        {"ep4", "mesh = { ep = 4 }"},
        {"ep8", "mesh = { ep = 8 }"},
        {"dp2 fsdp2 ep2", "mesh = { dp = 2, fsdp = 2, ep = 2 }"},
        {"dp2 fsdp2 ep2 {fsdp,ep}", "mesh = { dp = 2, fsdp = 2, ep = 2, expert_sharding = { 'fsdp', 'ep' } }"},
        {"ep4 capacity", "mesh = { ep = 4 } dispatch = { mode = 'capacity', capacity = 100 }"},
        {"ep2 capacity, channel scales", "mesh = { ep = 2 } dispatch = { mode = 'capacity', capacity = 64 }"},
    };
    for (size_t i = 0; i < sizeof meshes / sizeof *meshes; i++) {
        for (int fp8 = 0; fp8 < 2; fp8++) {
            char text[512], label[256];
            snprintf(text, sizeof text, "name = 'x' experts = 16 top_k = 4 hidden = 256 ffn = 128 tokens = 60 "
                     "arch = { 'sm_90a' } %s %s", meshes[i].mesh,
                     !fp8 ? "" : strstr(meshes[i].name, "channel") ? "quant = { weights = 'fp8_e4m3', scaling = 'channel' }"
                                                                   : "quant = { weights = 'fp8_e4m3' }");
            snprintf(label, sizeof label, "row transfers, %s, %s, seed %llu", meshes[i].name, fp8 ? "fp8" : "bf16",
                     seed);
            xfers_case(label, text, strstr(meshes[i].name, "capacity") != NULL);
        }
    }
    CASE("row transfers: more than MOE_XFER_MAX in a step is refused, nothing listed");
    moe_spec_t s;
    moe_diag_t d;
    if (moe_spec_load(&s, "x.moe", "name = 'x' experts = 16 top_k = 4 hidden = 256 ffn = 128 arch = { 'sm_90a' } "
                      "quant = { weights = 'fp8_e4m3' }", NULL, 0, &d)) {
        CHECKF(0, "%s", d.msg);
        return;
    }
    enum { BIG = MOE_XFER_MAX / 4 + 1 }; /* fp8: 2 parts, a send and a receive each, per peer */
    long long *rows = talloc(sizeof(long long) * BIG);
    for (int i = 0; i < BIG; i++)
        rows[i] = 1;
    CUdeviceptr reg[MOE_EW_COUNT] = {0};
    moe_ep_call_t *c = talloc(sizeof *c);
    c->nx = 0;
    CHECK(moe_ep_row_xfers(&s, 0, BIG, reg, rows, rows, c) == MOE_ERR_UNSUPPORTED && c->nx == 0);
    CHECK(moe_ep_row_xfers(&s, 1, BIG, reg, rows, rows, c) == MOE_OK && c->nx == 2 * BIG); /* home: one part */
    tfree_all();
}

int main(void) {
    const char *env = getenv("MOEGEN_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : (unsigned long long)time(NULL) ^ ((unsigned long long)clock() << 20);
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    test_golden_send();
    test_golden_recv();
    test_errors();
    test_combine_order();
    test_groups();
    test_fsdp_grads();
    test_row_xfers();
    return check_report("test_dispatch");
}
