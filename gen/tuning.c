/* tuning.c — parse and search the tuning table (format: tuning/h200.tune). */
#include "tuning.h"
#include "family.h"
#include "template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const moe_embedded_t moe_embedded_tuning[]; /* build/tuning_embed.c */

static int fail(moe_diag_t *d, const char *file, int line, const char *msg, const char *tok) {
    if (tok)
        snprintf(d->msg, sizeof d->msg, "%s:%d: error: %s ('%s')", file, line, msg, tok);
    else
        snprintf(d->msg, sizeof d->msg, "%s:%d: error: %s", file, line, msg);
    return 1;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return 1;
    *out = (int)v;
    return 0;
}

/* Whether a and b are for the same shape, dtype, arch and bucket. */
static int same_key(const moe_tuning_entry_t *a, const moe_tuning_entry_t *b) {
    return a->experts == b->experts && a->top_k == b->top_k && a->hidden == b->hidden && a->ffn == b->ffn &&
           a->dtype == b->dtype && a->fp8 == b->fp8 && a->arch == b->arch && a->tokens == b->tokens;
}

/* The forward entry backward entry b completes, or NULL. */
static const moe_tuning_entry_t *forward_of(const moe_tuning_t *t, const moe_tuning_entry_t *b) {
    for (int i = 0; i < t->n; i++)
        if (t->e[i].stage == 0 && same_key(&t->e[i], b))
            return &t->e[i];
    return NULL;
}

const moe_tuning_entry_t *moe_tuning_find_bgemm(const moe_tuning_t *t, const moe_tuning_entry_t *fwd, int family) {
    for (int i = 0; t && fwd && i < t->n; i++)
        if (t->e[i].stage == family && same_key(&t->e[i], fwd))
            return &t->e[i];
    return NULL;
}

