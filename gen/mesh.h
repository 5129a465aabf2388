/* mesh.h — the device mesh, expert ownership and the routing table.
 *
 * The mesh planner turns a validated spec's mesh (dp, fsdp, ep, axis order,
 * expert_sharding) into plain tables: each global rank's coordinates, its EP
 * and FSDP groups, the experts it stores, the experts it holds after the
 * all-gather over its FSDP group, and the routing table that says, for every
 * global expert, which EP rank holds it and at which local slot
 * (docs/DESIGN.md, "Mesh, ownership and the plan-time check").
 *
 * Nothing assumes contiguity: routing reads the table, and
 * moe_mesh_plan_check() proves the table against the ownership lists. */
#ifndef MOEGEN_MESH_H
#define MOEGEN_MESH_H

#include <stddef.h>

#include "spec.h"

/* One global rank. The peer pointers point into the plan's group tables;
 * stored and held point into the plan's storage. All owned by the plan. */
typedef struct {
    int rank;                       /* global rank: row-major in mesh order */
    int coord[MOE_AXIS_COUNT];      /* indexed by axis id */
    int ep_group;                   /* 0 .. world/ep - 1 */
    int ep_rank;                    /* == coord[MOE_AXIS_EP] */
    int fsdp_group;                 /* 0 .. world/fsdp - 1 */
    int fsdp_rank;                  /* == coord[MOE_AXIS_FSDP] */
    const int *ep_peers;            /* [ep]   global ranks by ep coordinate */
    const int *fsdp_peers;          /* [fsdp] global ranks by fsdp coordinate */
    int *stored;                    /* [nstored] global experts this rank stores */
    int *held;                      /* [nheld] global experts after the gather, by slot */
} moe_mesh_rank_t;

typedef struct moe_mesh_plan {
    int world;                      /* dp * fsdp * ep */
    int experts;                    /* E */
    int size[MOE_AXIS_COUNT];       /* copied from the spec */
    int order[MOE_AXIS_COUNT];
    int nsharding;
    int sharding[2];
    int nshards;                    /* product of the sharding axes' sizes */
    int nstored;                    /* E / nshards */
    int nheld;                      /* nstored * fsdp if fsdp shards experts, else nstored */
    int nep_groups;                 /* world / ep */
    int *ep_groups;                 /* [nep_groups][ep], row k = group k by ep coordinate */
    int nfsdp_groups;               /* world / fsdp */
    int *fsdp_groups;               /* [nfsdp_groups][fsdp] */
    moe_mesh_rank_t *ranks;         /* [world] */
    int *owner_ep_rank;             /* [E] routing: EP rank that holds expert g */
    int *slot;                      /* [E] routing: g's slot on that rank after the gather */
    int *storage;                   /* backs every rank's stored and held */
} moe_mesh_plan_t;

/* Build the mesh plan of a spec into mp (which need not be initialized) and
 * prove it with moe_mesh_plan_check(). Returns 0 on success; the caller frees
 * with moe_mesh_plan_free(). On failure returns non-zero, leaves mp empty
 * (freeing it is safe) and writes a message naming the numbers involved into
 * err (errlen bytes, may be NULL/0). */
int moe_mesh_plan_build(moe_mesh_plan_t *mp, const moe_spec_t *spec, char *err, size_t errlen);

/* Free what a plan owns and reset it to empty. Safe on an empty plan. */
void moe_mesh_plan_free(moe_mesh_plan_t *mp);

/* Prove the plan: the groups partition the world; each rank's coordinates,
 * groups and stored experts follow the mesh and expert_sharding; its held
 * experts are the gather of its FSDP peers' stored experts; and, for every
 * EP group and every expert g, the rank ep_peers[owner_ep_rank[g]] holds g at
 * slot[g], with exactly one holder of g per EP group when ep shards experts.
 * Works on any plan, including a hand-edited one. Returns 0 when it holds;
 * otherwise non-zero and err names the rank, the expert and what to change. */
int moe_mesh_plan_check(const moe_mesh_plan_t *mp, char *err, size_t errlen);

/* A readable text table of the plan: the mesh, the groups, one row per rank
 * (only rank `rank` when rank >= 0; -1 = all) and the routing table.
 * Returns a malloc'd string the caller frees, or NULL when rank is out of
 * range or memory runs out. */
char *moe_mesh_plan_table(const moe_mesh_plan_t *mp, int rank);

/* The plan as one JSON object with keys, in this order: world, axes,
 * ep_groups, fsdp_groups, ranks, routing (docs/mesh.md). With rank >= 0 only
 * that rank appears in "ranks". Deterministic. Returns a malloc'd string the
 * caller frees, or NULL when rank is out of range or memory runs out. */
char *moe_mesh_plan_json(const moe_mesh_plan_t *mp, int rank);

#endif
