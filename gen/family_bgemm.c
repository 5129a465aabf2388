/* family_bgemm.c — the backward grouped GEMMs (issue #19): dgrad_down (with
 * the activation backward in its epilogue), dgrad_up, wgrad_up and
 * wgrad_down, planned when the spec has training = true. mma.sync m16n8k16
 * with a cp.async pipeline on sm_80 (templates/gemm_grad.lua;
 * runtime/bgemm.h has the operands); TMA + wgmma on sm_90a
 * (templates/gemm_sm90.lua: M.dgrad, the forward's kernel with B N-major;
 * M.wgrad, both operands M/N-major along the rows). The tile is the
 * planner's: the dgrads' bm is the plan's row block (their M tiles are the
 * tile table's), the wgrads' bm tiles the weight gradient's rows. */
#include "family.h"
#include "launch_geom.h"
#include "tuning.h"

#include <stdio.h>
#include <string.h>

/* The wgrads read their rows transposed (A M-major), the dgrads K-major. */
static int is_wgrad(moe_kfamily_t f) {
    return f == MOE_K_WGRAD_UP || f == MOE_K_WGRAD_DOWN;
}

int moe_bgemm_smem(const moe_tile_cfg_t *t, int wgrad) {
    const int a_tile = wgrad ? t->bk * (t->bm + 8) * 2 : t->bm * (t->bk + 8) * 2; /* rows padded by 8 halves */
    const int b_tile = t->bk * (t->bn + 8) * 2;
    return t->stages * (a_tile + b_tile);
}

void moe_bgemm_mn(moe_kfamily_t f, long long hidden, long long ffn, long long *M, long long *N) {
    switch (f) {
    case MOE_K_DGRAD_DOWN: *M = 0, *N = ffn; break;
    case MOE_K_DGRAD_UP: *M = 0, *N = hidden; break;
    case MOE_K_WGRAD_UP: *M = 2 * ffn, *N = hidden; break;
    default: *M = hidden, *N = ffn; break;
    }
}

/* the forward's sm_80 tile (moe_gemm_sm80_tile): the wgrads' of a 128-row
 * block, the dgrads' of the plan's row block */
static int geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    k->tile = moe_gemm_sm80_tile(is_wgrad(k->family) ? 128 : c->align);
    k->threads = 32 * k->tile.warps_m * k->tile.warps_n;
    k->smem = moe_bgemm_smem(&k->tile, is_wgrad(k->family));
    return 0;
}

/* sm_90a: the forward's default tile (bm = the row block for the dgrads,
 * 128 for the wgrads; one consumer warpgroup per 64 rows, 256 output
 * columns, bk 64, 4 stages, one CTA per tile); its shared memory is the
 * forward GEMM's (moe_gemm_sm90_smem: dgrad_up stages its output tile in
 * the ring, the others store from registers). dgrad_down, whose epilogue
 * reads U and writes dU (as many bytes as its main loop's operands for
 * K = H), runs with 64-row blocks on the ping-pong grid (each of two
 * consumer warpgroups a whole tile, one's epilogue under the other's main
 * loop): run 48 (H100) measured Mixtral's 2.80 -> 1.91 ms; with 128-row
 * blocks the persistent grid (the producer loading the next tile during the
 * epilogue) was slower than one CTA per tile (Qwen3 0.395 against 0.360 ms),
 * so those keep the tile grid. dgrad_up with 64-row blocks runs the
 * ping-pong too (on the tile grid a 64-row CTA has one consumer warpgroup,
 * and 160 KB of ring keeps it alone on its SM): run 61 (H200) measured
 * Mixtral's 3.14 -> 3.00 ms. The wgrads (128 x 256 tiles of the fp32, or
 * with spec weight_grads = "dtype" the 2-byte, gradient) run on a persistent grid with 3 stages, their output tile
 * staged in shared memory half a tile at a time and stored by TMA, the
 * second half under the next tile's main loop (templates/gemm_sm90.lua,
 * M.wgrad; the launcher flattens their 3D grid onto the SMs): run 56 (H100)
 * measured Mixtral's wgrad_down 2.47 -> 1.98 ms and Qwen3's wgrad_up 0.866
 * -> 0.757 against one CTA per tile storing from registers. */
