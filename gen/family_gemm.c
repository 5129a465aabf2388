/* family_gemm.c — the expert GEMMs: gemm_up_swiglu ([rows, H] x [H, 2F],
 * SwiGLU in the epilogue -> [rows, F]) and gemm_down ([rows, F] x [F, H]),
 * over the tile table. Two variants each: sm_80 mma.sync with a cp.async
 * pipeline (templates/gemm_sm80.lua), sm_90a wgmma with TMA operands
 * (templates/gemm_sm90.lua), whose tile the tuning table may choose. */
#include "family.h"
#include "ep_plan.h"
#include "launch_geom.h"
#include "tuning.h"

#include <stdio.h>
#include <string.h>

/* ---- sm_90a: shared memory and what the template can run -------------- */

/* Shared-memory bytes past which a layout cannot fit any GPU: the sizes
 * below are computed in 64 bits and report 0 ("does not fit") past it, so a
 * tuning entry's out-of-range fields (each up to 4096) never overflow. */
#define SMEM_NEVER (1LL << 30)

int moe_gemm_sm90_smem(const moe_tile_cfg_t *t, int out_cols) {
    const long long ring = (long long)t->stages * (t->bm + t->bn) * t->bk * 2;
    long long smem;
    if (!t->persistent) /* the output tile, all columns in one pass, staged in the ring */
        smem = (long long)t->bm * (out_cols + 8) * 2 <= ring ? ring + 16LL * t->stages : 0;
    else {
        const long long epi_cols = out_cols < 128 ? out_cols : 128;
        const long long staging = (t->bm * (epi_cols + 8) * 2 + 15) / 16 * 16;
        smem = ring + (t->pingpong ? 2 : 1) * staging + 16LL * t->stages; /* pingpong: one per consumer warpgroup */
    }
    return smem > 0 && smem < SMEM_NEVER ? (int)smem : 0;
}

/* The gemv-family grids' checks (templates/gemm_gemv.lua's config holds
 * the same): gemv and gemv3 (bn rows a CTA, stages the K loop's unroll),
 * stream (items of 16 rows, a ring of 2 .. 8 stages). Nonzero with the
 * reason in err, named by the grid ("gemv" for gemv3's common fields). */
static int gemv_check(const moe_tile_cfg_t *t, char *err, size_t errlen) {
    const int stream = moe_tile_stream(t);
    char name[16];
    const char *g = stream ? moe_gemm_sm90_grid_name(t, name) : "gemv";
    if (t->bm != 64 && t->bm != 128)
        return snprintf(err, errlen, "%s: bm (the tile table's row block) must be 64 or 128", g), 1;
    if (stream && t->bn != 16)
        return snprintf(err, errlen, "%s: bn (the weight rows of a work item) must be 16", g), 1;
    if (!stream && t->bn != 8 && t->bn != 16 && t->bn != 32 && t->bn != 64 && t->bn != 128 && t->bn != 256)
        return snprintf(err, errlen, "gemv: bn (the weight rows per CTA) must be 8, 16, 32, 64, 128 or 256"), 1;
    if (t->bk != 64)
        return snprintf(err, errlen, "%s: bk must be 64 (unused by the %s kernels, as the other grids spell it)", g,
                        g), 1;
    if (stream && (t->stages < 2 || t->stages > 8))
        return snprintf(err, errlen, "%s: stages (the ring's stages of 16 rows x up to 1024 columns) must be "
                        "2 .. 8", g), 1;
    if (!stream && t->stages != 1 && t->stages != 2 && t->stages != 4)
        return snprintf(err, errlen, "gemv: stages (the K loop's unroll: 16-byte loads in flight per weight row and "
                        "lane) must be 1, 2 or 4"), 1;
    if (t->consumers != 1 || t->group_m != 1)
        return snprintf(err, errlen, "%s: consumers and group_m must be 1 (no warpgroups, no raster)", g), 1;
    if ((t->gemv == 3 || t->gemv == 6) && (t->bn < 32 || t->stages > 2)) { /* gemv3, gemv4: 3 or 4 CTAs an SM */
        const int three = t->gemv == 3;
        return snprintf(err, errlen, "%s: bn must be 32 .. 256 and stages (the unroll) 1 or 2 (%s CTAs an SM: at "
                        "most %d registers)", three ? "gemv3" : "gemv4", three ? "three" : "four", three ? 80 : 64), 1;
    }
    return 0;
}

