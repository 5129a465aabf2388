/* test_mesh.c — the mesh planner: groups, ownership, routing and the check.
 *
 * Every small mesh is checked against properties computed here, by formulas
 * written independently of gen/mesh.c; the two historical bugs, hand-corrupted
 * plans, error messages and the JSON output are checked against exact goldens.
 * The FSDP gather's parts and transfer lists (runtime/ep.c,
 * moe_ep_gather_xfers) run on the host for every rank of a mesh, bf16 and
 * fp8 (e4m3 weights plus scales), with host buffers standing in for the
 * devices' ("gather: ..." cases). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ep.h"
#include "mesh.h"

#include "mesh_fixture.h"


static int list_eq(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

#define FAIL(...) do { snprintf(why, len, __VA_ARGS__); return 1; } while (0)

/* Properties of a built plan, from the spec alone. 0 when all hold, else 1
 * with the first broken one in why. */
static int mesh_props(const moe_mesh_plan_t *mp, const moe_spec_t *s, int sh, char *why, size_t len) {
    const int dp = s->mesh.size[MOE_AXIS_DP], fsdp = s->mesh.size[MOE_AXIS_FSDP], ep = s->mesh.size[MOE_AXIS_EP];
    const int world = dp * fsdp * ep, E = s->experts;
    const int ep_shards = sh != SH_FSDP, fsdp_shards = sh != SH_EP;
    const int nshards = (ep_shards ? ep : 1) * (fsdp_shards ? fsdp : 1), n = E / nshards;
    if (world > 64 || E > 64) FAIL("mesh_props handles at most 64 ranks and 64 experts");
    if (mp->world != world) FAIL("world %d, want %d", mp->world, world);
    if (mp->nep_groups != world / ep) FAIL("%d ep groups, want world/ep = %d", mp->nep_groups, world / ep);
    if (mp->nfsdp_groups != world / fsdp) FAIL("%d fsdp groups, want %d", mp->nfsdp_groups, world / fsdp);
    if (mp->nstored != n) FAIL("stores %d experts, want %d", mp->nstored, n);

    /* Coordinates: global rank is row-major in mesh order. */
    for (int r = 0; r < world; r++) {
        int c[3], rest = r;
        for (int i = 2; i >= 0; i--) {
            int a = s->mesh.order[i];
            c[a] = rest % s->mesh.size[a];
            rest /= s->mesh.size[a];
        }
        if (!list_eq(c, mp->ranks[r].coord, 3)) FAIL("rank %d coords differ", r);
        if (mp->ranks[r].ep_rank != c[MOE_AXIS_EP]) FAIL("rank %d ep_rank %d", r, mp->ranks[r].ep_rank);
    }

    /* Groups: each partitions the world; members differ only in their axis. */
    for (int pass = 0; pass < 2; pass++) {
        int axis = pass ? MOE_AXIS_FSDP : MOE_AXIS_EP, m = s->mesh.size[axis];
        int ngroups = world / m;
        const int *groups = pass ? mp->fsdp_groups : mp->ep_groups;
        int seen[64] = {0};
        for (int k = 0; k < ngroups; k++) {
            for (int i = 0; i < m; i++) {
                int r = groups[k * m + i];
                if (r < 0 || r >= world || seen[r]) { FAIL("group %d of axis %d: rank %d", k, axis, r); }
                seen[r] = 1;
                const moe_mesh_rank_t *rk = &mp->ranks[r], *r0 = &mp->ranks[groups[k * m]];
                if (rk->coord[axis] != i) { FAIL("group %d member %d has coord %d", k, i, rk->coord[axis]); }
                for (int a = 0; a < 3; a++)
                    if (a != axis && rk->coord[a] != r0->coord[a]) { FAIL("group %d mixes axes", k); }
                const int *peers = pass ? rk->fsdp_peers : rk->ep_peers;
                if ((pass ? rk->fsdp_group : rk->ep_group) != k || !list_eq(peers, groups + k * m, m)) {
                    FAIL("rank %d peers/group differ from group %d", r, k);
                }
            }
        }
    }

    /* Stored experts: consecutive block of the shard. */
    for (int r = 0; r < world; r++) {
        const moe_mesh_rank_t *rk = &mp->ranks[r];
        int e = rk->coord[MOE_AXIS_EP], f = rk->coord[MOE_AXIS_FSDP];
        int shard = sh == SH_EP_FSDP ? e * fsdp + f : sh == SH_FSDP_EP ? f * ep + e : sh == SH_EP ? e : f;
        for (int j = 0; j < n; j++)
            if (rk->stored[j] != shard * n + j) FAIL("rank %d stored[%d] = %d, want %d", r, j, rk->stored[j], shard * n + j);
    }

    /* After the gather: FSDP peers' stored lists in fsdp order, or a no-op. */
    for (int r = 0; r < world; r++) {
        const moe_mesh_rank_t *rk = &mp->ranks[r];
        if (!fsdp_shards) {
            if (mp->nheld != n || !list_eq(rk->held, rk->stored, n)) FAIL("rank %d: gather is not a no-op", r);
            continue;
        }
        if (mp->nheld != n * fsdp) FAIL("holds %d, want %d", mp->nheld, n * fsdp);
        for (int f = 0; f < fsdp; f++)
            if (!list_eq(rk->held + f * n, mp->ranks[rk->fsdp_peers[f]].stored, n)) FAIL("rank %d: gather part %d", r, f);
    }

    /* Each EP group: all experts once each (ep shards), or every member holds
     * all of them (fsdp only); routing lands on the expert. */
    int count[64];
    for (int k = 0; k < world / ep; k++) {
        const int *peers = mp->ep_groups + k * ep;
        memset(count, 0, sizeof(int) * (size_t)E);
        for (int e = 0; e < ep; e++)
            for (int sl = 0; sl < mp->nheld; sl++) {
                int g = mp->ranks[peers[e]].held[sl];
                if (g < 0 || g >= E) FAIL("rank %d holds expert %d", peers[e], g);
                count[g]++;
            }
        for (int g = 0; g < E; g++) {
            int want = ep_shards ? 1 : ep;
            if (count[g] != want) { FAIL("ep group %d holds expert %d %d times, want %d", k, g, count[g], want); }
            int o = mp->owner_ep_rank[g], sl = mp->slot[g];
            if (o < 0 || o >= ep || sl < 0 || sl >= mp->nheld || mp->ranks[peers[o]].held[sl] != g) {
                FAIL("ep group %d: expert %d routes to ep rank %d slot %d, which does not hold it", k, g, o, sl);
            }
        }
    }
    return 0;
}

