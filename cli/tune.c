/* tune.c — `moegen tune SPEC`: time candidate sm_90a GEMM tile
 * configurations on the GPU for the spec's shape over a range of token
 * counts, and write the winners as tuning table entries (tuning.h).
 *
 * Each candidate is a one-entry tuning table given to the runtime's plan
 * (moe_plan_create_tuned: JIT-compiled, cached) and timed with the events
 * of moe_forward_timed: the entry's time is the median over --iters of the
 * two GEMMs and the combine (gemm_up_swiglu, gemm_down and combine: the
 * same combine kernel for every candidate, except that a gemv-grid down
 * GEMM folds it in at small calls, launch_geom.h's moe_combine_fuse_tokens).
 * Weights are a constant byte pattern (their values do not move a GEMM's
 * time; with fp8 weights an e4m3 pattern and constant scales); x and the
 * router are random so routing spreads the tokens as a real layer does.
 * An fp8 spec (quant.weights = "fp8_e4m3") times the fp8 GEMMs' tiles
 * (bk 128, bn 256, one or two consumer warpgroups of 64 rows, the tile or
 * the persistent grid; and the gemv grid's fp8 code at small counts) and
 * writes entries of dtype e4m3, which fp8 specs alone take. */
#define _POSIX_C_SOURCE 200809L
#include "driver.h"
#include "family.h"
#include "half.h"
#include "moe_internal.h"
#include "tune.h"
#include "tuning.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TOK 16
#define MAX_SETS 64

const char *const moe_tune_usage =
    "usage: moegen tune SPEC [--tokens a,b,c] [--iters N] [--grid g,h] [-o TABLE] [--set KEY=VALUE]...\n\n"
    "Time candidate sm_90a GEMM tiles (bm x bn x 64, stages, group_m, and the grid: tile = one CTA per\n"
    "output tile, persist = one CTA per SM walking the tiles, pingpong = persist with the two consumer\n"
    "warpgroups on alternate tiles, splitkS = S CTAs per tile each over a share of K: timed at counts\n"
    "up to 64 alone, and not for an expert-parallel SPEC; gemv = a CTA per bn weight rows of a tile, its\n"
    "rows 8 at a time, stages the K loop's unroll, gemv3 = gemv with three CTAs an SM, rows 2 at a\n"
    "time, gemv4 = gemv with four CTAs an SM, rows one at a time, stream = a CTA an SM streaming 16-row\n"
    "blocks of the weights through a ring of `stages` stages, and chain = stream whose up GEMM's grid\n"
    "runs the down GEMM and the combine too: timed at counts up to 64 alone) for SPEC's shape at\n"
    "each token count\n"
    "(default: 256, 4096 and the spec's tokens, at most the spec's tokens) on GPU 0,\n"
    "and write one entry per token count: the winner, with its time and the runner-up's (up + down\n"
    "GEMMs and the combine, median of N iterations, default 20), the date and the GPU. An fp8 SPEC\n"
    "(quant.weights = \"fp8_e4m3\") times the fp8 GEMMs' tiles (64 or 128 x 256 x 128: one or two consumer\n"
    "warpgroups, the tile and persist grids; gemv with bn 32..256) and writes entries of dtype e4m3. A plan\n"
    "runs a call of T tokens\n"
    "on the entry with the largest count <= T (its GEMM variants), so an entry's winner is the fastest\n"
    "at its own count; for an expert-parallel SPEC (mesh.ep > 1), whose plan runs its capacity's entry\n"
    "at every size, the candidate with the lowest sum of time ratios to the fastest over every\n"
    "measured count up to it.\n"
    "--grid tile,persist,pingpong,splitk,gemv,gemv3,gemv4,stream,chain times only the candidates of those grids (the winner is the\n"
    "fastest of them). persist+mc and pingpong+mc (those grids in CTA pairs sharing each weight tile by TMA\n"
    "multicast; pingpong+mc bf16/fp16 only) are timed only when --grid names them.\n"
    "-o TABLE merges the entries into TABLE (replacing entries of the same shape and tokens); without\n"
    "-o they are printed.\n"
    "Progress goes to stderr. Needs a GPU (exit 1 without one); bad input exits 2.\n";

typedef struct {
    int bm, bn, stages, group_m, grid; /* grid: 0 tile, 1 persist, 2 pingpong, 3 splitk, 4 gemv, 5 gemv3
                                        * (stages: the unroll), 6 stream, 7 chain (stages: the ring's), 8
                                        * gemv4 (the unroll), 9 persist+mc, 10 pingpong+mc (CTA pairs) */
    int splitk;                        /* grid 3: S, the CTAs per tile */
    int bk;                            /* 0: 64 (bf16, fp16); the fp8 tiles' 128 */
    int consumers;                     /* 0: the grid's (bm / 64; pingpong 2; gemv grids 1); 2 with bm 256 */
} cand_t;

/* Split-K and gemv candidates run at token counts up to this alone (few
 * rows per expert, where experts x tiles leave most SMs idle); their times
 * above it are not measured (infinite). */
#define TUNE_SMALL_TOKENS 64