int moe_gemm_sm90_tile_check(const moe_tile_cfg_t *t, char *err, size_t errlen) {
    if (t->gemv)
        return gemv_check(t, err, errlen);
    const int smem = moe_gemm_sm90_smem(t, t->bn); /* bn: the down GEMM's output columns, the wider */
    const char *why = NULL;
    if (t->bm != 64 && t->bm != 128 && t->bm != 192 && t->bm != 256)
        why = "bm must be 64, 128, 192 or 256";
    else if (!t->pingpong && t->consumers != t->bm / 64 && !(t->bm == 256 && t->consumers == 2))
        why = "consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)";
    else if (t->pingpong && t->bm > 128)
        why = "pingpong: bm must be 64 or 128 (one warpgroup holds a whole tile)";
    else if (t->bm > 128 && t->bn > (t->bm == 192 || t->consumers == 2 ? 128 : 64))
        why = t->bm == 192         ? "bm 192 (three consumer warpgroups, 512 threads: at most 128 registers) takes bn 64 "
                                     "or 128"
              : t->consumers == 2 ? "bm 256 on two consumer warpgroups (two m64 blocks each, 384 threads: at most 168 "
                                    "registers) takes bn 64 or 128"
                                  : "bm 256 (four consumer warpgroups, 640 threads: at most 96 registers) takes bn 64";
    else if (t->pingpong && (t->consumers != 2 || !t->persistent))
        why = "pingpong: consumers must be 2 (the warpgroups taking alternate tiles), on a persistent grid";
    else if (t->bk != 64)
        why = "bk must be 64 (one 128-byte swizzle row)";
    else if (t->bn < 64 || t->bn > 256 || t->bn % 64)
        why = "bn must be 64, 128, 192 or 256";
    else if (t->persistent && t->bn == 192) /* the template's EPI_COLS = min(out cols, 128) must divide them */
        why = "bn must be 64, 128 or 256 on a persistent grid (the down GEMM's output is staged 128 columns at a "
              "time)";
    else if (t->pingpong && t->bm * t->bn > 128 * 128)
        why = "pingpong: one warpgroup holds a whole tile's accumulators, so bm x bn must be at most 16384 "
              "(64 x 256, 128 x 128)";
    else if (t->stages < 2 || smem == 0 || smem > 227 * 1024)
        why = t->pingpong     ? "stages must be >= 2 and fit 227 KB of shared memory with the two staging tiles"
              : t->persistent ? "stages must be >= 2 and fit 227 KB of shared memory with the epilogue's staging tile"
                              : "stages must be >= 2, fit 227 KB of shared memory and hold the output tile";
    else if (t->group_m < 1 || t->group_m > 64)
        why = "group_m must be 1..64";
    else if (t->splitk && (t->splitk < 2 || t->splitk > 16 || t->persistent))
        why = "splitk: 2..16 CTAs per tile, on the one-CTA-per-tile grid";
    if (why)
        snprintf(err, errlen, "%s", why);
    return why != NULL;
}

/* The row block heuristic. Expert row blocks are short when
 * tokens*top_k/E is small (Qwen3-style many-expert layers), so bm follows
 * the mean rows per expert. A tuning entry's bm overrides it, since both
 * arches share one tile table (the plan's align). */
int moe_gemm_row_block(const moe_spec_t *s, const moe_tuning_entry_t *tuned) {
    if (moe_spec_fp8(s)) /* the fp8 GEMMs' tile (sm90_fp8_geometry): an e4m3 entry's bm, else 64 */
        return tuned ? tuned->bm : 64;
    if (tuned) /* the sm_90a tiles' 64 .. 256 rows (moe_gemm_sm90_tile_check); gemv entries' 64 or 128 */
        return tuned->bm;
    double rows_per_expert = (double)s->tokens * s->top_k / s->experts;
    return rows_per_expert >= 96 ? 128 : 64;
}

/* output columns of one tile: the up GEMM's SwiGLU halves its packed bn */
static int out_cols(const moe_kernel_desc_t *k) {
    return k->family == MOE_K_GEMM_UP ? k->tile.bn / 2 : k->tile.bn;
}

/* ---- sm_80: mma.sync + cp.async ----------------------------------------- */