int moe_tuning_parse(moe_tuning_t *t, const char *file, const char *text, size_t len, moe_diag_t *diag) {
    memset(t, 0, sizeof *t);
    snprintf(t->file, sizeof t->file, "%s", file);
    int cap = 0, line = 0;
    size_t pos = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        line++;
        char buf[1024];
        if (end - pos >= sizeof buf)
            return fail(diag, file, line, "line too long", NULL);
        memcpy(buf, text + pos, end - pos);
        buf[end - pos] = 0;
        pos = end + 1;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = 0;
        char *words[32], **tok = words;
        int nt = 0;
        for (char *p = strtok(buf, " \t\r"); p && nt < 32; p = strtok(NULL, " \t\r"))
            words[nt++] = p;
        if (nt == 0)
            continue;
        moe_tuning_entry_t e = {.line = line};
        if (!(tok[0][0] >= '0' && tok[0][0] <= '9')) { /* a backward GEMM's entry: its name, then the fields */
            if ((e.stage = moe_bgemm_family(tok[0])) < 0)
                return fail(diag, file, line, "an entry starts with E (an integer) or with a backward GEMM's name "
                            "(dgrad_down, dgrad_up, wgrad_up, wgrad_down)", tok[0]);
            tok++, nt--;
        }
        if (nt < 18)
            return fail(diag, file, line, "an entry has 18 fields or more: [backward GEMM] E top_k H F dtype arch "
                        "tokens bm bn bk stages consumers group_m grid best_us runner_up_us date gpu", NULL);
        int *ints[] = {&e.experts, &e.top_k, &e.hidden, &e.ffn};
        static const char *const iname[] = {"E", "top_k", "H", "F"};
        for (int i = 0; i < 4; i++)
            if (parse_int(tok[i], 1, 65536, ints[i])) {
                char m[64];
                snprintf(m, sizeof m, "%s must be an integer 1..65536", iname[i]);
                return fail(diag, file, line, m, tok[i]);
            }
        if (strcmp(tok[4], "bf16") == 0)
            e.dtype = MOE_DTYPE_BF16;
        else if (strcmp(tok[4], "fp16") == 0)
            e.dtype = MOE_DTYPE_FP16;
        else if (strcmp(tok[4], "e4m3") == 0) /* fp8 weights: the layer's input and output are bf16 */
            e.dtype = MOE_DTYPE_BF16, e.fp8 = 1;
        else
            return fail(diag, file, line, "dtype must be bf16, fp16 or e4m3 (an fp8 spec's GEMMs)", tok[4]);
        if (strcmp(tok[5], "sm_90a") == 0)
            e.arch = MOE_ARCH_SM90A;
        else
            return fail(diag, file, line, "arch must be sm_90a (the only tuned arch)", tok[5]);
        if (parse_int(tok[6], 1, 1 << 20, &e.tokens))
            return fail(diag, file, line, "tokens must be an integer 1..2^20", tok[6]);
        int *tile[] = {&e.bm, &e.bn, &e.bk, &e.stages, &e.consumers, &e.group_m};
        for (int i = 0; i < 6; i++)
            if (parse_int(tok[7 + i], 1, 4096, tile[i]))
                return fail(diag, file, line, "tile fields (bm bn bk stages consumers group_m) are integers",
                            tok[7 + i]);
        /* GRID+pdl: launch overlap for the bucket's calls; GRID+ef: the up GEMM's weights evict-first in L2 */
        char *plus = strchr(tok[13], '+');
        for (char *sfx = plus; sfx;) {
            char *next = strchr(sfx + 1, '+');
            const size_t n = next ? (size_t)(next - sfx) : strlen(sfx);
            int *flag = n == 4 && strncmp(sfx, "+pdl", 4) == 0  ? &e.pdl
                        : n == 3 && strncmp(sfx, "+ef", 3) == 0 ? &e.evict
                        : n == 3 && strncmp(sfx, "+mc", 3) == 0 ? &e.cluster
                                                                : NULL;
            if (!flag || *flag)
                return fail(diag, file, line, "the grid's suffixes are +pdl (launch overlap for the bucket's calls), "
                            "+ef (the up GEMM's weights loaded evict-first in L2) and +mc (CTA pairs sharing the "
                            "weight tile by TMA multicast), each at most once", tok[13]);
            *flag = 1;
            sfx = next;
        }
        if (plus)
            *plus = 0;
        if (strcmp(tok[13], "tile") == 0 || strcmp(tok[13], "persist") == 0 || strcmp(tok[13], "pingpong") == 0) {
            e.persistent = strcmp(tok[13], "tile") != 0;
            e.pingpong = strcmp(tok[13], "pingpong") == 0;
        } else if (strncmp(tok[13], "splitk", 6) == 0) {
            if (parse_int(tok[13] + 6, 2, 16, &e.splitk))
                return fail(diag, file, line, "grid splitkS: S (the CTAs that split one tile's K) must be an "
                            "integer 2..16", tok[13]);
        } else if ((e.gemv = moe_gemm_gemv_grid(tok[13])) == 0) { /* gemv, gemv3, gemv4, stream or chain, else none */
            return fail(diag, file, line, "grid must be tile (one CTA per tile), persist (one CTA per SM), pingpong "
                        "(one CTA per SM, its consumer warpgroups on alternate tiles), splitkS (S = 2..16 CTAs "
                        "per tile, each over a share of K), gemv (a CTA per bn weight rows of a tile, for few "
                        "rows per expert), gemv3 (gemv, three CTAs an SM), gemv4 (gemv, four CTAs an SM), stream (a CTA per SM streaming the "
                        "weights through a ring) or chain (stream, the up GEMM's grid running the down GEMM and "
                        "the combine too)", tok[13]);
        }
        if (e.stage && (e.fp8 || plus || e.splitk || e.gemv ||
                        (e.stage >= MOE_K_WGRAD_UP && (!e.persistent || e.pingpong))))
            return fail(diag, file, line, e.fp8 ? "a backward entry's dtype is bf16 or fp16 (training runs no fp8 "
                                                  "GEMMs)"
                                                : "a backward entry's grid is tile, persist or pingpong (dgrad_down, "
                                                  "dgrad_up) or persist (wgrad_up, wgrad_down), without suffixes",
                        e.fp8 ? tok[4] : tok[13]);
        if (e.evict && e.gemv)
            return fail(diag, file, line, "+ef: the TMA grids only (tile, persist, pingpong, splitkS: the gemv, "
                        "stream and chain grids load no TMA boxes)", tok[13]);
        if (e.cluster && (!e.persistent || e.evict))
            return fail(diag, file, line, "+mc: the persistent grids (persist, pingpong; e4m3 entries persist), "
                        "without +ef", tok[13]);
        char why[128];
        const moe_tile_cfg_t cfg = {.bm = e.bm, .bn = e.bn, .bk = e.bk, .stages = e.stages, .consumers = e.consumers,
                                    .group_m = e.group_m, .persistent = e.persistent,
                                    .pingpong = e.pingpong, .splitk = e.splitk, .gemv = e.gemv};
        if (e.stage ? moe_bgemm_sm90_tile_check((moe_kfamily_t)e.stage, &cfg, why, sizeof why)
            : e.fp8 ? moe_gemm_sm90_fp8_tile_check(&cfg, why, sizeof why)
                    : moe_gemm_sm90_tile_check(&cfg, why, sizeof why))
            return fail(diag, file, line, why, NULL);
        if (e.splitk && moe_tuning_splitk_check(e.splitk, e.hidden, e.ffn, e.bk, why, sizeof why))
            return fail(diag, file, line, why, tok[13]);
        for (int i = 0; i < 2; i++) {
            char *endp;
            double v = strtod(tok[14 + i], &endp);
            if (endp == tok[14 + i] || *endp || !(v > 0))
                return fail(diag, file, line, "best_us and runner_up_us are positive numbers", tok[14 + i]);
            *(i ? &e.runner_up_us : &e.best_us) = v;
        }
        if (strlen(tok[16]) != 10 || tok[16][4] != '-' || tok[16][7] != '-')
            return fail(diag, file, line, "date must be YYYY-MM-DD", tok[16]);
        snprintf(e.date, sizeof e.date, "%s", tok[16]);
        size_t gl = 0; /* the GPU's name: the remaining tokens, joined by single spaces */
        for (int i = 17; i < nt; i++) {
            size_t n = strlen(tok[i]) + (i > 17);
            if (gl + n >= sizeof e.gpu)
                return fail(diag, file, line, "the GPU name is longer than 63 characters", tok[i]);
            snprintf(e.gpu + gl, sizeof e.gpu - gl, "%s%s", i > 17 ? " " : "", tok[i]);
            gl += n;
        }
        for (int i = 0; i < t->n; i++) {
            moe_tuning_entry_t *o = &t->e[i];
            if (o->stage == e.stage && same_key(o, &e)) {
                char m[112];
                snprintf(m, sizeof m, "a second entry for the same %sshape and tokens (the first is line %d)",
                         e.stage ? "backward GEMM, " : "", o->line);
                return fail(diag, file, line, m, NULL);
            }
        }
        if (t->n == cap) {
            cap = cap ? 2 * cap : 16;
            moe_tuning_entry_t *ne = realloc(t->e, (size_t)cap * sizeof *ne);
            if (!ne)
                return fail(diag, file, line, "out of memory", NULL);
            t->e = ne;
        }
        t->e[t->n++] = e;
    }
    /* a backward entry completes a forward one: the dgrads' M tiles are the forward's row tiles */
    for (int i = 0; i < t->n; i++) {
        const moe_tuning_entry_t *b = &t->e[i], *f = b->stage ? forward_of(t, b) : NULL;
        char m[200];
        if (b->stage && !f)
            return fail(diag, file, b->line, "a backward entry needs the forward entry of its shape and tokens "
                        "(its row block is the dgrads' M tile)", NULL);
        if (b->stage && b->stage <= MOE_K_DGRAD_UP && b->bm != f->bm) {
            snprintf(m, sizeof m, "a dgrad's bm must be the row block of the forward entry of its shape and tokens "
                     "(line %d: bm %d)", f->line, f->bm);
            return fail(diag, file, b->line, m, NULL);
        }
    }
    return 0;
}