/* The bytes of a weight gradient's element (spec weight_grads). */
int moe_wgrad_elem_bytes(const moe_spec_t *s) {
    return s->weight_grads == MOE_WGRADS_DTYPE ? 2 : 4;
}

/* The sm_90a wgrad's shared memory: the ring, half the output tile (TMA's
 * staging, two passes; fp32 or the dtype), the mbarriers. */
static int wgrad_sm90_smem(const moe_tile_cfg_t *t, int elem_bytes) {
    return t->stages * (t->bm + t->bn) * t->bk * 2 + t->bm * (t->bn / 2) * elem_bytes + 16 * t->stages;
}

/* threads and shared memory of sm_90a tile k->tile */
static void finish_sm90(moe_kernel_desc_t *k, const moe_family_ctx_t *c) {
    k->threads = 128 * (k->tile.consumers + 1);
    k->smem = is_wgrad(k->family) ? wgrad_sm90_smem(&k->tile, moe_wgrad_elem_bytes(c->spec))
                                  : moe_gemm_sm90_smem(&k->tile, k->tile.bn);
}

int moe_bgemm_sm90_tile_check(moe_kfamily_t f, const moe_tile_cfg_t *t, char *why, size_t n) {
    if (!is_wgrad(f)) /* the forward's kernel with B N-major: the forward's rules */
        return moe_gemm_sm90_tile_check(t, why, n);
    const char *bad = NULL;
    const int launch_cap = 65536 / (128 * (t->consumers + 1)) / 8 * 8, cap = launch_cap < 255 ? launch_cap : 255;
    if (!t->persistent || t->pingpong || t->splitk || t->gemv)
        bad = "the weight gradients run on the persist grid";
    else if (t->bm != 64 && t->bm != 128 && t->bm != 192 && t->bm != 256)
        bad = "bm must be 64, 128, 192 or 256";
    else if (t->consumers != t->bm / 64 && !(t->bm == 256 && t->consumers == 2))
        bad = "consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)";
    else if (t->bk != 64)
        bad = "bk must be 64 (one 128-byte swizzle row)";
    else if (t->bn != 128 && t->bn != 256)
        bad = "a weight gradient's bn must be 128 or 256 (two staging passes of whole 128-byte boxes)";
    else if (t->bm / t->consumers / 64 * t->bn / 2 + 40 > cap) /* the template's accumulators + 40 in the cap */
        bad = "accumulators over the register cap (bm / consumers / 64 x bn / 2 + 40 a thread): bm 192 and 256 (on 2 "
              "consumers) take bn 128";
    else if (t->stages < 2 || wgrad_sm90_smem(t, 4) > 227 * 1024)
        bad = "stages must be >= 2 and fit 227 KB of shared memory with half the output tile in fp32";
    else if (t->group_m < 1 || t->group_m > 64)
        bad = "group_m must be 1..64";
    if (bad)
        snprintf(why, n, "%s", bad);
    return bad != NULL;
}

int moe_bgemm_family(const char *name) {
    for (int i = 0; i < MOE_BGEMM_COUNT; i++)
        if (strcmp(name, moe_family((moe_kfamily_t)(MOE_K_BGEMM_FIRST + i))->name) == 0)
            return MOE_K_BGEMM_FIRST + i;
    return -1;
}

/* A backward entry of the tuning table (ctx btuned, its bm checked against
 * the forward entry's: gen/tuning.c) sets the tile whole. */
static int sm90_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    if (c->btuned) {
        const struct moe_tuning_entry *e = c->btuned;
        k->tile = (moe_tile_cfg_t){.bm = e->bm, .bn = e->bn, .bk = e->bk, .stages = e->stages,
                                   .consumers = e->consumers, .group_m = e->group_m, .persistent = e->persistent,
                                   .pingpong = e->pingpong};
        finish_sm90(k, c);
        return 0;
    }
    const int bm = is_wgrad(k->family) ? 128 : c->align;
    /* a row block of 192 or 256 (a tuned sm_90a tile's) has 3 or 4 consumer warpgroups: bn 128 or 64 keeps their
     * accumulators in the register cap (moe_gemm_sm90_tile_check) */
    const int bn = bm <= 128 ? 256 : bm == 192 ? 128 : 64;
    k->tile = (moe_tile_cfg_t){.bm = bm, .bn = bn, .bk = 64, .stages = 4, .group_m = 8, .consumers = bm / 64};
    if ((k->family == MOE_K_DGRAD_DOWN || k->family == MOE_K_DGRAD_UP) && bm == 64)
        k->tile.consumers = 2, k->tile.persistent = 1, k->tile.pingpong = 1;
    if (is_wgrad(k->family))
        k->tile.persistent = 1, k->tile.stages = 3;
    finish_sm90(k, c);
    return 0;
}