moe_tile_cfg_t moe_gemm_sm80_tile(int bm) {
    if (bm >= 128) /* 128, or a tuned sm_90a tile's 192 or 256: warps of 64 x 32 */
        return (moe_tile_cfg_t){.bm = bm, .bn = 128, .bk = 32, .stages = 4, .warps_m = bm / 64, .warps_n = 4,
                                .group_m = 8};
    return (moe_tile_cfg_t){.bm = 64, .bn = 128, .bk = 32, .stages = 4, .warps_m = 2, .warps_n = 2, .group_m = 8};
}

/* a configuration that keeps the mma.sync pipeline fed; bm is the plan's */
int moe_gemm_sm80_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    (void)err, (void)errlen;
    k->tile = moe_gemm_sm80_tile(c->align);
    k->threads = 32 * k->tile.warps_m * k->tile.warps_n;
    /* rows padded by 8 elements against bank conflicts */
    k->smem = k->tile.stages * (k->tile.bm + k->tile.bn) * (k->tile.bk + 8) * 2;
    return 0;
}

/* ---- sm_90a: wgmma + TMA -------------------------------------------------- */

/* one producer and bm/64 consumer warpgroups, 128x256x64 tiles for bm 128,
 * one CTA per tile, unless the tuning table has an entry for this shape and
 * token count (which may choose the persistent or the pingpong grid) */
/* The fp8 GEMMs' tile (issue #20): by default one consumer warpgroup of
 * 64 rows, 256 B rows (the up GEMM's 128 output columns are one h
 * quantization block), bk 128 (one scale block, one 128-byte swizzle row of
 * e4m3), 4 stages, one CTA per tile; an e4m3 entry may give two consumers
 * and the persistent grid. Its shared memory: stages * (bm + bn) * bk
 * bytes, the down GEMM's bf16 output staged in the ring; on the persistent
 * grid a staging tile of bm x (128 + 8) halves after the ring (the
 * template's EPI_COLS = 128 output columns a pass for both GEMMs), as the
 * bf16 kernels' (moe_gemm_sm90_smem); the up GEMM, storing from registers,
 * uses that room for its tile's "channel" scales (1 KB per consumer). */
static int fp8_smem(const moe_tile_cfg_t *t) {
    const long long smem = (long long)t->stages * (t->bm + t->bn) * t->bk +
                           (t->persistent ? t->bm * (128LL + 8) * 2 : 0) + 16LL * t->stages;
    return smem > 0 && smem < SMEM_NEVER ? (int)smem : 0;
}

int moe_gemm_sm90_fp8_tile_check(const moe_tile_cfg_t *t, char *err, size_t errlen) {
    const char *why = NULL;
    if (t->gemv) { /* the gemv grid's checks; the up GEMM's cluster (256 / bn CTAs) at most 8 */
        if (gemv_check(t, err, errlen))
            return 1;
        if (t->gemv == 3 || t->gemv == 6 || moe_tile_stream(t))
            why = "fp8 (dtype e4m3): the grid must be gemv, not gemv3, gemv4, stream or chain (bf16 and fp16 weights "
                  "only)";
        else if (t->bn < 32)
            why = "fp8 (dtype e4m3) gemv: bn must be 32, 64, 128 or 256 (the up GEMM's clusters of 256 / bn "
                  "CTAs, at most 8)";
    } else if (t->bk != 128 || t->bn != 256)
        why = "fp8 (dtype e4m3): bk must be 128 (one scale block) and bn 256 (the up GEMM's 128 output columns, "
              "one quantization block)";
    else if ((t->consumers != 1 && t->consumers != 2) || t->bm != 64 * t->consumers)
        why = "fp8 (dtype e4m3): one or two consumer warpgroups of 64 rows each (bm = 64 x consumers)";
    else if (t->pingpong || t->splitk)
        why = "fp8 (dtype e4m3): the grid must be tile (one CTA per tile), persist (one CTA per SM) or gemv";
    else if (t->stages < 2 || fp8_smem(t) == 0 || fp8_smem(t) > 227 * 1024 ||
             t->bm * (t->bn + 8) * 2 > t->stages * (t->bm + t->bn) * t->bk)
        why = "fp8 (dtype e4m3): stages must be >= 2, fit 227 KB of shared memory and hold the down GEMM's output "
              "tile";
    else if (t->group_m < 1 || t->group_m > 64)
        why = "group_m must be 1..64";
    if (why)
        snprintf(err, errlen, "%s", why);
    return why != NULL;
}