static const cand_t cands[] = {
    {128, 256, 4, 8, 0, 0, 0, 0},    {128, 256, 3, 8, 0, 0, 0, 0},    {128, 256, 4, 16, 0, 0, 0, 0},
    {128, 128, 4, 8, 0, 0, 0, 0},    {128, 128, 6, 8, 0, 0, 0, 0},    {64, 256, 4, 8, 0, 0, 0, 0},
    {64, 128, 6, 8, 0, 0, 0, 0},     {128, 256, 4, 8, 1, 0, 0, 0},    {128, 256, 4, 16, 1, 0, 0, 0},
    {128, 256, 3, 8, 1, 0, 0, 0},    {128, 256, 3, 16, 1, 0, 0, 0},   {64, 256, 4, 8, 2, 0, 0, 0},
    {64, 256, 4, 16, 2, 0, 0, 0},    {128, 128, 4, 8, 2, 0, 0, 0},    {64, 128, 6, 8, 3, 2, 0, 0},
    {64, 128, 6, 8, 3, 4, 0, 0},     {64, 128, 6, 8, 3, 8, 0, 0},     {64, 256, 4, 8, 3, 4, 0, 0},
    {64, 256, 4, 8, 3, 8, 0, 0},     {64, 32, 2, 1, 4, 0, 0, 0},      {64, 64, 2, 1, 4, 0, 0, 0},
    {64, 128, 2, 1, 4, 0, 0, 0},     {64, 32, 4, 1, 4, 0, 0, 0},      {64, 64, 4, 1, 4, 0, 0, 0},
    {64, 32, 1, 1, 4, 0, 0, 0},      {64, 16, 2, 1, 4, 0, 0, 0},      {64, 8, 2, 1, 4, 0, 0, 0},
    {64, 8, 4, 1, 4, 0, 0, 0},       {64, 32, 2, 1, 5, 0, 0, 0},      {64, 64, 2, 1, 5, 0, 0, 0},
    {64, 32, 1, 1, 5, 0, 0, 0},      {64, 16, 2, 1, 6, 0, 0, 0},      {64, 16, 3, 1, 6, 0, 0, 0},
    {64, 16, 4, 1, 6, 0, 0, 0},      {64, 16, 2, 1, 7, 0, 0, 0},      {64, 16, 3, 1, 7, 0, 0, 0},
    {64, 32, 2, 1, 8, 0, 0, 0},      {64, 64, 2, 1, 8, 0, 0, 0},      {64, 32, 1, 1, 8, 0, 0, 0},
    /* row blocks of 192 (three consumer warpgroups) and 256 (two, of two m64 blocks each): an expert of up to that
     * many rows is one M tile, so its weights are read once (with 64- or 128-row tiles, 100-250 rows an expert
     * re-read them); 256 x 64 on four consumers measured 1.2-2x slower (run 112) and is no candidate */
    {192, 128, 4, 8, 0, 0, 0, 0},    {192, 128, 4, 8, 1, 0, 0, 0},    {256, 128, 4, 8, 0, 0, 0, 2},
    {256, 128, 3, 8, 1, 0, 0, 2},
    /* CTA pairs (+mc: two M tiles of one expert share each weight stage by TMA multicast), timed only when --grid
     * names persist+mc or pingpong+mc (run 146 measured the first form 1.6-2.2x slower than without, run 151 the
     * second 1.1-1.3x at 4096-16384 tokens) */
    {128, 256, 4, 8, 9, 0, 0, 0},    {128, 256, 3, 8, 9, 0, 0, 0},    {192, 128, 4, 8, 9, 0, 0, 0},
    {64, 256, 4, 8, 10, 0, 0, 0},    {64, 256, 4, 16, 10, 0, 0, 0},   {128, 128, 4, 8, 10, 0, 0, 0},
};
/* an fp8 spec's: 64 x 256 x 128 per consumer warpgroup (gen/family_gemm.c, moe_gemm_sm90_fp8_tile_check) */
static const cand_t fp8_cands[] = {
    {64, 256, 4, 8, 0, 0, 128, 0},   {64, 256, 3, 8, 0, 0, 128, 0},   {64, 256, 4, 16, 0, 0, 128, 0},
    {64, 256, 2, 8, 0, 0, 128, 0},   {128, 256, 4, 8, 0, 0, 128, 0},  {128, 256, 3, 8, 0, 0, 128, 0},
    {128, 256, 4, 16, 0, 0, 128, 0}, {128, 256, 2, 8, 0, 0, 128, 0},  {64, 256, 4, 8, 1, 0, 128, 0},
    {128, 256, 4, 8, 1, 0, 128, 0},  {128, 256, 3, 8, 1, 0, 128, 0},
    /* the gemv grid's fp8 code (bn >= 32: the up GEMM's clusters of 256 / bn CTAs), at small counts */
    {64, 32, 2, 1, 4, 0, 0, 0},      {64, 64, 2, 1, 4, 0, 0, 0},      {64, 128, 2, 1, 4, 0, 0, 0},
    {64, 32, 4, 1, 4, 0, 0, 0},      {64, 256, 1, 1, 4, 0, 0, 0},
    /* CTA pairs (persist+mc), timed only when --grid names persist+mc */
    {128, 256, 4, 8, 9, 0, 128, 0},  {128, 256, 3, 8, 9, 0, 128, 0},  {64, 256, 4, 8, 9, 0, 128, 0},
};

