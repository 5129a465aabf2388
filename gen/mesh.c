/* mesh.c — the mesh planner: ranks, groups, expert ownership, routing, and
 * the plan-time check that proves routing uses the right weights.
 *
 * Layout rules (docs/DESIGN.md, "Mesh, ownership and the plan-time check"):
 * - global rank = row-major index of the coordinates in mesh order;
 * - EP group = ranks that differ only in ep; its index is the row-major index
 *   of the other coordinates (all of them) in mesh order; FSDP likewise;
 * - shard = row-major index of the coordinates of the expert_sharding axes,
 *   first axis major; a rank stores E/nshards consecutive experts of its
 *   shard; an axis not in expert_sharding replicates the experts;
 * - after the FSDP all-gather a rank holds its FSDP peers' stored experts
 *   concatenated in fsdp order when fsdp shards experts; otherwise the gather
 *   is a no-op and it holds what it stores;
 * - routing sends expert g to the EP rank that holds it, at its slot there;
 *   when ep does not shard experts (expert_sharding {"fsdp"}) every EP rank
 *   holds all E experts after the gather, and the owner is the balanced
 *   block rule owner = g*ep/E, slot = g. */
#include "mesh.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESH_WORLD_MAX (1 << 20)

static void mesh_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- text output (moe_buf_t, util.h) ------------------------------------ */

/* The buffer's text (the caller frees), or NULL after an allocation
 * failure. */
static char *buf_finish(moe_buf_t *b) {
    if (!b->failed && !b->data)
        moe_buf_printf(b, "%s", "");
    if (b->failed) {
        moe_buf_free(b);
        return NULL;
    }
    return b->data;
}

/* ---- mesh arithmetic ----------------------------------------------------- */

static int mesh_shards_axis(const moe_mesh_plan_t *mp, int axis) {
    for (int i = 0; i < mp->nsharding; i++)
        if (mp->sharding[i] == axis) return 1;
    return 0;
}

static int mesh_rank_of(const moe_mesh_plan_t *mp, const int *coord) {
    int r = 0;
    for (int i = 0; i < MOE_AXIS_COUNT; i++) {
        int a = mp->order[i];
        r = r * mp->size[a] + coord[a];
    }
    return r;
}

static void mesh_coords_of(const moe_mesh_plan_t *mp, int rank, int *coord) {
    for (int i = MOE_AXIS_COUNT - 1; i >= 0; i--) {
        int a = mp->order[i];
        coord[a] = rank % mp->size[a];
        rank /= mp->size[a];
    }
}

/* Row-major index of the coordinates of every axis but `skip`, mesh order. */
static int mesh_group_of(const moe_mesh_plan_t *mp, const int *coord, int skip) {
    int k = 0;
    for (int i = 0; i < MOE_AXIS_COUNT; i++) {
        int a = mp->order[i];
        if (a != skip) k = k * mp->size[a] + coord[a];
    }
    return k;
}

static int mesh_shard_of(const moe_mesh_plan_t *mp, const int *coord) {
    int s = 0;
    for (int i = 0; i < mp->nsharding; i++) {
        int a = mp->sharding[i];
        s = s * mp->size[a] + coord[a];
    }
    return s;
}

/* "ep*fsdp" for the sharding axes, first axis major. */
static const char *mesh_sharding_product(const moe_mesh_plan_t *mp, char *buf, size_t len) {
    buf[0] = '\0';
    for (int i = 0; i < mp->nsharding; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", i ? "*" : "", moe_axis_name(mp->sharding[i]));
    }
    return buf;
}

/* "{"ep", "fsdp"}" as written in a spec. */
static const char *mesh_sharding_set(const moe_mesh_plan_t *mp, char *buf, size_t len) {
    snprintf(buf, len, "{");
    for (int i = 0; i < mp->nsharding; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s\"%s\"", i ? ", " : "", moe_axis_name(mp->sharding[i]));
    }
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "}");
    return buf;
}

/* ---- build --------------------------------------------------------------- */

void moe_mesh_plan_free(moe_mesh_plan_t *mp) {
    if (!mp) return;
    free(mp->ep_groups);
    free(mp->fsdp_groups);
    free(mp->ranks);
    free(mp->owner_ep_rank);
    free(mp->slot);
    free(mp->storage);
    memset(mp, 0, sizeof *mp);
}