static int sm90_fp8_geometry(moe_kernel_desc_t *k, const moe_tuning_entry_t *te) {
    if (te) /* an entry of dtype e4m3 (gen/tuning.c checks it with moe_gemm_sm90_fp8_tile_check) */
        k->tile = (moe_tile_cfg_t){.bm = te->bm, .bn = te->bn, .bk = te->bk, .stages = te->stages,
                                   .group_m = te->group_m, .consumers = te->consumers, .persistent = te->persistent,
                                   .evict = te->evict && k->family == MOE_K_GEMM_UP, .cluster = te->cluster};
    else
        k->tile = (moe_tile_cfg_t){.bm = 64, .bn = 256, .bk = 128, .stages = 4, .group_m = 8, .consumers = 1};
    k->threads = 128 * (k->tile.consumers + 1);
    k->smem = fp8_smem(&k->tile);
    return 0;
}

/* The splits of a GEMM whose tuning entry says splitkS: min(S, its k
 * tiles), so every split has one at least; 0 (the plain tile grid) when
 * that leaves one, and on training and expert-parallel plans, whose
 * backward and dispatch paths run the GEMMs without the split-K
 * workspace. */
static int sm90_splits(const moe_kernel_desc_t *k, const moe_family_ctx_t *c, int want) {
    if (!want || c->spec->training || moe_ep_wanted(c->spec))
        return 0;
    long long K, N;
    moe_gemm_kn(k->family == MOE_K_GEMM_UP, c->spec->hidden, c->spec->ffn, &K, &N);
    const long long kt = moe_blocks(K, k->tile.bk);
    return want <= kt ? want : kt >= 2 ? (int)kt : 0;
}

int moe_gemm_gemv_kc(long long K, int fp8) {
    const long long kc = fp8 ? 2 * MOE_GEMV_KC : MOE_GEMV_KC; /* e4m3: the same 64 KB, one byte an element */
    return K < kc ? (int)K : (int)kc;
}

/* The gemv grid (templates/gemm_gemv.lua): bn weight rows per CTA, the
 * entry's stages the K loop's unroll, 256 threads, 8 rows x KC halves of
 * shared memory (gemv3: 2 rows), then with bn 8 or 16 (warps sharing a group's K) the 8
 * warps' 32 partial sums each (fp32). With fp8 weights (its device_code8,
 * rows in chunks of 4): 4 rows x KC e4m3 bytes and their KC / 128 scales
 * (fp32), the up GEMM's 4 rows x bn / 2 activations and 4 amaxes (fp32),
 * then the warps' sums. */
/* The stream grid's K chunk: a stage is 16 rows x min(K, MOE_STREAM_KC)
 * halves (32 KB at most). */
int moe_gemm_stream_kc(long long K) {
    return K < MOE_STREAM_KC ? (int)K : MOE_STREAM_KC;
}

static int gemv_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, const moe_tuning_entry_t *te, char *err,
                         size_t errlen) {
    long long K, N;
    const int fp8 = moe_spec_fp8(c->spec), up = k->family == MOE_K_GEMM_UP;
    moe_gemm_kn(up, c->spec->hidden, c->spec->ffn, &K, &N);
    k->tile = (moe_tile_cfg_t){.bm = te->bm, .bn = te->bn, .bk = te->bk, .stages = te->stages, .group_m = 1,
                               .gemv = te->gemv};
    k->threads = 256;
    if (moe_tile_stream(&k->tile)) { /* stream: S stages of 16 rows x KC halves, 2 S mbarriers, 16 bytes */
        char name[16];
        if (N % 16 || (te->gemv == 5 && c->spec->hidden % 16))
            return snprintf(err, errlen, "the %s grid needs the %s GEMM's %lld weight rows a multiple of 16%s",
                            moe_gemm_sm90_grid_name(&k->tile, name), up ? "up" : "down", N,
                            te->gemv == 5 ? " and hidden a multiple of 16" : ""), -1;
        /* the chain's up kernel: a ring slot holds a stage of either GEMM (16 rows x its KC) */
        long long kc = moe_gemm_stream_kc(K);
        if (moe_gemm_chains(c->spec, k) && moe_gemm_stream_kc(c->spec->ffn) > kc)
            kc = moe_gemm_stream_kc(c->spec->ffn);
        k->smem = te->stages * 16 * (int)kc * 2 + 2 * te->stages * 8 + 16;
        k->threads = 288; /* 8 consumer warps and the producer warp */
        return 0;
    }
    const int kc = moe_gemm_gemv_kc(K, fp8), sums = te->bn < 32 ? 8 * 32 * 4 : 0, rows = moe_gemm_gemv_rows(te->gemv);
    k->smem = fp8 ? 4 * kc + 4 * (kc / 128) * 4 + (up ? 4 * (te->bn / 2) * 4 + 4 * 4 : 0) + sums
                  : rows * kc * 2 + sums;
    return 0;
}