/* The grids by cand_t.grid, as --grid and the tuning table spell them. */
static const char *const grid_names[] = {"tile", "persist", "pingpong", "splitk", "gemv", "gemv3", "stream",
                                         "chain", "gemv4", "persist+mc", "pingpong+mc"};
#define NGRIDS ((int)(sizeof grid_names / sizeof *grid_names))
/* The CTA pairs' grids (persist+mc, pingpong+mc), which only --grid times. */
#define PAIR_GRIDS (1u << 9 | 1u << 10)
#define DEFAULT_GRIDS (((1u << NGRIDS) - 1) & ~PAIR_GRIDS)
static int grid_pairs(int g) { return (int)(PAIR_GRIDS >> g & 1u); }

/* A candidate's tile as a tuning entry gives it; consumer warpgroups: bm /
 * 64 share a tile, or the pingpong's 2 on alternate tiles; gemv's field is 1 (gemv3's 3, stream's 4, chain's 5, gemv4's 6). */
static moe_tile_cfg_t cand_tile(const cand_t *c) {
    return (moe_tile_cfg_t){.bm = c->bm, .bn = c->bn, .bk = c->bk ? c->bk : 64, .stages = c->stages,
                            .consumers = c->consumers                           ? c->consumers
                                         : c->grid == 2 || c->grid == 10        ? 2
                                         : c->grid >= 4 && !grid_pairs(c->grid) ? 1
                                                                                : c->bm / 64,
                            .group_m = c->group_m, .persistent = c->grid == 1 || c->grid == 2 || grid_pairs(c->grid),
                            .pingpong = c->grid == 2 || c->grid == 10, .splitk = c->grid == 3 ? c->splitk : 0,
                            .gemv = moe_gemm_gemv_grid(grid_names[c->grid]), .cluster = grid_pairs(c->grid)};
}

/* The checks a tuning entry's tile must pass (gen/tuning.c): the e4m3 ones for an fp8 spec's. */
static int tile_check(const moe_tile_cfg_t *t, int fp8, char *why, size_t n) {
    return fp8 ? moe_gemm_sm90_fp8_tile_check(t, why, n) : moe_gemm_sm90_tile_check(t, why, n);
}

int moe_tune_check_candidates(char *why, size_t n) {
    for (int fp8 = 0; fp8 < 2; fp8++) {
        const int nc = fp8 ? (int)(sizeof fp8_cands / sizeof *fp8_cands) : (int)(sizeof cands / sizeof *cands);
        for (int i = 0; i < nc; i++) {
            const moe_tile_cfg_t t = cand_tile(fp8 ? &fp8_cands[i] : &cands[i]);
            char w[160];
            if (tile_check(&t, fp8, w, sizeof w)) {
                snprintf(why, n, "%s candidate %d (m%dn%dk%ds%d): %s", fp8 ? "fp8" : "bf16", i, t.bm, t.bn, t.bk,
                         t.stages, w);
                return 1;
            }
        }
    }
    return 0;
}