/* Copy and validate the mesh part of a spec into mp (no allocation). */
static int mesh_take_spec(moe_mesh_plan_t *mp, const moe_spec_t *spec, char *err, size_t errlen) {
    const moe_mesh_t *m = &spec->mesh;
    long long world = 1;
    for (int a = 0; a < MOE_AXIS_COUNT; a++) {
        if (m->size[a] < 1) {
            mesh_err(err, errlen, "mesh.%s (%d) must be at least 1", moe_axis_name(a), m->size[a]);
            return -1;
        }
        world *= m->size[a];
        if (world > MESH_WORLD_MAX) {
            mesh_err(err, errlen, "mesh world dp*fsdp*ep exceeds %d ranks", MESH_WORLD_MAX);
            return -1;
        }
        mp->size[a] = m->size[a];
    }
    int seen[MOE_AXIS_COUNT] = {0};
    for (int i = 0; i < MOE_AXIS_COUNT; i++) {
        int a = m->order[i];
        if (a < 0 || a >= MOE_AXIS_COUNT || seen[a]) {
            mesh_err(err, errlen, "mesh.order must name each of dp, fsdp, ep exactly once (entry %d is %s)",
                     i + 1, a < 0 || a >= MOE_AXIS_COUNT ? "not an axis" : "a repeat");
            return -1;
        }
        seen[a] = 1;
        mp->order[i] = a;
    }
    if (m->nsharding < 1 || m->nsharding > 2) {
        mesh_err(err, errlen, "mesh.expert_sharding must name 1 or 2 axes (it names %d)", m->nsharding);
        return -1;
    }
    for (int i = 0; i < m->nsharding; i++) {
        int a = m->sharding[i];
        if (a != MOE_AXIS_EP && a != MOE_AXIS_FSDP) {
            mesh_err(err, errlen, "mesh.expert_sharding may name only \"ep\" and \"fsdp\" (entry %d is %s)",
                     i + 1, a == MOE_AXIS_DP ? "\"dp\"" : "not an axis");
            return -1;
        }
        if (i == 1 && a == m->sharding[0]) {
            mesh_err(err, errlen, "mesh.expert_sharding names \"%s\" twice", moe_axis_name(a));
            return -1;
        }
        mp->sharding[i] = a;
    }
    mp->nsharding = m->nsharding;
    mp->world = (int)world;
    mp->experts = spec->experts;
    if (mp->experts < 1) {
        mesh_err(err, errlen, "experts (%d) must be at least 1", mp->experts);
        return -1;
    }
    mp->nshards = 1;
    for (int i = 0; i < mp->nsharding; i++) mp->nshards *= mp->size[mp->sharding[i]];
    if (mp->experts % mp->nshards != 0) {
        char prod[32];
        mesh_err(err, errlen, "experts (%d) is not divisible by %s (%d): expert_sharding splits the experts "
                 "into %d shards; choose experts a multiple of %d or change the mesh",
                 mp->experts, mesh_sharding_product(mp, prod, sizeof prod), mp->nshards,
                 mp->nshards, mp->nshards);
        return -1;
    }
    mp->nstored = mp->experts / mp->nshards;
    mp->nheld = mesh_shards_axis(mp, MOE_AXIS_FSDP) ? mp->nstored * mp->size[MOE_AXIS_FSDP] : mp->nstored;
    mp->nep_groups = mp->world / mp->size[MOE_AXIS_EP];
    mp->nfsdp_groups = mp->world / mp->size[MOE_AXIS_FSDP];
    return 0;
}

static int mesh_find(const int *list, int n, int g) {
    for (int i = 0; i < n; i++)
        if (list[i] == g) return i;
    return -1;
}

