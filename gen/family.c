/* family.c — the family table, the kernel builder, the Lua setters. */
#include "family.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>

/* one descriptor per family, each in its own file */
extern const moe_family_t moe_family_route, moe_family_permute_plan, moe_family_permute_scatter,
    moe_family_gemm_up, moe_family_gemm_down, moe_family_combine, moe_family_ep_send_plan, moe_family_ep_scatter,
    moe_family_ep_recv_plan, moe_family_ep_rows, moe_family_swiglu, moe_family_pack, moe_family_bwd_dys,
    moe_family_bwd_router, moe_family_bwd_dx, moe_family_bwd_dwr, moe_family_bwd_colsum,
    moe_family_bwd_unpack, moe_family_bwd_accum, moe_family_bwd_slot_rows, moe_family_bwd_escale,
    moe_family_dgrad_down, moe_family_dgrad_up, moe_family_wgrad_up, moe_family_wgrad_down;

static const moe_family_t *const table[MOE_FAMILY_COUNT] = {
    [MOE_K_ROUTE] = &moe_family_route,
    [MOE_K_PERMUTE_PLAN] = &moe_family_permute_plan,
    [MOE_K_PERMUTE_SCATTER] = &moe_family_permute_scatter,
    [MOE_K_GEMM_UP] = &moe_family_gemm_up,
    [MOE_K_GEMM_DOWN] = &moe_family_gemm_down,
    [MOE_K_COMBINE] = &moe_family_combine,
    [MOE_K_EP_SEND_PLAN] = &moe_family_ep_send_plan,
    [MOE_K_EP_SCATTER] = &moe_family_ep_scatter,
    [MOE_K_EP_RECV_PLAN] = &moe_family_ep_recv_plan,
    [MOE_K_EP_ROWS] = &moe_family_ep_rows,
    [MOE_K_SWIGLU] = &moe_family_swiglu,
    [MOE_K_PACK] = &moe_family_pack,
    [MOE_K_BWD_DYS] = &moe_family_bwd_dys,
    [MOE_K_BWD_ROUTER] = &moe_family_bwd_router,
    [MOE_K_BWD_DX] = &moe_family_bwd_dx,
    [MOE_K_BWD_DWR] = &moe_family_bwd_dwr,
    [MOE_K_BWD_COLSUM] = &moe_family_bwd_colsum,
    [MOE_K_BWD_UNPACK] = &moe_family_bwd_unpack,
    [MOE_K_BWD_ACCUM] = &moe_family_bwd_accum,
    [MOE_K_BWD_SLOT_ROWS] = &moe_family_bwd_slot_rows,
    [MOE_K_BWD_ESCALE] = &moe_family_bwd_escale,
    [MOE_K_DGRAD_DOWN] = &moe_family_dgrad_down,
    [MOE_K_DGRAD_UP] = &moe_family_dgrad_up,
    [MOE_K_WGRAD_UP] = &moe_family_wgrad_up,
    [MOE_K_WGRAD_DOWN] = &moe_family_wgrad_down,
};

const moe_family_t *moe_family(moe_kfamily_t id) {
    return (unsigned)id < MOE_FAMILY_COUNT ? table[id] : NULL;
}

const moe_family_variant_t *moe_family_variant(const moe_family_t *f, moe_arch_t arch) {
    for (int i = 0; f && i < f->nvariants; i++)
        if (f->variants[i].archs & (1u << arch))
            return &f->variants[i];
    return NULL;
}

int moe_family_build(moe_kernel_desc_t *k, moe_kfamily_t id, const moe_family_ctx_t *c, char *err, size_t errlen) {
    const moe_family_t *f = moe_family(id);
    const moe_family_variant_t *v = moe_family_variant(f, c->arch);
    memset(k, 0, sizeof *k);
    if (!v) {
        snprintf(err, errlen, "kernel family %s has no variant for %s", f ? f->name : "?", moe_arch_name(c->arch));
        return 1;
    }
    k->family = id;
    k->tmpl = v->tmpl;
    if (v->geometry(k, c, err, errlen))
        return 1;
    f->spell(k->name, sizeof k->name, c, k);
    return 0;
}

void moe_family_grid(const moe_kernel_desc_t *k, const moe_spec_t *s, int tokens, long long n, unsigned grid[3]) {
    grid[0] = grid[1] = grid[2] = 1;
    const moe_family_t *f = moe_family(k->family);
    if (f && f->grid)
        f->grid(s, k, tokens, n, grid);
    if (grid[0] == 0)
        grid[0] = 1;
}

size_t moe_ws_layout(moe_ws_region_t *ws, const char *const *names, const size_t *bytes, int n) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        ws[i] = (moe_ws_region_t){names[i], off, bytes[i]};
        off += (bytes[i] + 255) / 256 * 256;
    }
    return off;
}

void moe_lua_set_int(lua_State *L, const char *k, long long v) {
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

void moe_lua_set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

void moe_lua_set_str(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

void moe_lua_set_bool(lua_State *L, const char *k, int v) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}