/* A candidate's grid as the tuning table and the progress lines spell it, in buf. */
static const char *grid_name(const cand_t *c, char buf[16]) {
    if (grid_pairs(c->grid))
        return snprintf(buf, 16, "%s", grid_names[c->grid]), buf;
    const moe_tile_cfg_t t = cand_tile(c);
    return moe_gemm_sm90_grid_name(&t, buf);
}
static int cand_consumers(const cand_t *c) { return cand_tile(c).consumers; }
#define NCAND_BF16 ((int)(sizeof cands / sizeof *cands))
#define NCAND_FP8 ((int)(sizeof fp8_cands / sizeof *fp8_cands))
#define NCAND (NCAND_BF16 > NCAND_FP8 ? NCAND_BF16 : NCAND_FP8)
static int cand_bk(const cand_t *c) { return cand_tile(c).bk; }
/* The spec's candidates (fp8 weights: fp8_cands) and their count. */
static const cand_t *spec_cands(const moe_spec_t *s, int *n) {
    *n = moe_spec_fp8(s) ? NCAND_FP8 : NCAND_BF16;
    return moe_spec_fp8(s) ? fp8_cands : cands;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static int upload_random(CUdeviceptr *d, size_t n, float scale, moe_dtype_t dt) {
    uint16_t *h = malloc(n * 2);
    if (!h)
        return 1;
    for (size_t i = 0; i < n; i++)
        h[i] = moe_float_to_half(frand() * scale, dt);
    int rc = moe_cu.cuMemAlloc(d, n * 2) != CUDA_SUCCESS || moe_cu.cuMemcpyHtoD(*d, h, n * 2) != CUDA_SUCCESS;
    free(h);
    return rc;
}

static void entry_key(char *out, size_t n, const moe_spec_t *s, int tokens) {
    snprintf(out, n, "%d %d %d %d %s sm_90a %d ", s->experts, s->top_k, s->hidden, s->ffn,
             moe_spec_fp8(s) ? "e4m3" : moe_dtype_name(s->dtype), tokens);
}

/* Merge lines into TABLE: keep its lines except entries with the same key,
 * forward or backward (cli/tune.h, moe_tune_write_table). */
int moe_tune_write_table(const char *path, const moe_spec_t *s, const int *tok, int ntok, char lines[][256]) {
    size_t len = 0;
    char err[256];
    char *old = NULL;
    if (access(path, F_OK) == 0 && !(old = moe_read_file(path, 1 << 24, &len, err, sizeof err))) {
        fprintf(stderr, "moegen: error: %s\n", err);
        return 1;
    }
    if (old) {
        moe_tuning_t t;
        moe_diag_t d;
        int bad = moe_tuning_parse(&t, path, old, len, &d);
        moe_tuning_free(&t);
        if (bad) {
            fprintf(stderr, "%s\n", d.msg);
            free(old);
            return 2;
        }
    }
    moe_buf_t b = {0};
    for (char *p = old; p && *p;) {
        char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        /* a backward entry (its stage's name first) completes the forward entry it follows: a replaced
         * forward entry drops its backward ones too (chosen under its row block) */
        const char *body = p;
        char word[16];
        const size_t wl = strcspn(p, " \t\n");
        if (wl < sizeof word && p[wl] != '\n' && p[wl]) {
            memcpy(word, p, wl), word[wl] = 0;
            if (moe_bgemm_family(word) >= 0)
                body = p + wl + strspn(p + wl, " \t");
        }
        int drop = 0;
        for (int i = 0; i < ntok; i++) {
            char key[128];
            entry_key(key, sizeof key, s, tok[i]);
            if (strncmp(body, key, strlen(key)) == 0)
                drop = 1;
        }
        if (!drop)
            moe_buf_printf(&b, "%.*s\n", (int)l, p);
        p = nl ? nl + 1 : p + l;
    }
    for (int i = 0; i < ntok; i++)
        if (lines[i][0])
            moe_buf_printf(&b, "%s\n", lines[i]);
    free(old);
    /* a new file beside the table (O_EXCL | O_NOFOLLOW, a name no one can plant), then renamed over it */
    char tmp[4200];
    FILE *f = b.failed ? NULL : moe_create_temp(path, tmp, sizeof tmp, 0644);
    int rc = !f || fwrite(b.data, 1, b.len, f) != b.len;
    if (f) {
        rc |= fclose(f) != 0;
        if (!rc)
            rc = rename(tmp, path) != 0;
        if (rc)
            unlink(tmp);
    }
    if (rc)
        fprintf(stderr, "moegen: error: cannot write %s: %s\n", path, b.failed ? "out of memory" : strerror(errno));
    moe_buf_free(&b);
    return rc;
}

/* The command's inputs: the spec loaded with tokens = the largest count
 * to measure (the plans' capacity; the tiles do not depend on it). */
typedef struct {
    const char *spec_path, *out;
    int iters;
    unsigned grids; /* bit g: candidates of grid g (cand_t.grid) are timed (--grid; default every grid) */
    int tok[MAX_TOK], ntok, tmax, tok_min;
    moe_spec_t spec;
} tune_args_t;

/* Parse argv and load the spec. Returns -1 to go on, else the exit status
 * (0 after --help). */
static int parse_args(int argc, char **argv, tune_args_t *a) {
    const char *toklist = NULL;
    moe_override_t sets[MAX_SETS + 1];
    int nsets = 0;
    memset(a, 0, sizeof *a);
    a->iters = 20;
    a->grids = DEFAULT_GRIDS;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0)
            return fputs(moe_tune_usage, stdout), 0;
        if (strcmp(o, "--tokens") == 0 || strcmp(o, "--iters") == 0 || strcmp(o, "-o") == 0 ||
            strcmp(o, "--set") == 0 || strcmp(o, "--grid") == 0) {
            if (!v)
                return fprintf(stderr, "moegen: error: %s needs a value\n(try moegen tune --help)\n", o), 2;
            i++;
            if (o[2] == 't')
                toklist = v;
            else if (o[2] == 'g') {
                a->grids = 0;
                for (const char *p = v; *p;) {
                    const size_t n = strcspn(p, ",");
                    int g = 0;
                    while (g < NGRIDS && (strlen(grid_names[g]) != n || strncmp(p, grid_names[g], n)))
                        g++;
                    if (g == NGRIDS)
                        return fprintf(stderr, "moegen: error: --grid: '%.*s' is not tile, persist, pingpong, splitk, "
                                       "gemv, gemv3, gemv4, stream, chain, persist+mc or pingpong+mc\n", (int)n, p), 2;
                    a->grids |= 1u << g;
                    p += n + (p[n] == ',');
                }
                if (!a->grids)
                    return fprintf(stderr, "moegen: error: --grid needs one or more of tile, persist, pingpong, "
                                   "splitk, gemv, gemv3, gemv4, stream, chain, persist+mc, pingpong+mc\n"), 2;
            }
            else if (o[2] == 'i') {
                char *e;
                a->iters = (int)strtol(v, &e, 10);
                if (*e || a->iters < 1 || a->iters > 10000)
                    return fprintf(stderr, "moegen: error: --iters needs 1..10000, got '%s'\n", v), 2;
            } else if (o[1] == 'o')
                a->out = v;
            else if (nsets < MAX_SETS)
                sets[nsets++].text = v;
            else
                return fprintf(stderr, "moegen: error: too many --set options\n"), 2;
        } else if (o[0] == '-' && o[1]) {
            return fprintf(stderr, "moegen: error: unknown option '%s'\n(try moegen tune --help)\n", o), 2;
        } else if (!a->spec_path) {
            a->spec_path = o;
        } else {
            return fprintf(stderr, "moegen: error: unexpected argument '%s'\n", o), 2;
        }
    }
    if (!a->spec_path)
        return fprintf(stderr, "moegen: error: tune needs a SPEC file\n(try moegen tune --help)\n"), 2;
    moe_spec_t *s = &a->spec;
    moe_diag_t d;
    if (moe_spec_load(s, a->spec_path, NULL, sets, nsets, &d))
        return fprintf(stderr, "%s\n", d.msg), 2;
    if (toklist) {
        for (const char *p = toklist; *p && a->ntok < MAX_TOK;) {
            char *e;
            long v = strtol(p, &e, 10);
            if (e == p || v < 1 || v > s->tokens || (*e && *e != ','))
                return fprintf(stderr, "moegen: error: --tokens: '%s' must be a list of token counts in 1..%d\n",
                               toklist, s->tokens), 2;
            a->tok[a->ntok++] = (int)v;
            p = *e ? e + 1 : e;
        }
    } else {
        int def[3] = {256, 4096, s->tokens};
        for (int i = 0; i < 3; i++)
            if (def[i] <= s->tokens && (a->ntok == 0 || a->tok[a->ntok - 1] < def[i]))
                a->tok[a->ntok++] = def[i];
    }
    a->tok_min = a->tok[0];
    for (int i = 0; i < a->ntok; i++) {
        a->tmax = a->tok[i] > a->tmax ? a->tok[i] : a->tmax;
        a->tok_min = a->tok[i] < a->tok_min ? a->tok[i] : a->tok_min;
    }
    char tset[64];
    snprintf(tset, sizeof tset, "tokens=%d", a->tmax);
    sets[nsets].text = tset;
    if (moe_spec_load(s, a->spec_path, NULL, sets, nsets + 1, &d))
        return fprintf(stderr, "%s\n", d.msg), 2;
    return -1;
}