int moe_mesh_plan_build(moe_mesh_plan_t *mp, const moe_spec_t *spec, char *err, size_t errlen) {
    memset(mp, 0, sizeof *mp);
    if (mesh_take_spec(mp, spec, err, errlen) != 0) {
        moe_mesh_plan_free(mp);
        return -1;
    }
    const int world = mp->world, E = mp->experts;
    const int ep = mp->size[MOE_AXIS_EP], fsdp = mp->size[MOE_AXIS_FSDP];
    mp->ep_groups = malloc(sizeof(int) * (size_t)world);
    mp->fsdp_groups = malloc(sizeof(int) * (size_t)world);
    mp->ranks = calloc((size_t)world, sizeof *mp->ranks);
    mp->owner_ep_rank = malloc(sizeof(int) * (size_t)E);
    mp->slot = malloc(sizeof(int) * (size_t)E);
    mp->storage = malloc(sizeof(int) * (size_t)world * (size_t)(mp->nstored + mp->nheld));
    if (!mp->ep_groups || !mp->fsdp_groups || !mp->ranks || !mp->owner_ep_rank || !mp->slot || !mp->storage) {
        moe_mesh_plan_free(mp);
        mesh_err(err, errlen, "out of memory planning a mesh of %d ranks and %d experts", world, E);
        return -1;
    }

    /* Coordinates, groups, stored experts. */
    for (int r = 0; r < world; r++) {
        moe_mesh_rank_t *rk = &mp->ranks[r];
        rk->rank = r;
        mesh_coords_of(mp, r, rk->coord);
        rk->ep_rank = rk->coord[MOE_AXIS_EP];
        rk->fsdp_rank = rk->coord[MOE_AXIS_FSDP];
        rk->ep_group = mesh_group_of(mp, rk->coord, MOE_AXIS_EP);
        rk->fsdp_group = mesh_group_of(mp, rk->coord, MOE_AXIS_FSDP);
        mp->ep_groups[rk->ep_group * ep + rk->ep_rank] = r;
        mp->fsdp_groups[rk->fsdp_group * fsdp + rk->fsdp_rank] = r;
        rk->ep_peers = mp->ep_groups + (size_t)rk->ep_group * ep;
        rk->fsdp_peers = mp->fsdp_groups + (size_t)rk->fsdp_group * fsdp;
        rk->stored = mp->storage + (size_t)r * mp->nstored;
        rk->held = mp->storage + (size_t)world * mp->nstored + (size_t)r * mp->nheld;
        int first = mesh_shard_of(mp, rk->coord) * mp->nstored;
        for (int j = 0; j < mp->nstored; j++) rk->stored[j] = first + j;
    }

    /* The FSDP all-gather. */
    int fsdp_shards = mesh_shards_axis(mp, MOE_AXIS_FSDP);
    for (int r = 0; r < world; r++) {
        moe_mesh_rank_t *rk = &mp->ranks[r];
        if (!fsdp_shards) {
            memcpy(rk->held, rk->stored, sizeof(int) * (size_t)mp->nstored);
            continue;
        }
        for (int f = 0; f < fsdp; f++)
            memcpy(rk->held + (size_t)f * mp->nstored, mp->ranks[rk->fsdp_peers[f]].stored,
                   sizeof(int) * (size_t)mp->nstored);
    }

    /* Routing from ownership, read off EP group 0 (the check proves the rest). */
    int ep_shards = mesh_shards_axis(mp, MOE_AXIS_EP);
    for (int g = 0; g < E; g++) {
        int owner = -1, slot = -1;
        if (ep_shards) {
            for (int e = 0; e < ep && owner < 0; e++) {
                int s = mesh_find(mp->ranks[mp->ep_groups[e]].held, mp->nheld, g);
                if (s >= 0) { owner = e; slot = s; }
            }
        } else {
            owner = (int)((long long)g * ep / E);
            slot = mesh_find(mp->ranks[mp->ep_groups[owner]].held, mp->nheld, g);
        }
        mp->owner_ep_rank[g] = owner;
        mp->slot[g] = slot;
    }

    if (moe_mesh_plan_check(mp, err, errlen) != 0) {
        moe_mesh_plan_free(mp);
        return -1;
    }
    return 0;
}

/* ---- check --------------------------------------------------------------- */

/* Check that each group table partitions the world: `axis` is ep or fsdp. */
static int mesh_check_groups(const moe_mesh_plan_t *mp, int axis, int *seen, char *err, size_t errlen) {
    const char *an = moe_axis_name(axis);
    const int n = mp->size[axis];
    const int ngroups = axis == MOE_AXIS_EP ? mp->nep_groups : mp->nfsdp_groups;
    const int *groups = axis == MOE_AXIS_EP ? mp->ep_groups : mp->fsdp_groups;
    if (ngroups * n != mp->world) {
        mesh_err(err, errlen, "%s groups: %d groups of %d ranks do not cover the world of %d: "
                 "there must be world/%s = %d of them", an, ngroups, n, mp->world, an, mp->world / n);
        return -1;
    }
    memset(seen, 0, sizeof(int) * (size_t)mp->world);
    for (int k = 0; k < ngroups; k++) {
        const int *row = groups + (size_t)k * n;
        for (int i = 0; i < n; i++) {
            int m = row[i];
            if (m < 0 || m >= mp->world) {
                mesh_err(err, errlen, "%s group %d lists rank %d at %s rank %d, outside the world 0..%d",
                         an, k, m, an, i, mp->world - 1);
                return -1;
            }
            if (seen[m]) {
                mesh_err(err, errlen, "rank %d is listed in %s group %d and again in %s group %d: "
                         "%s groups must partition the world", m, an, seen[m] - 1, an, k, an);
                return -1;
            }
            seen[m] = k + 1;
            const moe_mesh_rank_t *rk = &mp->ranks[m];
            int gk = axis == MOE_AXIS_EP ? rk->ep_group : rk->fsdp_group;
            if (gk != k || rk->coord[axis] != i) {
                mesh_err(err, errlen, "%s group %d lists rank %d at %s rank %d, but rank %d has %s group %d "
                         "and %s coordinate %d", an, k, m, an, i, m, an, gk, an, rk->coord[axis]);
                return -1;
            }
            for (int a = 0; a < MOE_AXIS_COUNT; a++) {
                if (a != axis && rk->coord[a] != mp->ranks[row[0]].coord[a]) {
                    mesh_err(err, errlen, "%s group %d mixes ranks %d and %d, which differ in %s "
                             "(%d vs %d): %s group members may differ only in %s",
                             an, k, row[0], m, moe_axis_name(a), mp->ranks[row[0]].coord[a],
                             rk->coord[a], an, an);
                    return -1;
                }
            }
        }
    }
    return 0;
}