int moe_tuning_splitk_check(int splitk, int hidden, int ffn, int bk, char *why, size_t n) {
    const int longer = hidden > ffn ? hidden : ffn, kt = (longer + bk - 1) / bk;
    if (splitk <= kt)
        return 0;
    snprintf(why, n, "grid splitk%d: more splits than the longer GEMM's %d k tiles (max(H, F) / bk, rounded up)",
             splitk, kt);
    return 1;
}

int moe_tuning_load(moe_tuning_t *t, const char *path, moe_diag_t *diag) {
    char err[256];
    size_t len;
    memset(t, 0, sizeof *t);
    char *text = moe_read_file(path, 1 << 24, &len, err, sizeof err);
    if (!text) {
        snprintf(diag->msg, sizeof diag->msg, "%s: error: %s", path, err);
        return 1;
    }
    int rc = moe_tuning_parse(t, path, text, len, diag);
    free(text);
    return rc;
}

void moe_tuning_free(moe_tuning_t *t) {
    free(t->e);
    t->e = NULL;
    t->n = 0;
}

static moe_tuning_t default_table;
static int default_state; /* 0 unread, 1 parsed, -1 failed */

const moe_tuning_t *moe_tuning_default(void) {
    if (default_state == 0) {
        moe_diag_t d;
        default_state = moe_tuning_parse(&default_table, moe_embedded_tuning[0].path, moe_embedded_tuning[0].text,
                                         moe_embedded_tuning[0].len, &d) ? -1 : 1;
    }
    return default_state == 1 ? &default_table : NULL;
}