static void test_sweep(void) {
    static const int orders[6][3] = {
        {MOE_AXIS_DP, MOE_AXIS_FSDP, MOE_AXIS_EP}, {MOE_AXIS_DP, MOE_AXIS_EP, MOE_AXIS_FSDP},
        {MOE_AXIS_FSDP, MOE_AXIS_DP, MOE_AXIS_EP}, {MOE_AXIS_FSDP, MOE_AXIS_EP, MOE_AXIS_DP},
        {MOE_AXIS_EP, MOE_AXIS_DP, MOE_AXIS_FSDP}, {MOE_AXIS_EP, MOE_AXIS_FSDP, MOE_AXIS_DP},
    };
    static const int sizes[3] = {1, 2, 4};
    static const int experts[2] = {16, 32};
    CASE("sweep: dp,fsdp,ep in {1,2,4} x sharding x axis order x experts {16,32}");
    int plans = 0;
    for (int o = 0; o < 6; o++)
    for (int sh = 0; sh < SH_COUNT; sh++)
    for (int a = 0; a < 3; a++) for (int b = 0; b < 3; b++) for (int c = 0; c < 3; c++)
    for (int x = 0; x < 2; x++) {
        moe_spec_t s = make_spec(experts[x], sizes[a], sizes[b], sizes[c], orders[o], sh);
        char label[96], err[512] = "", why[256] = "";
        snprintf(label, sizeof label, "dp%d fsdp%d ep%d E%d %s order %d", sizes[a], sizes[b], sizes[c],
                 experts[x], sh_name[sh], o);
        moe_mesh_plan_t mp;
        int rc = moe_mesh_plan_build(&mp, &s, err, sizeof err);
        CHECKF(rc == 0, "%s: %s", label, err);
        if (rc != 0) continue;
        CHECKF(mesh_props(&mp, &s, sh, why, sizeof why) == 0, "%s: %s", label, why);
        CHECKF(moe_mesh_plan_check(&mp, err, sizeof err) == 0, "%s: %s", label, err);
        moe_mesh_plan_free(&mp);
        plans++;
    }
    CHECK(plans == 6 * SH_COUNT * 27 * 2);
}