/* Check one rank's coordinates, group fields, peers and stored experts. */
static int mesh_check_rank(const moe_mesh_plan_t *mp, int r, char *err, size_t errlen) {
    const moe_mesh_rank_t *rk = &mp->ranks[r];
    const int ep = mp->size[MOE_AXIS_EP], fsdp = mp->size[MOE_AXIS_FSDP];
    if (rk->rank != r || !rk->stored || !rk->held) {
        mesh_err(err, errlen, "rank %d: entry says rank %d%s; rebuild the plan", r, rk->rank,
                 rk->stored && rk->held ? "" : " and has no expert lists");
        return -1;
    }
    for (int a = 0; a < MOE_AXIS_COUNT; a++) {
        if (rk->coord[a] < 0 || rk->coord[a] >= mp->size[a]) {
            mesh_err(err, errlen, "rank %d: %s coordinate %d is outside 0..%d",
                     r, moe_axis_name(a), rk->coord[a], mp->size[a] - 1);
            return -1;
        }
    }
    if (mesh_rank_of(mp, rk->coord) != r) {
        mesh_err(err, errlen, "rank %d: its coordinates give global rank %d in mesh order",
                 r, mesh_rank_of(mp, rk->coord));
        return -1;
    }
    if (rk->ep_rank != rk->coord[MOE_AXIS_EP] || rk->fsdp_rank != rk->coord[MOE_AXIS_FSDP]) {
        mesh_err(err, errlen, "rank %d: ep_rank %d / fsdp_rank %d must equal its ep and fsdp coordinates (%d, %d)",
                 r, rk->ep_rank, rk->fsdp_rank, rk->coord[MOE_AXIS_EP], rk->coord[MOE_AXIS_FSDP]);
        return -1;
    }
    int egk = mesh_group_of(mp, rk->coord, MOE_AXIS_EP), fgk = mesh_group_of(mp, rk->coord, MOE_AXIS_FSDP);
    if (rk->ep_group != egk || rk->fsdp_group != fgk) {
        mesh_err(err, errlen, "rank %d: ep group %d / fsdp group %d, but its coordinates give %d / %d",
                 r, rk->ep_group, rk->fsdp_group, egk, fgk);
        return -1;
    }
    for (int e = 0; e < ep; e++) {
        if (!rk->ep_peers || rk->ep_peers[e] != mp->ep_groups[(size_t)egk * ep + e]) {
            mesh_err(err, errlen, "rank %d: ep_peers differ from ep group %d at ep rank %d", r, egk, e);
            return -1;
        }
    }
    for (int f = 0; f < fsdp; f++) {
        if (!rk->fsdp_peers || rk->fsdp_peers[f] != mp->fsdp_groups[(size_t)fgk * fsdp + f]) {
            mesh_err(err, errlen, "rank %d: fsdp_peers differ from fsdp group %d at fsdp rank %d", r, fgk, f);
            return -1;
        }
    }
    int shard = mesh_shard_of(mp, rk->coord), first = shard * mp->nstored;
    for (int j = 0; j < mp->nstored; j++) {
        if (rk->stored[j] != first + j) {
            char set[32];
            mesh_err(err, errlen, "rank %d stores expert %d at position %d, but expert_sharding %s gives it "
                     "shard %d = experts %d..%d: rebuild the plan", r, rk->stored[j], j,
                     mesh_sharding_set(mp, set, sizeof set), shard, first, first + mp->nstored - 1);
            return -1;
        }
    }
    return 0;
}