const moe_tuning_entry_t *moe_tuning_find(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch) {
    return moe_tuning_find_tokens(t, s, arch, s->tokens);
}

/* Whether forward entry e is for s's shape on arch, at a bucket <= tokens. */
static int applies(const moe_tuning_entry_t *e, const moe_spec_t *s, moe_arch_t arch, int tokens) {
    return e->stage == 0 && e->experts == s->experts && e->top_k == s->top_k && e->hidden == s->hidden &&
           e->ffn == s->ffn && e->dtype == s->dtype && e->fp8 == moe_spec_fp8(s) && e->arch == arch &&
           e->tokens <= tokens;
}

const moe_tuning_entry_t *moe_tuning_find_tokens(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch,
                                                 int tokens) {
    const moe_tuning_entry_t *best = NULL;
    for (int i = 0; t && i < t->n; i++) {
        const moe_tuning_entry_t *e = &t->e[i];
        if (applies(e, s, arch, tokens) && (!best || e->tokens > best->tokens))
            best = e;
    }
    return best;
}

int moe_tuning_buckets(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch, int *out, int max) {
    int n = 0, lo = 0; /* each round: the smallest bucket above the last one taken */
    for (;;) {
        int next = -1;
        for (int i = 0; t && i < t->n; i++) {
            const moe_tuning_entry_t *e = &t->e[i];
            if (applies(e, s, arch, s->tokens) && (n == 0 || e->tokens > lo) && (next < 0 || e->tokens < next))
                next = e->tokens;
        }
        if (next < 0)
            return n;
        if (n == max) { /* keep the largest: drop the smallest */
            for (int i = 1; i < n; i++)
                out[i - 1] = out[i];
            n--;
        }
        out[n++] = lo = next;
    }
}
