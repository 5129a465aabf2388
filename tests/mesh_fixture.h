/* mesh_fixture.h — a spec with only what the mesh planner reads filled in,
 * for the mesh and dispatch tests. */
#ifndef MOEGEN_MESH_FIXTURE_H
#define MOEGEN_MESH_FIXTURE_H

#include "spec.h"

#include <stdio.h>
#include <string.h>

enum { SH_EP_FSDP, SH_FSDP_EP, SH_EP, SH_FSDP, SH_COUNT };
static const char *const sh_name[SH_COUNT] = {"{ep,fsdp}", "{fsdp,ep}", "{ep}", "{fsdp}"};
static const int order_default[3] = {MOE_AXIS_DP, MOE_AXIS_FSDP, MOE_AXIS_EP};

static moe_spec_t make_spec(int experts, int dp, int fsdp, int ep, const int order[3], int sh) {
    moe_spec_t s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "mesh_fixture");
    s.experts = experts;
    s.top_k = 2;
    s.hidden = 128;
    s.ffn = 256;
    s.tokens = 64;
    s.mesh.size[MOE_AXIS_DP] = dp;
    s.mesh.size[MOE_AXIS_FSDP] = fsdp;
    s.mesh.size[MOE_AXIS_EP] = ep;
    for (int i = 0; i < 3; i++)
        s.mesh.order[i] = order[i];
    switch (sh) {
    case SH_EP_FSDP: s.mesh.nsharding = 2; s.mesh.sharding[0] = MOE_AXIS_EP; s.mesh.sharding[1] = MOE_AXIS_FSDP; break;
    case SH_FSDP_EP: s.mesh.nsharding = 2; s.mesh.sharding[0] = MOE_AXIS_FSDP; s.mesh.sharding[1] = MOE_AXIS_EP; break;
    case SH_EP: s.mesh.nsharding = 1; s.mesh.sharding[0] = MOE_AXIS_EP; break;
    default: s.mesh.nsharding = 1; s.mesh.sharding[0] = MOE_AXIS_FSDP; break;
    }
    return s;
}

#endif