/* Check one rank's held experts against the gather of its FSDP peers. */
static int mesh_check_gather(const moe_mesh_plan_t *mp, int r, char *err, size_t errlen) {
    const moe_mesh_rank_t *rk = &mp->ranks[r];
    int fsdp_shards = mesh_shards_axis(mp, MOE_AXIS_FSDP);
    for (int s = 0; s < mp->nheld; s++) {
        int src = fsdp_shards ? rk->fsdp_peers[s / mp->nstored] : r;
        int want = mp->ranks[src].stored[s % mp->nstored];
        if (rk->held[s] != want) {
            mesh_err(err, errlen, "rank %d holds expert %d at slot %d after the gather, but %s gives expert %d "
                     "(stored by rank %d): rebuild the plan", r, rk->held[s], s,
                     fsdp_shards ? "the all-gather over its fsdp peers" : "its own stored experts (no fsdp sharding)",
                     want, src);
            return -1;
        }
    }
    return 0;
}

/* Where expert g sits in EP group k: the first (ep rank, slot), or -1. */
static int mesh_locate(const moe_mesh_plan_t *mp, int k, int g, int *slot) {
    const int ep = mp->size[MOE_AXIS_EP];
    for (int e = 0; e < ep; e++) {
        int s = mesh_find(mp->ranks[mp->ep_groups[(size_t)k * ep + e]].held, mp->nheld, g);
        if (s >= 0) { *slot = s; return e; }
    }
    return -1;
}

/* "set slot[4] = 2" or "set owner_ep_rank[4] = 1 and slot[4] = 0". */
static void mesh_fix(char *buf, size_t len, int g, int owner, int loc_owner, int loc_slot) {
    if (owner == loc_owner)
        snprintf(buf, len, "set slot[%d] = %d", g, loc_slot);
    else
        snprintf(buf, len, "set owner_ep_rank[%d] = %d and slot[%d] = %d", g, loc_owner, g, loc_slot);
}

/* Check expert g's routing in EP group k, where `holders` of its ranks hold g
 * after the gather (the first one `first`). */
static int mesh_check_expert(const moe_mesh_plan_t *mp, int k, int g, int holders, int first, char *err,
                             size_t errlen) {
    const int ep = mp->size[MOE_AXIS_EP];
    const int *peers = mp->ep_groups + (size_t)k * ep;
    const int owner = mp->owner_ep_rank[g], slot = mp->slot[g];
    if (holders == 0) {
        mesh_err(err, errlen, "expert %d: no rank of ep group %d (ranks %d..) holds it after the gather: "
                 "the weights of expert %d are missing; rebuild the plan", g, k, peers[0], g);
        return -1;
    }
    if (mesh_shards_axis(mp, MOE_AXIS_EP) && holders > 1) {
        mesh_err(err, errlen, "expert %d: %d ranks of ep group %d hold it after the gather (first rank %d), "
                 "but with ep in expert_sharding exactly one may own it; rebuild the plan", g, holders, k, first);
        return -1;
    }
    const int owner_ok = owner >= 0 && owner < ep, slot_ok = slot >= 0 && slot < mp->nheld;
    if (owner_ok && slot_ok && mp->ranks[peers[owner]].held[slot] == g)
        return 0;   /* the common case: the fix-it below is built only for an error */
    int loc_slot = -1, loc_owner = mesh_locate(mp, k, g, &loc_slot);
    char fix[96];
    mesh_fix(fix, sizeof fix, g, owner, loc_owner, loc_slot);
    if (!owner_ok) {
        mesh_err(err, errlen, "expert %d: routing sends it to ep rank %d, outside 0..%d (ep = %d); "
                 "in ep group %d it is held by rank %d (ep rank %d) at slot %d: %s",
                 g, owner, ep - 1, ep, k, peers[loc_owner], loc_owner, loc_slot, fix);
        return -1;
    }
    const int r = peers[owner];
    if (!slot_ok)
        mesh_err(err, errlen, "rank %d (ep group %d, ep rank %d): routing sends expert %d to slot %d, "
                 "but rank %d holds %d experts after the gather (slots 0..%d); expert %d is at ep rank %d, "
                 "slot %d: %s", r, k, owner, g, slot, r, mp->nheld, mp->nheld - 1, g, loc_owner, loc_slot, fix);
    else
        mesh_err(err, errlen, "rank %d (ep group %d, ep rank %d): routing sends expert %d to slot %d, "
                 "which holds expert %d after the gather; expert %d is at ep rank %d, slot %d: %s",
                 r, k, owner, g, slot, mp->ranks[r].held[slot], g, loc_owner, loc_slot, fix);
    return -1;
}