/* The canonical spec in a temporary file (path: a "/tmp/...XXXXXX"
 * template, filled in). Returns 0, or 1 after printing the error. */
static int write_temp_spec(const moe_spec_t *s, char *path) {
    char *canon = moe_spec_canonical(s);
    int fd = canon ? mkstemp(path) : -1;
    int bad = fd < 0 || write(fd, canon, strlen(canon)) != (ssize_t)strlen(canon);
    if (fd >= 0)
        close(fd);
    free(canon);
    if (bad)
        fprintf(stderr, "moegen: error: cannot write a temporary spec\n");
    return bad;
}

/* The GPU inputs every candidate runs on, made once in the first plan's
 * context. */
typedef struct {
    CUdeviceptr x, wr, w1p, w2, b1p, b2, bias, y, gate; /* w1p, w2: every weight slot (a shared expert's too) */
    CUdeviceptr w1s, w2s; /* fp8 weights: their scales (as many as channel or block scaling needs), else 0 */
    CUdeviceptr ids, gw;  /* given routing: the caller's ids, uniform over the experts, and weights 1/k; else 0 */
    CUdeviceptr escale;   /* router.expert_scale: ones */
    CUdeviceptr rx;       /* router.input = "separate": the router's rows, x where its width is H (router.hidden) */
    CUstream st;
    CUevent ev[MOE_K_COUNT + 1];
    char gpu[128];
} tune_bufs_t;

/* Make the inputs for spec s at tmax tokens. Returns 0, or 1 after
 * printing the error. */