static int sm90_geometry(moe_kernel_desc_t *k, const moe_family_ctx_t *c, char *err, size_t errlen) {
    const moe_tuning_entry_t *te = c->tuned;
    if (moe_spec_fp8(c->spec) && !(te && te->gemv)) /* the default fp8 tile or an e4m3 entry's (never a bf16
                                                          * entry: gen/tuning.c) */
        return sm90_fp8_geometry(k, te);
    if (te && te->gemv)
        return gemv_geometry(k, c, te, err, errlen);
    if (te) {
        k->tile = (moe_tile_cfg_t){.bm = te->bm, .bn = te->bn, .bk = te->bk, .stages = te->stages,
                                   .group_m = te->group_m, .consumers = te->consumers, .persistent = te->persistent,
                                   .pingpong = te->pingpong, .evict = te->evict && k->family == MOE_K_GEMM_UP,
                                   .cluster = te->cluster};
        k->tile.splitk = sm90_splits(k, c, te->splitk);
    } else {
        k->tile = (moe_tile_cfg_t){.bm = c->align, .bn = 256, .bk = 64, .stages = 4, .group_m = 8,
                                   .consumers = c->align / 64};
    }
    k->threads = 128 * (k->tile.consumers + 1);
    k->smem = moe_gemm_sm90_smem(&k->tile, out_cols(k));
    return 0;
}

void moe_gemm_splitk_space(const moe_kernel_desc_t *k, const moe_spec_t *s, long long mtiles, long long *partials,
                           long long *tickets) {
    *partials = *tickets = 0;
    if (!k->tile.splitk)
        return;
    long long K, N;
    moe_gemm_kn(k->family == MOE_K_GEMM_UP, s->hidden, s->ffn, &K, &N);
    *tickets = mtiles * moe_blocks(N, k->tile.bn);
    *partials = *tickets * k->tile.splitk * k->tile.bm * k->tile.bn;
}

/* The gemv-family grids' names (the tuning table's grid column, the
 * kernel names) by tile.gemv. */
static const struct {
    int gemv;
    const char *name;
} gemv_grids[] = {{1, "gemv"}, {3, "gemv3"}, {6, "gemv4"}, {4, "stream"}, {5, "chain"}};

int moe_gemm_gemv_grid(const char *name) {
    for (size_t i = 0; i < sizeof gemv_grids / sizeof *gemv_grids; i++)
        if (strcmp(name, gemv_grids[i].name) == 0)
            return gemv_grids[i].gemv;
    return 0;
}

const char *moe_gemm_sm90_grid_name(const moe_tile_cfg_t *t, char buf[16]) {
    if (t->gemv) {
        size_t i = 0;
        while (i + 1 < sizeof gemv_grids / sizeof *gemv_grids && gemv_grids[i].gemv != t->gemv)
            i++;
        snprintf(buf, 16, "%s", gemv_grids[i].name);
    } else if (t->splitk)
        snprintf(buf, 16, "splitk%d", t->splitk);
    else
        snprintf(buf, 16, "%s", t->pingpong ? "pingpong" : t->persistent ? "persist" : "tile");
    return buf;
}

/* ---- the family ----------------------------------------------------------- */