/* Check the routing table in every EP group: per group, one pass over its
 * ranks' held lists counts each expert's holders (the lists are distinct
 * experts in range once mesh_check_gather passed), then every expert is
 * checked, so the cost is groups x (ep x held + experts), not its product
 * with the experts (a 4096 x 4 mesh of 512 experts took 24 s under ASan). */
static int mesh_check_routing(const moe_mesh_plan_t *mp, char *err, size_t errlen) {
    const int ep = mp->size[MOE_AXIS_EP], E = mp->experts;
    int *holders = malloc(sizeof(int) * 2 * (size_t)E);
    if (!holders) {
        mesh_err(err, errlen, "out of memory checking the routing of %d experts", E);
        return -1;
    }
    int *first = holders + E, rc = 0;
    for (int k = 0; rc == 0 && k < mp->nep_groups; k++) {
        const int *peers = mp->ep_groups + (size_t)k * ep;
        for (int g = 0; g < E; g++) {
            holders[g] = 0;
            first[g] = -1;
        }
        for (int e = 0; e < ep; e++)
            for (int s = 0; s < mp->nheld; s++) {
                const int g = mp->ranks[peers[e]].held[s];
                if (g >= 0 && g < E && holders[g]++ == 0)
                    first[g] = peers[e];
            }
        for (int g = 0; rc == 0 && g < E; g++)
            rc = mesh_check_expert(mp, k, g, holders[g], first[g], err, errlen);
    }
    free(holders);
    return rc;
}

int moe_mesh_plan_check(const moe_mesh_plan_t *mp, char *err, size_t errlen) {
    if (!mp || !mp->ranks || !mp->ep_groups || !mp->fsdp_groups || !mp->owner_ep_rank || !mp->slot) {
        mesh_err(err, errlen, "mesh plan is empty: build it with moe_mesh_plan_build()");
        return -1;
    }
    long long world = 1, nshards = 1;
    for (int a = 0; a < MOE_AXIS_COUNT; a++) {
        if (mp->size[a] < 1) {
            mesh_err(err, errlen, "mesh plan: %s size %d must be at least 1", moe_axis_name(a), mp->size[a]);
            return -1;
        }
        world *= mp->size[a];
    }
    for (int i = 0; i < mp->nsharding; i++) nshards *= mp->size[mp->sharding[i]];
    int nheld = mesh_shards_axis(mp, MOE_AXIS_FSDP) ? mp->nstored * mp->size[MOE_AXIS_FSDP] : mp->nstored;
    if (world != mp->world || nshards != mp->nshards || (long long)mp->nstored * nshards != mp->experts ||
        mp->nheld != nheld) {
        mesh_err(err, errlen, "mesh plan: world %d, %d shards of %d experts, %d held per rank do not match "
                 "dp*fsdp*ep = %lld, %lld shards, %d experts; rebuild the plan",
                 mp->world, mp->nshards, mp->nstored, mp->nheld, world, nshards, mp->experts);
        return -1;
    }
    for (int r = 0; r < mp->world; r++)
        if (mesh_check_rank(mp, r, err, errlen) != 0) return -1;
    int *seen = malloc(sizeof(int) * (size_t)mp->world);
    if (!seen) {
        mesh_err(err, errlen, "out of memory checking a mesh of %d ranks", mp->world);
        return -1;
    }
    int rc = mesh_check_groups(mp, MOE_AXIS_EP, seen, err, errlen);
    if (rc == 0) rc = mesh_check_groups(mp, MOE_AXIS_FSDP, seen, err, errlen);
    free(seen);
    if (rc != 0) return -1;
    for (int r = 0; r < mp->world; r++)
        if (mesh_check_gather(mp, r, err, errlen) != 0) return -1;
    return mesh_check_routing(mp, err, errlen);
}

/* ---- printing ------------------------------------------------------------ */

/* A list as runs: "0-1,4-5"; "-" when empty. */
static void buf_runs(moe_buf_t *out, const int *v, int n) {
    if (n == 0) { moe_buf_printf(out, "-"); return; }
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
        moe_buf_printf(out, "%s%d", i ? "," : "", v[i]);
        if (j > i) moe_buf_printf(out, "-%d", v[j]);
        i = j + 1;
    }
}