/* DP2/FSDP2/EP2, 8 experts: the two historical bugs. */
static void test_historical(void) {
    char err[512] = "";
    moe_mesh_plan_t mp;

    CASE("dp2 fsdp2 ep2: 4 ep groups of 2, counted over dp and fsdp");
    moe_spec_t s = make_spec(8, 2, 2, 2, order_default, SH_FSDP_EP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    CHECK(mp.nep_groups == 4);
    static const int want_ep_groups[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int want_fsdp_groups[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    CHECK(list_eq(mp.ep_groups, want_ep_groups, 8));
    CHECK(mp.nfsdp_groups == 4 && list_eq(mp.fsdp_groups, want_fsdp_groups, 8));

    CASE("dp2 fsdp2 ep2 {fsdp,ep}: ep rank 0 holds 0,1,4,5; expert 4 -> ep rank 0 slot 2");
    static const int held_fe0[4] = {0, 1, 4, 5}, held_fe1[4] = {2, 3, 6, 7};
    CHECK(mp.nheld == 4);
    for (int r = 0; r < 8; r++)
        CHECKF(list_eq(mp.ranks[r].held, mp.ranks[r].ep_rank ? held_fe1 : held_fe0, 4), "rank %d", r);
    CHECK(mp.owner_ep_rank[4] == 0 && mp.slot[4] == 2);
    static const int own_fe[8] = {0, 0, 1, 1, 0, 0, 1, 1}, slot_fe[8] = {0, 1, 0, 1, 2, 3, 2, 3};
    CHECK(list_eq(mp.owner_ep_rank, own_fe, 8) && list_eq(mp.slot, slot_fe, 8));
    moe_mesh_plan_free(&mp);

    CASE("dp2 fsdp2 ep2 {ep,fsdp}: ep rank 0 holds 0,1,2,3");
    s = make_spec(8, 2, 2, 2, order_default, SH_EP_FSDP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    CHECK(mp.nep_groups == 4);
    static const int held_ef0[4] = {0, 1, 2, 3}, held_ef1[4] = {4, 5, 6, 7};
    for (int r = 0; r < 8; r++)
        CHECKF(list_eq(mp.ranks[r].held, mp.ranks[r].ep_rank ? held_ef1 : held_ef0, 4), "rank %d", r);
    CHECK(mp.owner_ep_rank[4] == 1 && mp.slot[4] == 0);
    moe_mesh_plan_free(&mp);
}

/* Plans edited by hand after a good build must be refused. */
static void test_corrupt(void) {
    char err[512];
    moe_mesh_plan_t mp;
    moe_spec_t s = make_spec(8, 2, 2, 2, order_default, SH_FSDP_EP);

    CASE("corrupt: slot of expert 4 set to 4, as if contiguous");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    mp.slot[4] = 4;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "rank 0 (ep group 0, ep rank 0): routing sends expert 4 to slot 4, but rank 0 holds 4 "
                     "experts after the gather (slots 0..3); expert 4 is at ep rank 0, slot 2: set slot[4] = 2");
    moe_mesh_plan_free(&mp);

    CASE("corrupt: the contiguous routing table (owner g/4, slot g%4) under {fsdp,ep}");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    for (int g = 0; g < 8; g++) { mp.owner_ep_rank[g] = g / 4; mp.slot[g] = g % 4; }
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "rank 0 (ep group 0, ep rank 0): routing sends expert 2 to slot 2, which holds expert 4 "
                     "after the gather; expert 2 is at ep rank 1, slot 0: set owner_ep_rank[2] = 1 and slot[2] = 0");
    moe_mesh_plan_free(&mp);

    CASE("corrupt: owner out of range");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    mp.owner_ep_rank[3] = 2;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "expert 3: routing sends it to ep rank 2, outside 0..1 (ep = 2); in ep group 0 it is held "
                     "by rank 1 (ep rank 1) at slot 1: set owner_ep_rank[3] = 1 and slot[3] = 1");
    moe_mesh_plan_free(&mp);

    CASE("corrupt: a held list in the last ep group");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    mp.ranks[6].held[2] = 5;
    mp.ranks[6].held[3] = 4;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "rank 6 holds expert 5 at slot 2 after the gather, but the all-gather over its fsdp peers "
                     "gives expert 4 (stored by rank 6): rebuild the plan");
    moe_mesh_plan_free(&mp);

    CASE("corrupt: ep groups that no longer partition the world");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    mp.ep_groups[3] = 1;   /* group 1 = {2, 1}; rank 3 is in no group */
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "rank 1 is listed in ep group 0 and again in ep group 1: ep groups must partition the world");
    moe_mesh_plan_free(&mp);

    CASE("corrupt: stored experts off the sharding rule");
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0);
    mp.ranks[1].stored[0] = 4;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK_STREQ(err, "rank 1 stores expert 4 at position 0, but expert_sharding {\"fsdp\", \"ep\"} gives it "
                     "shard 1 = experts 2..3: rebuild the plan");
    moe_mesh_plan_free(&mp);

    CASE("check on an empty plan");
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECK(strstr(err, "empty") != NULL);
    moe_mesh_plan_free(&mp);   /* freeing an empty plan is safe */
}