static int make_buffers(tune_bufs_t *b, const moe_spec_t *s, int tmax) {
    const size_t H = s->hidden, F = s->ffn, T = (size_t)tmax, ES = (size_t)moe_spec_slots(s);
    const size_t NS = (size_t)moe_spec_scored(s); /* the router's rows and biases: zero experts included */
    CUdevice dev;
    snprintf(b->gpu, sizeof b->gpu, "?");
    if (moe_cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS)
        moe_cu.cuDeviceGetName(b->gpu, sizeof b->gpu, dev);
    const size_t HR = (size_t)moe_spec_router_hidden(s); /* the router's width: router_w [NS, HR] */
    int bad = upload_random(&b->x, T * H, 1.0f, s->dtype) ||
              upload_random(&b->wr, NS * HR, 4.0f / sqrtf((float)HR), s->dtype) ||
              (HR != H && upload_random(&b->rx, T * HR, 1.0f, s->dtype)) ||
              upload_random(&b->b1p, ES * 2 * F, 0.5f, s->dtype) || upload_random(&b->b2, ES * H, 0.5f, s->dtype) ||
              upload_random(&b->gate, H, 2.0f / sqrtf((float)H), s->dtype);
    bad |= moe_cu.cuMemAlloc(&b->w1p, ES * 2 * F * H * 2) != CUDA_SUCCESS ||
           moe_cu.cuMemAlloc(&b->w2, ES * H * F * 2) != CUDA_SUCCESS ||
           moe_cu.cuMemAlloc(&b->bias, NS * 4) != CUDA_SUCCESS || moe_cu.cuMemAlloc(&b->y, T * H * 2) != CUDA_SUCCESS ||
           moe_cu.cuMemAlloc(&b->escale, NS * 4) != CUDA_SUCCESS;
    /* 0x3c: bf16 ~0.011 a pair of bytes, e4m3 1.5 a byte (scaled by 1/64 below) */
    bad |= moe_cu.cuMemsetD8(b->w1p, 0x3c, ES * 2 * F * H * 2) != CUDA_SUCCESS ||
           moe_cu.cuMemsetD8(b->w2, 0x3c, ES * H * F * 2) != CUDA_SUCCESS ||
           moe_cu.cuMemsetD8(b->bias, 0, NS * 4) != CUDA_SUCCESS ||
           moe_cu.cuMemsetD32Async(b->escale, 0x3f800000u, NS, NULL) != CUDA_SUCCESS || /* 1.0f */
           moe_cu.cuCtxSynchronize() != CUDA_SUCCESS;
    if (!bad && moe_spec_fp8(s)) { /* per-channel scales take one a row, block scales one per 128 x 128: the more */
        const size_t n1 = ES * 2 * F, n2 = ES * H;
        const unsigned one64 = 0x3c800000u; /* 1/64 */
        bad |= moe_cu.cuMemAlloc(&b->w1s, n1 * 4) != CUDA_SUCCESS || moe_cu.cuMemAlloc(&b->w2s, n2 * 4) != CUDA_SUCCESS;
        bad |= bad || moe_cu.cuMemsetD32Async(b->w1s, one64, n1, NULL) != CUDA_SUCCESS ||
               moe_cu.cuMemsetD32Async(b->w2s, one64, n2, NULL) != CUDA_SUCCESS ||
               moe_cu.cuCtxSynchronize() != CUDA_SUCCESS;
    }
    if (!bad && s->router.select == MOE_SELECT_GIVEN) {
        const size_t n = T * (size_t)s->top_k;
        int *hi = malloc(n * sizeof(int));
        float *hw = malloc(n * sizeof(float));
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; hi && hw && i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            hi[i] = (int)((r >> 33) % (uint64_t)s->experts);
            hw[i] = 1.0f / (float)s->top_k;
        }
        bad |= !hi || !hw || moe_cu.cuMemAlloc(&b->ids, n * sizeof(int)) != CUDA_SUCCESS ||
               moe_cu.cuMemAlloc(&b->gw, n * sizeof(float)) != CUDA_SUCCESS ||
               moe_cu.cuMemcpyHtoD(b->ids, hi, n * sizeof(int)) != CUDA_SUCCESS ||
               moe_cu.cuMemcpyHtoD(b->gw, hw, n * sizeof(float)) != CUDA_SUCCESS;
        free(hi), free(hw);
    }
    bad |= moe_cu.cuStreamCreate(&b->st, 0) != CUDA_SUCCESS;
    for (int i = 0; i <= MOE_K_COUNT; i++)
        bad |= moe_cu.cuEventCreate(&b->ev[i], 0) != CUDA_SUCCESS;
    if (bad)
        fprintf(stderr, "\nmoegen: error: cannot allocate the tuning buffers on the GPU\n");
    return bad;
}

/* Time plan at each of a's token counts up to max_tokens: times[ti] = the
 * median over a->iters (after 3 warm-up runs) of the up + down GEMMs and
 * the combine, in us; INFINITY above max_tokens. Returns 0, or 1 after
 * printing the error. */
static int time_plan(moe_plan *plan, const tune_bufs_t *b, const tune_args_t *a, int max_tokens, float *times) {
    CUdeviceptr ws;
    if (moe_cu.cuMemAlloc(&ws, moe_plan_workspace_size(plan, a->tmax)) != CUDA_SUCCESS) {
        fprintf(stderr, "\nmoegen: error: cannot allocate the workspace\n");
        return 1;
    }
    float *t = malloc(sizeof(float) * 3 * (size_t)a->iters); /* up + down, then up, then down, per iteration */
    if (!t) {
        fprintf(stderr, "\nmoegen: error: out of memory\n");
        moe_cu.cuMemFree(ws);
        return 1;
    }
    int rc = 0;
    for (int ti = 0; ti < a->ntok && !rc; ti++) {
        if (a->tok[ti] > max_tokens) {
            times[ti] = INFINITY;
            fprintf(stderr, "%s%d tok not timed", ti ? ", " : "", a->tok[ti]);
            continue;
        }
        moe_forward_args fa = {.tokens = a->tok[ti], .x = (void *)b->x, .router_w = (void *)b->wr,
                               .router_bias = (float *)b->bias, .router_logit_bias = (float *)b->bias,
                               .w1p = (void *)b->w1p, .b1p = (void *)b->b1p, .w2 = (void *)b->w2,
                               .b2 = (void *)b->b2, .y = (void *)b->y, .workspace = (void *)ws,
                               .shared_gate = (void *)b->gate, .w1s = (const float *)b->w1s,
                               .w2s = (const float *)b->w2s, .topk_ids = (const int *)b->ids,
                               .topk_weights = (const float *)b->gw, .router_x = (void *)(b->rx ? b->rx : b->x),
                               .router_expert_scale = (const float *)b->escale};
        for (int it = -3; it < a->iters && !rc; it++) {
            float up, down; /* down: from the down GEMM's start to the combine's end (folded in or not) */
            if (moe_forward_timed(plan, &fa, b->st, (CUevent *)b->ev) != MOE_OK) {
                fprintf(stderr, "\nmoegen: error: forward: %s\n", moe_last_error());
                rc = 1;
                break;
            }
            CUresult r = moe_cu.cuStreamSynchronize(b->st); /* a kernel's fault shows here, not in the launch */
            if (r != CUDA_SUCCESS) {
                fprintf(stderr, "\nmoegen: error: forward at %d tokens: %s\n", a->tok[ti], moe_cu_error_string(r));
                rc = 1;
                break;
            }
            if (it < 0)
                continue;
            moe_cu.cuEventElapsedTime(&up, b->ev[MOE_K_GEMM_UP], b->ev[MOE_K_GEMM_UP + 1]);
            moe_cu.cuEventElapsedTime(&down, b->ev[MOE_K_GEMM_DOWN], b->ev[MOE_K_COUNT]);
            t[it] = (up + down) * 1000.0f, t[a->iters + it] = up * 1000.0f, t[2 * a->iters + it] = down * 1000.0f;
        }
        if (rc)
            break;
        for (int j = 0; j < 3; j++) /* each its own median: up and down apart say which GEMM a tile suits */
            qsort(t + j * a->iters, (size_t)a->iters, sizeof *t, cmp_float);
        times[ti] = t[a->iters / 2];
        fprintf(stderr, "%s%d tok %.1f us (up %.1f, down %.1f)", ti ? ", " : "", a->tok[ti], times[ti],
                t[a->iters + a->iters / 2], t[2 * a->iters + a->iters / 2]);
    }
    free(t);
    fprintf(stderr, "\n");
    moe_cu.cuMemFree(ws);
    return rc;
}