/* A JSON array: "[0, 1, 4, 5]". */
static void buf_json_list(moe_buf_t *out, const int *v, int n) {
    moe_buf_printf(out, "[");
    for (int i = 0; i < n; i++) moe_buf_printf(out, "%s%d", i ? ", " : "", v[i]);
    moe_buf_printf(out, "]");
}

enum { MESH_COL_RANK, MESH_COL_C0, MESH_COL_C1, MESH_COL_C2, MESH_COL_EPG, MESH_COL_EPR,
       MESH_COL_EPP, MESH_COL_FSP, MESH_COL_ST, MESH_COL_HELD, MESH_NCOL };

/* Format one rank's cells into cells[] (each reset first). */
static void mesh_rank_cells(const moe_mesh_plan_t *mp, int r, moe_buf_t *cells) {
    const moe_mesh_rank_t *rk = &mp->ranks[r];
    for (int c = 0; c < MESH_NCOL; c++) {
        cells[c].len = 0;
        if (cells[c].data) cells[c].data[0] = '\0';
    }
    moe_buf_printf(&cells[MESH_COL_RANK], "%d", r);
    for (int i = 0; i < MOE_AXIS_COUNT; i++) moe_buf_printf(&cells[MESH_COL_C0 + i], "%d", rk->coord[mp->order[i]]);
    moe_buf_printf(&cells[MESH_COL_EPG], "%d", rk->ep_group);
    moe_buf_printf(&cells[MESH_COL_EPR], "%d", rk->ep_rank);
    buf_runs(&cells[MESH_COL_EPP], rk->ep_peers, mp->size[MOE_AXIS_EP]);
    buf_runs(&cells[MESH_COL_FSP], rk->fsdp_peers, mp->size[MOE_AXIS_FSDP]);
    buf_runs(&cells[MESH_COL_ST], rk->stored, mp->nstored);
    buf_runs(&cells[MESH_COL_HELD], rk->held, mp->nheld);
}

char *moe_mesh_plan_table(const moe_mesh_plan_t *mp, int rank) {
    if (!mp || !mp->ranks || rank < -1 || rank >= mp->world) return NULL;
    moe_buf_t out = {0};
    moe_buf_t cells[MESH_NCOL] = {{0}};
    const char *head[MESH_NCOL] = {"rank", moe_axis_name(mp->order[0]), moe_axis_name(mp->order[1]),
                                   moe_axis_name(mp->order[2]), "ep_group", "ep_rank", "ep_peers",
                                   "fsdp_peers", "stored", "after_gather"};
    const int left[MESH_NCOL] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    char set[32];

    moe_buf_printf(&out, "mesh: %s=%d %s=%d %s=%d (outermost first), world %d\n",
              moe_axis_name(mp->order[0]), mp->size[mp->order[0]], moe_axis_name(mp->order[1]),
              mp->size[mp->order[1]], moe_axis_name(mp->order[2]), mp->size[mp->order[2]], mp->world);
    moe_buf_printf(&out, "experts: %d, expert_sharding %s: %d shards of %d, %d per rank after the fsdp gather%s\n",
              mp->experts, mesh_sharding_set(mp, set, sizeof set), mp->nshards, mp->nstored, mp->nheld,
              mesh_shards_axis(mp, MOE_AXIS_FSDP) || mp->size[MOE_AXIS_FSDP] == 1 ? "" : " (gather is a no-op)");
    const int ep = mp->size[MOE_AXIS_EP], fsdp = mp->size[MOE_AXIS_FSDP];
    moe_buf_printf(&out, "ep groups (%d):", mp->nep_groups);
    for (int k = 0; k < mp->nep_groups; k++) {
        moe_buf_printf(&out, " [");
        buf_runs(&out, mp->ep_groups + (size_t)k * ep, ep);
        moe_buf_printf(&out, "]");
    }
    moe_buf_printf(&out, "\nfsdp groups (%d):", mp->nfsdp_groups);
    for (int k = 0; k < mp->nfsdp_groups; k++) {
        moe_buf_printf(&out, " [");
        buf_runs(&out, mp->fsdp_groups + (size_t)k * fsdp, fsdp);
        moe_buf_printf(&out, "]");
    }
    moe_buf_printf(&out, "\n\n");

    int lo = rank < 0 ? 0 : rank, hi = rank < 0 ? mp->world : rank + 1;
    size_t width[MESH_NCOL];
    for (int c = 0; c < MESH_NCOL; c++) width[c] = strlen(head[c]);
    for (int r = lo; r < hi; r++) {
        mesh_rank_cells(mp, r, cells);
        for (int c = 0; c < MESH_NCOL; c++)
            if (cells[c].len > width[c]) width[c] = cells[c].len;
    }
    for (int c = 0; c < MESH_NCOL; c++)
        moe_buf_printf(&out, "%s%-*s", c ? "  " : "", c == MESH_NCOL - 1 ? 0 : (int)width[c], head[c]);
    moe_buf_printf(&out, "\n");
    for (int r = lo; r < hi; r++) {
        mesh_rank_cells(mp, r, cells);
        for (int c = 0; c < MESH_NCOL; c++) {
            const char *s = cells[c].data ? cells[c].data : "";
            if (left[c])
                moe_buf_printf(&out, "%s%-*s", c ? "  " : "", c == MESH_NCOL - 1 ? 0 : (int)width[c], s);
            else
                moe_buf_printf(&out, "%s%*s", c ? "  " : "", (int)width[c], s);
        }
        moe_buf_printf(&out, "\n");
        for (int c = 0; c < MESH_NCOL; c++) out.failed |= cells[c].failed;
    }

    moe_buf_printf(&out, "\nrouting (the same in every ep group):\nexpert  owner_ep_rank  slot\n");
    for (int g = 0; g < mp->experts; g++)
        moe_buf_printf(&out, "%6d  %13d  %4d\n", g, mp->owner_ep_rank[g], mp->slot[g]);
    for (int c = 0; c < MESH_NCOL; c++) free(cells[c].data);
    return buf_finish(&out);
}