static void spell(char *out, size_t n, const moe_family_ctx_t *c, const moe_kernel_desc_t *k) {
    const moe_spec_t *s = c->spec;
    const moe_tile_cfg_t *t = &k->tile;
    const char *what = k->family == MOE_K_GEMM_UP ? "gemm_up_swiglu" : "gemm_down";
    const char *dt = !moe_spec_fp8(s) ? moe_dtype_name(s->dtype)
                     : s->quant.scaling == MOE_SCALING_BLOCK ? "e4m3_block" : "e4m3_channel";
    char grid[16]; /* the grid as the tuning table spells it */
    if (t->gemv)   /* the unroll for the stages; no consumers, no raster */
        snprintf(out, n, "%s_%s_%s_sm90a_%s_m%dn%du%d", s->name, what, dt, moe_gemm_sm90_grid_name(t, grid), t->bm,
                 t->bn, t->stages);
    else if (t->consumers) {  /* the grid named unless one CTA per tile */
        const int plain = !t->pingpong && !t->persistent && !t->splitk;
        snprintf(out, n, "%s_%s_%s_sm90a_tma_%s%sm%dn%dk%ds%dc%dg%d%s%s%s", s->name, what, dt,
                 plain ? "" : moe_gemm_sm90_grid_name(t, grid), plain ? "" : "_", t->bm, t->bn, t->bk, t->stages,
                 t->consumers, t->group_m, moe_gemm_gathers(s, k) ? "_gx" : "",  /* gx: x and src_of too */
                 t->evict ? "_ef" : "",     /* ef: the weights evict-first in L2 */
                 t->cluster ? "_mc" : "");  /* mc: CTA pairs, the weight tile multicast */
    } else
        snprintf(out, n, "%s_%s_%s_m%dn%dk%ds%dw%dx%dg%d", s->name, what, moe_dtype_name(s->dtype), t->bm, t->bn,
                 t->bk, t->stages, t->warps_m, t->warps_n, t->group_m);
}

/* the tile space, N tiles x M tiles (n: row tiles). The sm_90a wgmma
 * kernels run it on a 1D grid of grid[0] * grid[1] CTAs (one per tile), or
 * of min(grid[0] * grid[1], SMs) when tile.persistent (pingpong included);
 * the sm_80 and gemv kernels on this 2D grid as it is. */
static void grid(const moe_spec_t *s, const moe_kernel_desc_t *k, int tokens, long long n, unsigned g[3]) {
    (void)tokens;
    long long K, N;
    moe_gemm_kn(k->family == MOE_K_GEMM_UP, s->hidden, s->ffn, &K, &N);
    g[0] = moe_blocks(N, k->tile.bn);
    g[1] = (unsigned)n;
}

static void push(lua_State *L, const moe_family_ctx_t *c, const moe_kernel_desc_t *k, const moe_kernel_desc_t *set) {
    (void)set;
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
    moe_lua_set_int(L, "splitk", k->tile.splitk);
    moe_lua_set_int(L, "gemv", k->tile.gemv);
    moe_lua_set_int(L, "gather", moe_gemm_gathers(c->spec, k));
    moe_lua_set_int(L, "evict", k->tile.evict);
    moe_lua_set_int(L, "cluster", k->tile.cluster);
    if (k->tile.gemv) {
        long long K, N;
        moe_gemm_kn(k->family == MOE_K_GEMM_UP, c->spec->hidden, c->spec->ffn, &K, &N);
        moe_lua_set_int(L, "kc", moe_tile_stream(&k->tile) ? moe_gemm_stream_kc(K) : moe_gemm_gemv_kc(K, moe_spec_fp8(c->spec)));
        moe_lua_set_int(L, "chain", moe_gemm_chains(c->spec, k)); /* and the down GEMM's stage width */
        moe_lua_set_int(L, "kc_down", moe_gemm_chains(c->spec, k) ? moe_gemm_stream_kc(c->spec->ffn) : 0);
    }
    lua_setfield(L, -2, "tile");
}

#define SM80 (1u << MOE_ARCH_SM80)
#define SM90A (1u << MOE_ARCH_SM90A)

static const moe_family_variant_t up_variants[] = {
    {.archs = SM80, .tmpl = "gemm_up_swiglu", .code = "gemm_up_swiglu", .engine = "mma.sync + cp.async",
     .geometry = moe_gemm_sm80_geometry},
    {.archs = SM90A, .tmpl = "gemm_up_swiglu", .code = "gemm_sm90", .engine = "wgmma + TMA",
     .geometry = sm90_geometry},
};
static const moe_family_variant_t down_variants[] = {
    {.archs = SM80, .tmpl = "gemm_down", .code = "gemm_down", .engine = "mma.sync + cp.async",
     .geometry = moe_gemm_sm80_geometry},
    {.archs = SM90A, .tmpl = "gemm_down", .code = "gemm_sm90", .engine = "wgmma + TMA", .geometry = sm90_geometry},
};

const moe_family_t moe_family_gemm_up = {.id = MOE_K_GEMM_UP, .name = "gemm_up_swiglu", .variants = up_variants,
                                         .nvariants = 2, .spell = spell, .grid = grid, .push = push};
const moe_family_t moe_family_gemm_down = {.id = MOE_K_GEMM_DOWN, .name = "gemm_down", .variants = down_variants,
                                           .nvariants = 2, .spell = spell, .grid = grid, .push = push};