/* The bucket's winner among the candidates that ran (ok), scored by the
 * sum of time ratios to the fastest over a range of the measured counts:
 * with GEMM variants a bucket's entry runs the calls from its count to
 * the next measured one, so the range is its own count; a plan that keeps
 * one configuration (expert parallelism: the capacity's entry runs every
 * call) sums over every count up to the bucket's (cumulative). */
int moe_tune_winner(int ncand, int ntok, const float *times, int stride, const int *ok, const int *tok, int ti,
                    int cumulative, int *second) {
    int best = -1;
    double best_score = 0, second_score = 0;
    *second = -1;
    for (int c = 0; c < ncand; c++) {
        if (!ok[c])
            continue;
        double score = 0;
        for (int tj = 0; tj < ntok; tj++) {
            if (cumulative ? tok[tj] > tok[ti] : tj != ti)
                continue;
            float fastest = 0;
            for (int d = 0; d < ncand; d++)
                if (ok[d] && (fastest == 0 || times[d * stride + tj] < fastest))
                    fastest = times[d * stride + tj];
            score += times[c * stride + tj] / fastest;
        }
        if (best < 0 || score < best_score) {
            *second = best, second_score = best_score;
            best = c, best_score = score;
        } else if (*second < 0 || score < second_score) {
            *second = c, second_score = score;
        }
    }
    return best;
}

/* The table lines, one per token count (empty when fewer than two
 * candidates ran): a bucket's winner and runner-up. Returns how many. */
static int choose_entries(const tune_args_t *a, float times[][MAX_TOK], const int *ok, const char *gpu,
                          char lines[][256]) {
    int ncand;
    const cand_t *cl = spec_cands(&a->spec, &ncand);
    char date[16];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    int nwin = 0;
    for (int ti = 0; ti < a->ntok; ti++) {
        int second = -1;
        int best = moe_tune_winner(ncand, a->ntok, &times[0][0], MAX_TOK, ok, a->tok, ti, a->spec.mesh.size[MOE_AXIS_EP] > 1,
                                   &second);
        lines[ti][0] = 0;
        if (best < 0 || second < 0)
            continue;
        const cand_t *w = &cl[best], *r = &cl[second];
        char key[128], wg[16], rg[16];
        entry_key(key, sizeof key, &a->spec, a->tok[ti]);
        snprintf(lines[ti], 256, "%s %d %d %d %d %d %d %s  %.1f %.1f %s %s", key, w->bm, w->bn, cand_bk(w), w->stages,
                 cand_consumers(w), w->group_m, grid_name(w, wg), times[best][ti], times[second][ti], date, gpu);
        fprintf(stderr, "%d tokens: m%dn%dk%ds%dg%d %s %.1f us (runner-up m%dn%dk%ds%dg%d %s %.1f us)\n",
                a->tok[ti], w->bm, w->bn, cand_bk(w), w->stages, w->group_m, wg, times[best][ti], r->bm, r->bn,
                cand_bk(r), r->stages, r->group_m, grid_name(r, rg), times[second][ti]);
        nwin++;
    }
    return nwin;
}

/* Device 0, which the candidates' plans take, is there and runs sm_90a
 * (the candidates are sm_90a tiles): checked before any progress line, so
 * a machine without a GPU fails at once with the reason. */
static int gpu_ready(void) {
    char why[512];
    if (moe_cu_load(why, sizeof why)) {
        fprintf(stderr, "moegen: error: tune needs a GPU: no CUDA driver: %s\n", why);
        return 0;
    }
    int n = 0, major = 0, minor = 0;
    CUdevice dev;
    CUresult r = moe_cu.cuInit(0);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n == 0) {
        fprintf(stderr, "moegen: error: tune needs a GPU: %s\n",
                r != CUDA_SUCCESS ? moe_cu_error_string(r) : "the driver reports no CUDA device");
        return 0;
    }
    if (moe_cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        moe_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        moe_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS ||
        major != 9 || minor != 0) {
        fprintf(stderr, "moegen: error: tune times sm_90a GEMM tiles and needs a compute capability 9.0 GPU as "
                        "device 0; it is %d.%d\n", major, minor);
        return 0;
    }
    return 1;
}