char *moe_mesh_plan_json(const moe_mesh_plan_t *mp, int rank) {
    if (!mp || !mp->ranks || rank < -1 || rank >= mp->world) return NULL;
    const int ep = mp->size[MOE_AXIS_EP], fsdp = mp->size[MOE_AXIS_FSDP];
    moe_buf_t out = {0};
    moe_buf_printf(&out, "{\n  \"world\": %d,\n  \"axes\": {", mp->world);
    for (int i = 0; i < MOE_AXIS_COUNT; i++)
        moe_buf_printf(&out, "%s\"%s\": %d", i ? ", " : "", moe_axis_name(mp->order[i]), mp->size[mp->order[i]]);
    moe_buf_printf(&out, "},\n  \"ep_groups\": [");
    for (int k = 0; k < mp->nep_groups; k++) {
        moe_buf_printf(&out, "%s", k ? ", " : "");
        buf_json_list(&out, mp->ep_groups + (size_t)k * ep, ep);
    }
    moe_buf_printf(&out, "],\n  \"fsdp_groups\": [");
    for (int k = 0; k < mp->nfsdp_groups; k++) {
        moe_buf_printf(&out, "%s", k ? ", " : "");
        buf_json_list(&out, mp->fsdp_groups + (size_t)k * fsdp, fsdp);
    }
    moe_buf_printf(&out, "],\n  \"ranks\": [\n");
    int lo = rank < 0 ? 0 : rank, hi = rank < 0 ? mp->world : rank + 1;
    for (int r = lo; r < hi; r++) {
        const moe_mesh_rank_t *rk = &mp->ranks[r];
        moe_buf_printf(&out, "    {\"rank\": %d, \"coords\": {", r);
        for (int i = 0; i < MOE_AXIS_COUNT; i++)
            moe_buf_printf(&out, "%s\"%s\": %d", i ? ", " : "", moe_axis_name(mp->order[i]), rk->coord[mp->order[i]]);
        moe_buf_printf(&out, "}, \"ep_group\": %d, \"ep_rank\": %d, \"ep_peers\": ", rk->ep_group, rk->ep_rank);
        buf_json_list(&out, rk->ep_peers, ep);
        moe_buf_printf(&out, ", \"fsdp_peers\": ");
        buf_json_list(&out, rk->fsdp_peers, fsdp);
        moe_buf_printf(&out, ", \"experts_stored\": ");
        buf_json_list(&out, rk->stored, mp->nstored);
        moe_buf_printf(&out, ", \"experts_after_gather\": ");
        buf_json_list(&out, rk->held, mp->nheld);
        moe_buf_printf(&out, "}%s\n", r + 1 < hi ? "," : "");
    }
    moe_buf_printf(&out, "  ],\n  \"routing\": {\"owner_ep_rank\": ");
    buf_json_list(&out, mp->owner_ep_rank, mp->experts);
    moe_buf_printf(&out, ", \"slot\": ");
    buf_json_list(&out, mp->slot, mp->experts);
    moe_buf_printf(&out, "}\n}\n");
    return buf_finish(&out);
}