static const char *kind_name(moe_kfamily_t f) {
    return moe_family(f)->name;
}

/* a wgrad that writes the dtype (spec weight_grads = "dtype") ends in _g<dtype> */
static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_tile_cfg_t *t = &k->tile;
    const char *dt = moe_dtype_name(c->spec->dtype);
    const int half = is_wgrad(k->family) && moe_wgrad_elem_bytes(c->spec) == 2;
    if (t->consumers)
        snprintf(out, n, "%s_%s_%s_sm90a_tma_%sm%dn%dk%ds%dc%dg%d%s%s", c->spec->name, kind_name(k->family), dt,
                 t->pingpong ? "pingpong_" : t->persistent ? "persist_" : "", t->bm, t->bn, t->bk, t->stages,
                 t->consumers, t->group_m, half ? "_g" : "", half ? dt : "");
    else
        snprintf(out, n, "%s_%s_%s_m%dn%dk%ds%dw%dx%dg%d%s%s", c->spec->name, kind_name(k->family), dt, t->bm, t->bn,
                 t->bk, t->stages, t->warps_m, t->warps_n, t->group_m, half ? "_g" : "", half ? dt : "");
}

/* dgrads: N tiles x the row tiles n (as the forward GEMMs); wgrads: N tiles
 * x M tiles of the weight gradient x the weight slots */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)tokens;
    long long M, N;
    moe_bgemm_mn(k->family, s->hidden, s->ffn, &M, &N);
    g[0] = moe_blocks(N, k->tile.bn);
    if (is_wgrad(k->family)) {
        g[1] = moe_blocks(M, k->tile.bm);
        g[2] = (unsigned)moe_spec_slots(s);
    } else {
        g[1] = (unsigned)n;
    }
}

static void push(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set) {
    (void)c, (void)set;
    moe_lua_set_str(L, "kind", kind_name(k->family));
    lua_newtable(L);
    moe_lua_set_int(L, "bm", k->tile.bm);
    moe_lua_set_int(L, "bn", k->tile.bn);
    moe_lua_set_int(L, "bk", k->tile.bk);
    moe_lua_set_int(L, "stages", k->tile.stages);
    moe_lua_set_int(L, "warps_m", k->tile.warps_m);
    moe_lua_set_int(L, "warps_n", k->tile.warps_n);
    moe_lua_set_int(L, "group_m", k->tile.group_m);
    moe_lua_set_int(L, "consumers", k->tile.consumers);
    moe_lua_set_int(L, "persistent", k->tile.persistent);
    moe_lua_set_int(L, "pingpong", k->tile.pingpong);
    lua_setfield(L, -2, "tile");
}

static const moe_family_variant_t variants[] = {
    {.archs = 1u << MOE_ARCH_SM80, .tmpl = "gemm_grad", .code = "gemm_grad", .engine = "mma.sync + cp.async",
     .geometry = geometry},
    {.archs = 1u << MOE_ARCH_SM90A, .tmpl = "gemm_grad", .code = "gemm_sm90", .engine = "wgmma + TMA",
     .geometry = sm90_geometry},
};

#define BGEMM(ID, NAME)                                                                                              \
    {.id = ID, .name = NAME, .variants = variants, .nvariants = 2, .spell = spell, .grid = grid, .push = push}

const moe_family_t moe_family_dgrad_down = BGEMM(MOE_K_DGRAD_DOWN, "dgrad_down");
const moe_family_t moe_family_dgrad_up = BGEMM(MOE_K_DGRAD_UP, "dgrad_up");
const moe_family_t moe_family_wgrad_up = BGEMM(MOE_K_WGRAD_UP, "wgrad_up");
const moe_family_t moe_family_wgrad_down = BGEMM(MOE_K_WGRAD_DOWN, "wgrad_down");