int moe_tune_command(int argc, char **argv) {
    tune_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (!gpu_ready())
        return 1;
    const moe_spec_t *s = &a.spec;
    char spec_tmp[] = "/tmp/moegen-tune-XXXXXX";
    if (write_temp_spec(s, spec_tmp))
        return 1;

    float times[NCAND][MAX_TOK];
    int ok[NCAND] = {0};
    tune_bufs_t bufs = {.gpu = "?"};
    int have_buf = 0;
    rc = 0;
    moe_plan *keep = NULL; /* the first plan, alive to the end: the buffers live in its context */
    int ncand;
    const cand_t *cl = spec_cands(s, &ncand);
    fprintf(stderr, "tune %s: E=%d top_k=%d H=%d F=%d %s, %d candidates x %d token counts, %d iterations\n",
            s->name, s->experts, s->top_k, s->hidden, s->ffn, moe_spec_fp8(s) ? "e4m3" : moe_dtype_name(s->dtype),
            ncand, a.ntok, a.iters);
    for (int c = 0; c < ncand && !rc; c++) {
        const cand_t *cd = &cl[c];
        const moe_tile_cfg_t tile = cand_tile(cd);
        moe_tuning_entry_t e = {.experts = s->experts, .top_k = s->top_k, .hidden = s->hidden, .ffn = s->ffn,
                                .dtype = s->dtype, .arch = MOE_ARCH_SM90A, .tokens = 1, .bm = tile.bm, .bn = tile.bn,
                                .bk = tile.bk, .stages = tile.stages, .consumers = tile.consumers,
                                .group_m = tile.group_m, .persistent = tile.persistent, .pingpong = tile.pingpong,
                                .splitk = tile.splitk, .gemv = tile.gemv, .cluster = tile.cluster,
                                .fp8 = moe_spec_fp8(s)};
        moe_tuning_t one = {.file = "(tune candidate)", .e = &e, .n = 1};
        char gname[16];
        fprintf(stderr, "[%d/%d] m%dn%dk%ds%dg%d %s: ", c + 1, ncand, cd->bm, cd->bn, cand_bk(cd), cd->stages,
                cd->group_m, grid_name(cd, gname));
        char why[160];
        if (!(a.grids >> cd->grid & 1u)) {
            fprintf(stderr, "skipped: not a --grid grid\n");
            continue;
        }
        if (tile_check(&tile, e.fp8, why, sizeof why) ||
            (e.splitk && moe_tuning_splitk_check(e.splitk, e.hidden, e.ffn, e.bk, why, sizeof why))) {
            fprintf(stderr, "skipped: %s\n", why);
            continue;
        }
        if (e.gemv && a.tok_min > TUNE_SMALL_TOKENS) {
            fprintf(stderr, "skipped: gemv is timed at counts up to %d alone\n", TUNE_SMALL_TOKENS);
            continue;
        }
        if (e.splitk && (a.tok_min > TUNE_SMALL_TOKENS || s->mesh.size[MOE_AXIS_EP] > 1 || s->training)) {
            if (a.tok_min > TUNE_SMALL_TOKENS)
                fprintf(stderr, "skipped: split-K is timed at counts up to %d alone\n", TUNE_SMALL_TOKENS);
            else /* the plan would run the tile grid (gen/family_gemm.c) */
                fprintf(stderr, "skipped: split-K runs on one-device inference plans alone\n");
            continue;
        }
        moe_plan *plan;
        moe_status ps = moe_plan_create_tuned(&plan, spec_tmp, NULL, NULL, &one);
        if (ps == MOE_ERR_NO_DRIVER || ps == MOE_ERR_NO_GPU) {
            fprintf(stderr, "\nmoegen: error: tune needs a GPU: %s\n", moe_last_error());
            rc = 1;
            break;
        }
        if (ps != MOE_OK) {
            fprintf(stderr, "skipped: %s: %s\n", moe_status_string(ps), moe_last_error());
            continue;
        }
        if (!have_buf && make_buffers(&bufs, s, a.tmax)) {
            moe_plan_destroy(plan);
            rc = 1;
            break;
        }
        have_buf = 1;
        rc = time_plan(plan, &bufs, &a, e.splitk || e.gemv ? TUNE_SMALL_TOKENS : a.tmax, times[c]);
        if (rc && !keep) { /* nothing else holds the context the buffers live in */
            moe_plan_destroy(plan);
            break;
        }
        if (keep)
            moe_plan_destroy(plan);
        else
            keep = plan;
        ok[c] = !rc;
    }
    unlink(spec_tmp);
    if (keep)
        moe_plan_destroy(keep);
    if (rc)
        return rc;
    char lines[MAX_TOK][256];
    if (!choose_entries(&a, times, ok, bufs.gpu, lines))
        return fprintf(stderr, "moegen: error: fewer than two candidates ran; no entries\n"), 1;
    if (a.out)
        return moe_tune_write_table(a.out, s, a.tok, a.ntok, lines);
    for (int ti = 0; ti < a.ntok; ti++)
        if (lines[ti][0])
            printf("%s\n", lines[ti]);
    return 0;
}