static void test_errors(void) {
    char err[512];
    moe_mesh_plan_t mp;
    moe_spec_t s;

    CASE("error: experts not divisible by ep*fsdp");
    s = make_spec(12, 1, 2, 4, order_default, SH_EP_FSDP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK_STREQ(err, "experts (12) is not divisible by ep*fsdp (8): expert_sharding splits the experts into "
                     "8 shards; choose experts a multiple of 8 or change the mesh");
    CHECK(mp.ranks == NULL);

    CASE("error: experts not divisible by fsdp*ep");
    s = make_spec(12, 1, 2, 4, order_default, SH_FSDP_EP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK(strncmp(err, "experts (12) is not divisible by fsdp*ep (8)", 44) == 0);

    CASE("error: experts not divisible by ep alone");
    s = make_spec(6, 1, 2, 4, order_default, SH_EP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK(strncmp(err, "experts (6) is not divisible by ep (4)", 38) == 0);

    CASE("ok: experts divisible by ep alone (replicated over fsdp)");
    s = make_spec(12, 1, 8, 4, order_default, SH_EP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    moe_mesh_plan_free(&mp);

    CASE("error: zero-sized axis");
    s = make_spec(8, 1, 0, 2, order_default, SH_EP_FSDP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK_STREQ(err, "mesh.fsdp (0) must be at least 1");

    CASE("error: order repeats an axis");
    static const int bad_order[3] = {MOE_AXIS_DP, MOE_AXIS_DP, MOE_AXIS_EP};
    s = make_spec(8, 1, 2, 2, bad_order, SH_EP_FSDP);
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK_STREQ(err, "mesh.order must name each of dp, fsdp, ep exactly once (entry 2 is a repeat)");

    CASE("error: dp in expert_sharding");
    s = make_spec(8, 2, 1, 2, order_default, SH_EP);
    s.mesh.sharding[0] = MOE_AXIS_DP;
    CHECK(moe_mesh_plan_build(&mp, &s, err, sizeof err) != 0);
    CHECK_STREQ(err, "mesh.expert_sharding may name only \"ep\" and \"fsdp\" (entry 1 is \"dp\")");

    CASE("error: NULL err buffer is fine");
    CHECK(moe_mesh_plan_build(&mp, &s, NULL, 0) != 0);
}

/* The single-axis shardings, spelled out. */
static void test_single_axis(void) {
    char err[512];
    moe_mesh_plan_t mp;

    CASE("{ep} with fsdp2: replicated over fsdp, the gather is a no-op");
    moe_spec_t s = make_spec(8, 1, 2, 2, order_default, SH_EP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    CHECK(mp.nstored == 4 && mp.nheld == 4);
    static const int lo[4] = {0, 1, 2, 3}, hi[4] = {4, 5, 6, 7};
    for (int r = 0; r < 4; r++) {
        CHECK(list_eq(mp.ranks[r].stored, mp.ranks[r].ep_rank ? hi : lo, 4));
        CHECK(list_eq(mp.ranks[r].held, mp.ranks[r].stored, 4));
    }
    moe_mesh_plan_free(&mp);

    CASE("{fsdp} with ep4: every ep rank holds all experts, owner = g*ep/E");
    s = make_spec(16, 1, 2, 4, order_default, SH_FSDP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    CHECK(mp.nstored == 8 && mp.nheld == 16);
    for (int r = 0; r < mp.world; r++)
        for (int g = 0; g < 16; g++) CHECK(mp.ranks[r].held[g] == g);
    for (int g = 0; g < 16; g++) CHECK(mp.owner_ep_rank[g] == g / 4 && mp.slot[g] == g);
    /* Any owner is right when weights are replicated over ep; the check agrees. */
    mp.owner_ep_rank[0] = 3;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) == 0);
    mp.slot[0] = 1;
    CHECK(moe_mesh_plan_check(&mp, err, sizeof err) != 0);
    CHECKF(strstr(err, "expert 0") && strstr(err, "rank 3 "), "%s", err);
    moe_mesh_plan_free(&mp);
}

static void test_json(void) {
    char err[512];
    moe_mesh_plan_t mp;
    moe_spec_t s = make_spec(8, 1, 2, 2, order_default, SH_FSDP_EP);

    CASE("json: dp1 fsdp2 ep2, 8 experts, {fsdp,ep}");
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    char *j = moe_mesh_plan_json(&mp, -1);
    CHECK(j != NULL);
    if (j) CHECK_STREQ(j,
        "{\n"
        "  \"world\": 4,\n"
        "  \"axes\": {\"dp\": 1, \"fsdp\": 2, \"ep\": 2},\n"
        "  \"ep_groups\": [[0, 1], [2, 3]],\n"
        "  \"fsdp_groups\": [[0, 2], [1, 3]],\n"
        "  \"ranks\": [\n"
        "    {\"rank\": 0, \"coords\": {\"dp\": 0, \"fsdp\": 0, \"ep\": 0}, \"ep_group\": 0, \"ep_rank\": 0, "
        "\"ep_peers\": [0, 1], \"fsdp_peers\": [0, 2], \"experts_stored\": [0, 1], \"experts_after_gather\": [0, 1, 4, 5]},\n"
        "    {\"rank\": 1, \"coords\": {\"dp\": 0, \"fsdp\": 0, \"ep\": 1}, \"ep_group\": 0, \"ep_rank\": 1, "
        "\"ep_peers\": [0, 1], \"fsdp_peers\": [1, 3], \"experts_stored\": [2, 3], \"experts_after_gather\": [2, 3, 6, 7]},\n"
        "    {\"rank\": 2, \"coords\": {\"dp\": 0, \"fsdp\": 1, \"ep\": 0}, \"ep_group\": 1, \"ep_rank\": 0, "
        "\"ep_peers\": [2, 3], \"fsdp_peers\": [0, 2], \"experts_stored\": [4, 5], \"experts_after_gather\": [0, 1, 4, 5]},\n"
        "    {\"rank\": 3, \"coords\": {\"dp\": 0, \"fsdp\": 1, \"ep\": 1}, \"ep_group\": 1, \"ep_rank\": 1, "
        "\"ep_peers\": [2, 3], \"fsdp_peers\": [1, 3], \"experts_stored\": [6, 7], \"experts_after_gather\": [2, 3, 6, 7]}\n"
        "  ],\n"
        "  \"routing\": {\"owner_ep_rank\": [0, 0, 1, 1, 0, 0, 1, 1], \"slot\": [0, 1, 0, 1, 2, 3, 2, 3]}\n"
        "}\n");
    free(j);

    CASE("json: --rank 3 lists only rank 3");
    j = moe_mesh_plan_json(&mp, 3);
    CHECK(j != NULL);
    if (j) {
        CHECK(strstr(j, "\"rank\": 3,") != NULL);
        CHECK(strstr(j, "\"rank\": 0,") == NULL);
        CHECK(strstr(j, "\"experts_after_gather\": [2, 3, 6, 7]}\n  ],") != NULL);
        CHECK(strstr(j, "\"ep_groups\": [[0, 1], [2, 3]]") != NULL);
    }
    free(j);

    CASE("json and table: rank out of range");
    CHECK(moe_mesh_plan_json(&mp, 4) == NULL);
    CHECK(moe_mesh_plan_json(&mp, -2) == NULL);
    CHECK(moe_mesh_plan_table(&mp, 4) == NULL);

    CASE("table: dp1 fsdp2 ep2, 8 experts, {fsdp,ep}");
    char *t = moe_mesh_plan_table(&mp, -1);
    CHECK(t != NULL);
    if (t) CHECK_STREQ(t,
        "mesh: dp=1 fsdp=2 ep=2 (outermost first), world 4\n"
        "experts: 8, expert_sharding {\"fsdp\", \"ep\"}: 4 shards of 2, 4 per rank after the fsdp gather\n"
        "ep groups (2): [0-1] [2-3]\n"
        "fsdp groups (2): [0,2] [1,3]\n"
        "\n"
        "rank  dp  fsdp  ep  ep_group  ep_rank  ep_peers  fsdp_peers  stored  after_gather\n"
        "   0   0     0   0         0        0  0-1       0,2         0-1     0-1,4-5\n"
        "   1   0     0   1         0        1  0-1       1,3         2-3     2-3,6-7\n"
        "   2   0     1   0         1        0  2-3       0,2         4-5     0-1,4-5\n"
        "   3   0     1   1         1        1  2-3       1,3         6-7     2-3,6-7\n"
        "\n"
        "routing (the same in every ep group):\n"
        "expert  owner_ep_rank  slot\n"
        "     0              0     0\n"
        "     1              0     1\n"
        "     2              1     0\n"
        "     3              1     1\n"
        "     4              0     2\n"
        "     5              0     3\n"
        "     6              1     2\n"
        "     7              1     3\n");
    free(t);

    CASE("table: one rank");
    t = moe_mesh_plan_table(&mp, 2);
    CHECK(t != NULL);
    if (t) {
        CHECK(strstr(t, "   2   0     1   0         1        0  2-3       0,2         4-5     0-1,4-5\n") != NULL);
        CHECK(strstr(t, "\n   0   0 ") == NULL);
    }
    free(t);
    moe_mesh_plan_free(&mp);

    CASE("json: axis order other than the default");
    static const int ord[3] = {MOE_AXIS_EP, MOE_AXIS_DP, MOE_AXIS_FSDP};
    s = make_spec(8, 1, 2, 2, ord, SH_EP_FSDP);
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    j = moe_mesh_plan_json(&mp, 1);
    CHECK(j != NULL);
    if (j) {
        CHECK(strstr(j, "\"axes\": {\"ep\": 2, \"dp\": 1, \"fsdp\": 2}") != NULL);
        CHECK(strstr(j, "\"ep_groups\": [[0, 2], [1, 3]]") != NULL);
        CHECK(strstr(j, "{\"rank\": 1, \"coords\": {\"ep\": 0, \"dp\": 0, \"fsdp\": 1}") != NULL);
    }
    free(j);
    moe_mesh_plan_free(&mp);
}

/* ---- the FSDP gather on the host -------------------------------------------
 *
 * Every rank of a mesh lists its gather (moe_ep_gather_xfers) over host
 * buffers: its stored shard of each part filled with bytes that name the
 * expert, the part and the byte (never zero), its held buffers poisoned.
 * The harness makes each rank's local copy (its shard to its place), then
 * moves every send into the receive it meets (sends to one peer meet that
 * peer's receives in list order, as NCCL matches them), and checks every
 * held slot holds the bytes of the expert the mesh plan says it holds. */

static uint8_t gather_byte(int expert, int part, size_t i) {
    uint32_t h = (uint32_t)expert * 2654435761u ^ (uint32_t)part * 40503u ^ (uint32_t)i * 2246822519u;
    h ^= h >> 15;
    return (uint8_t)(h % 255 + 1);
}

/* The per-expert bytes of each gather part, from the spec alone (0: absent):
 * w1p, b1p, w2, b2, w1s, w2s. */
static void gather_want_bytes(const moe_spec_t *s, size_t want[MOE_GATHER_PARTS]) {
    const size_t H = (size_t)s->hidden, F = (size_t)s->ffn, fp8 = s->quant.weights == MOE_QUANT_FP8_E4M3;
    const int block = s->quant.scaling == MOE_SCALING_BLOCK;
    want[MOE_GATHER_W1P] = (fp8 ? 1 : 2) * 2 * F * H;
    want[MOE_GATHER_B1P] = s->ffn_bias ? 2 * 2 * F : 0;
    want[MOE_GATHER_W2] = (fp8 ? 1 : 2) * H * F;
    want[MOE_GATHER_B2] = s->ffn_bias ? 2 * H : 0;
    want[MOE_GATHER_W1S] = !fp8 ? 0 : block ? 4 * (2 * F / 128) * (H / 128) : 4 * 2 * F;
    want[MOE_GATHER_W2S] = !fp8 ? 0 : block ? 4 * (H / 128) * (F / 128) : 4 * H;
}

/* One mesh, one weight format: 0 when every rank's held buffers come out
 * right, else 1 with the first wrong thing in why. *moved: the bytes rank 0
 * received. */
static int gather_run(const moe_spec_t *s, size_t *moved, char *why, size_t len) {
    moe_mesh_plan_t mp;
    char err[512];
    if (moe_mesh_plan_build(&mp, s, err, sizeof err)) FAIL("mesh: %s", err);
    const int W = mp.world, NS = mp.nstored, NH = mp.nheld;
    size_t want[MOE_GATHER_PARTS];
    gather_want_bytes(s, want);
    int bad = 0;
    uint8_t *stored[64][MOE_GATHER_PARTS] = {{0}}, *held[64][MOE_GATHER_PARTS] = {{0}};
    moe_gather_part_t parts[64][MOE_GATHER_PARTS];
    int nparts[64] = {0};
    moe_ep_call_t **call = calloc((size_t)W, sizeof *call);
    *moved = 0;
#define GFAIL(...) do { if (!bad) snprintf(why, len, __VA_ARGS__); bad = 1; goto done; } while (0)
    if (W > 64) GFAIL("at most 64 ranks");
    for (int r = 0; r < W; r++) {
        call[r] = malloc(sizeof *call[r]);
        for (int p = 0; p < MOE_GATHER_PARTS; p++) {
            if (!want[p])
                continue;
            stored[r][p] = malloc(want[p] * NS);
            held[r][p] = malloc(want[p] * NH);
            memset(held[r][p], 0, want[p] * NH); /* poison: the data is never zero */
            for (int j = 0; j < NS; j++)
                for (size_t i = 0; i < want[p]; i++)
                    stored[r][p][j * want[p] + i] = gather_byte(mp.ranks[r].stored[j], p, i);
        }
        moe_gather_args g = {.stored = {stored[r][0], stored[r][1], stored[r][2], stored[r][3]},
                             .held_w1p = held[r][0], .held_b1p = held[r][1], .held_w2 = held[r][2],
                             .held_b2 = held[r][3], .stored_w1s = (float *)stored[r][4],
                             .stored_w2s = (float *)stored[r][5], .held_w1s = (float *)held[r][4],
                             .held_w2s = (float *)held[r][5]};
        if (moe_ep_gather_xfers(&mp, r, s, &g, parts[r], &nparts[r], call[r]))
            GFAIL("rank %d: %s", r, moe_last_error());
        int n = 0;
        for (int p = 0; p < MOE_GATHER_PARTS; p++) {
            if (!want[p])
                continue;
            const moe_gather_part_t *q = &parts[r][n++];
            if (n > nparts[r] || q->tensor != p || q->expert_bytes != want[p] || q->stride != want[p] * NS ||
                q->src != stored[r][p] || q->base != (CUdeviceptr)(uintptr_t)held[r][p])
                GFAIL("rank %d: part %d is not tensor %d of %zu bytes per expert", r, n - 1, p, want[p]);
        }
        if (n != nparts[r]) GFAIL("rank %d: %d parts, want %d", r, nparts[r], n);
        /* the local copy moe_ep_gather_local makes: the shard to its place */
        const int me = NH > NS ? mp.ranks[r].fsdp_rank : 0;
        for (int i = 0; i < nparts[r]; i++)
            memcpy((uint8_t *)(uintptr_t)parts[r][i].base + parts[r][i].stride * me, parts[r][i].src,
                   parts[r][i].stride);
    }
    for (int r = 0; r < W; r++) {
        const int me = mp.ranks[r].fsdp_rank;
        for (int i = 0; i < call[r]->nx; i++) {
            const moe_xfer_t *x = &call[r]->x[i];
            if (x->recv)
                continue;
            const int q = mp.ranks[r].fsdp_peers[x->peer];
            int nth = 0;
            for (int j = 0; j < i; j++)
                nth += !call[r]->x[j].recv && call[r]->x[j].peer == x->peer;
            const moe_xfer_t *m = NULL;
            for (int j = 0; j < call[q]->nx && !m; j++)
                if (call[q]->x[j].recv && call[q]->x[j].peer == me && nth-- == 0)
                    m = &call[q]->x[j];
            if (!m || m->bytes != x->bytes)
                GFAIL("rank %d sends %zu bytes to rank %d, which receives %lld", r, x->bytes, q,
                      m ? (long long)m->bytes : -1LL);
            memcpy((void *)(uintptr_t)m->ptr, (const void *)(uintptr_t)x->ptr, x->bytes);
            if (q == 0)
                *moved += x->bytes;
        }
    }
    for (int r = 0; r < W; r++)
        for (int p = 0; p < MOE_GATHER_PARTS; p++)
            for (int j = 0; want[p] && j < NH; j++)
                for (size_t i = 0; i < want[p]; i++)
                    if (held[r][p][j * want[p] + i] != gather_byte(mp.ranks[r].held[j], p, i))
                        GFAIL("rank %d: held slot %d of tensor %d, byte %zu is not expert %d's", r, j, p, i,
                              mp.ranks[r].held[j]);
    if (*moved != moe_ep_gather_bytes(&mp, s))
        GFAIL("rank 0 received %zu bytes; moe_ep_gather_bytes says %zu", *moved, moe_ep_gather_bytes(&mp, s));
done:
#undef GFAIL
    for (int r = 0; r < W && r < 64; r++) {
        for (int p = 0; p < MOE_GATHER_PARTS; p++)
            free(stored[r][p]), free(held[r][p]);
        free(call[r]);
    }
    free(call);
    moe_mesh_plan_free(&mp);
    return bad;
}

static void test_gather(void) {
    static const struct {
        const char *name;
        int experts, dp, fsdp, ep, sh;
    } meshes[] = {
        {"fsdp2", 8, 1, 2, 1, SH_EP_FSDP},     {"dp2 fsdp4", 16, 2, 4, 1, SH_EP_FSDP},
        {"fsdp4 {fsdp}", 8, 1, 4, 1, SH_FSDP}, {"dp2 fsdp2 ep2", 8, 2, 2, 2, SH_EP_FSDP},
        {"dp2 fsdp2 ep2 {fsdp,ep}", 8, 2, 2, 2, SH_FSDP_EP},
        {"fsdp2 {ep}: a local copy", 8, 1, 2, 2, SH_EP},
    };
    static const struct {
        const char *name;
        int fp8, scaling, bias;
    } formats[] = {{"bf16", 0, 0, 0}, {"bf16 ffn_bias", 0, 0, 1}, {"fp8 block", 1, MOE_SCALING_BLOCK, 0},
                   {"fp8 channel ffn_bias", 1, MOE_SCALING_CHANNEL, 1}};
    char name[128], why[256];
    for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++) {
        size_t bf16_moved = 0;
        for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
            snprintf(name, sizeof name, "gather: %s, %s", meshes[m].name, formats[f].name);
            CASE(name);
            moe_spec_t s = make_spec(meshes[m].experts, meshes[m].dp, meshes[m].fsdp, meshes[m].ep, order_default,
                                     meshes[m].sh);
            s.quant.weights = formats[f].fp8 ? MOE_QUANT_FP8_E4M3 : MOE_QUANT_NONE;
            s.quant.scaling = formats[f].scaling;
            s.ffn_bias = formats[f].bias;
            size_t moved = 0;
            CHECKF(gather_run(&s, &moved, why, sizeof why) == 0, "%s", why);
            if (f == 0)
                bf16_moved = moved;
            if (f == 2) { /* fp8 block: the e4m3 bytes are half, the scales 1/(128·128·2) of bf16's more */
                size_t want = bf16_moved / 2 + bf16_moved / (2 * 128 * 128 / 4);
                CHECKF(moved == want, "fp8 moves %zu bytes, want %zu (bf16: %zu)", moved, want, bf16_moved);
            }
        }
    }

    CASE("gather: a NULL fp8 scale tensor is named");
    moe_spec_t s = make_spec(8, 1, 2, 1, order_default, SH_EP_FSDP);
    s.quant.weights = MOE_QUANT_FP8_E4M3;
    moe_mesh_plan_t mp;
    char err[512];
    CHECKF(moe_mesh_plan_build(&mp, &s, err, sizeof err) == 0, "%s", err);
    uint8_t a[4], b[4];
    moe_gather_args g = {.stored = {a, NULL, a, NULL}, .held_w1p = b, .held_w2 = b, .stored_w1s = (float *)a,
                         .held_w1s = (float *)b, .stored_w2s = (float *)a};
    moe_gather_part_t parts[MOE_GATHER_PARTS];
    int n = 0;
    CHECK(moe_ep_gather_xfers(&mp, 0, &s, &g, parts, &n, NULL) == MOE_ERR_INVALID_ARG);
    CHECK_STREQ(moe_last_error(), "moe_gather_weights: tensor 5 (w2s) is NULL");
    moe_mesh_plan_free(&mp);
}

int main(void) {
    test_sweep();
    test_historical();
    test_corrupt();
    test_errors();
    test_single_axis();
    test_json();
    test_gather();
    return check_report("test_mesh");
}
