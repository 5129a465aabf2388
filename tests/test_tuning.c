#define _POSIX_C_SOURCE 200809L
/* test_tuning.c — the tuning table: parsing, errors with FILE:LINE, the
 * planner's use of an entry (kernel names), heuristics without one, and the
 * JIT cache key following the chosen tiles. No GPU. (The family table and
 * the plan's other parts: test_plan.c.) */
#include "cache.h"
#include "launch_geom.h"
#include "check.h"
#include "emit.h"
#include "plan.h"
#include "spec.h"
#include "tuning.h"
#include "tune.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

static const char *const mixtral = "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\n"
                                   "tokens = 4096\n";

/* Rebuild *pd (empty or built before) for spec under table. */
static int plan_of(moe_plan_desc_t *pd, const char *spec, const moe_tuning_t *table) {
    moe_spec_t s;
    moe_diag_t d;
    char err[256];
    moe_plan_desc_free(pd);
    if (moe_spec_load(&s, "t.moe", spec, NULL, 0, &d))
        return fprintf(stderr, "%s\n", d.msg), 1;
    return moe_plan_desc_build(pd, &s, table, err, sizeof err) ? (fprintf(stderr, "%s\n", err), 1) : 0;
}

static int parse(moe_tuning_t *t, const char *text, moe_diag_t *d) {
    return moe_tuning_parse(t, "t.tune", text, strlen(text), d);
}

/* Whether the body of kernel `name` in src (from "\nNAME(" to its closing "\n}\n") holds text: 1 or 0; -1 when
 * the kernel is not in src. */
static int kernel_has(const char *src, const char *name, const char *text) {
    char head[256];
    snprintf(head, sizeof head, "\n%s(", name);
    const char *k = src ? strstr(src, head) : NULL, *end = k ? strstr(k, "\n}\n") : NULL;
    if (!end)
        return -1;
    const char *hit = strstr(k, text);
    return hit && hit < end;
}

/* The text of the file at path in buf (cap bytes, 0-terminated); its length, 0 when it cannot be read. */
static size_t read_back(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    const size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return n;
}

static void expect_error(const char *text, const char *msg) {
    moe_tuning_t t;
    moe_diag_t d = {{0}};
    CHECK(parse(&t, text, &d) != 0);
    CHECK_STREQ(d.msg, msg);
    moe_tuning_free(&t);
}

int main(void) {
    CASE("the embedded table parses");
    const moe_tuning_t *embedded = moe_tuning_default();
    CHECK(embedded != NULL && embedded == moe_tuning_default());

    CASE("the embedded table: every example spec's plan keeps every bucket of its shape (none dropped past "
         "MOE_PLAN_MAX_VARIANTS)");
    {
        DIR *dd = opendir("examples/specs");
        CHECK(dd != NULL);
        int specs = 0;
        for (struct dirent *de; dd && (de = readdir(dd));) {
            const size_t len = strlen(de->d_name);
            if (len < 5 || strcmp(de->d_name + len - 4, ".moe"))
                continue;
            char path[512];
            snprintf(path, sizeof path, "examples/specs/%s", de->d_name);
            moe_spec_t s;
            moe_diag_t sd;
            CHECKF(moe_spec_load(&s, path, NULL, NULL, 0, &sd) == 0, "%s", sd.msg);
            int all[64];
            const int n = moe_tuning_buckets(embedded, &s, MOE_ARCH_SM90A, all, 64);
            CHECKF(n <= MOE_PLAN_MAX_VARIANTS, "%s: %d buckets, a plan holds %d", path, n, MOE_PLAN_MAX_VARIANTS);
            specs++;
        }
        if (dd)
            closedir(dd);
        CHECKF(specs >= 10, "%d example specs", specs);
    }

    CASE("parse: comments, blank lines, entries, gpu name with spaces");
    moe_tuning_t t;
    moe_diag_t d;
    const char *tab = "# header\n\n"
                      "8 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile  100.5 110.25 2026-12-02 NVIDIA H200  # small\n"
                      "8 2 4096 12288 bf16 sm_90a 4096 128 256 64 3 2 16 persist 300 310 2026-12-02 NVIDIA H200\n";
    CHECKF(parse(&t, tab, &d) == 0, "%s", d.msg);
    CHECK(t.n == 2);
    if (t.n == 2) {
        CHECK(t.e[0].tokens == 1024 && t.e[0].bm == 64 && t.e[0].bn == 128 && t.e[0].stages == 5);
        CHECK(t.e[0].persistent == 0 && t.e[1].persistent == 1);
        CHECK(t.e[0].best_us == 100.5 && t.e[0].runner_up_us == 110.25 && t.e[0].line == 3);
        CHECK_STREQ(t.e[0].gpu, "NVIDIA H200");
        CHECK_STREQ(t.e[1].date, "2026-12-02");
    }

    CASE("no entry: the heuristics");
    moe_plan_desc_t pd = {0};
    CHECK(plan_of(&pd, mixtral, embedded) == 0);
    CHECK(pd.tuned == NULL);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_m128n256k64s4c2g8_gx");
    /* one CTA per tile: the output is staged in the ring, no staging tile of its own */
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].smem == 4 * (128 + 256) * 64 * 2 + 16 * 4 && !moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.persistent);
    char key_heur[33], key_tuned[33], key_small[33];
    moe_diag_t cd;
    CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, key_heur, &cd) == 0);

    CASE("an entry: the largest bucket <= tokens chooses the sm_90a tiles");
    CHECK(plan_of(&pd, mixtral, &t) == 0);
    CHECK(pd.tuned == &t.e[1]);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_persist_m128n256k64s3c2g16_gx");
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.persistent == 1);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].name, "mx_gemm_down_bf16_sm90a_tma_persist_m128n256k64s3c2g16");
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].smem == 3 * (128 + 256) * 64 * 2 + 128 * (128 + 8) * 2 + 16 * 3);
    CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, key_tuned, &cd) == 0);
    CHECK(strcmp(key_heur, key_tuned) != 0);

    CASE("a smaller bucket sets bm (align) for both arches");
    CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 2000\n", &t) == 0);
    CHECK(pd.tuned == &t.e[0] && pd.align == 64);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s5c1g4_gx");
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].tile.bm == 64 && moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].threads == 256);
    CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, key_small, &cd) == 0);
    CHECK(strcmp(key_small, key_tuned) != 0);

    CASE("below every bucket, or another shape: the heuristics");
    CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 512\n", &t) == 0);
    CHECK(pd.tuned == NULL);
    CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ndtype = 'fp16'\n", &t) == 0);
    CHECK(pd.tuned == NULL);
    CASE("no table: the heuristics");
    CHECK(plan_of(&pd, mixtral, NULL) == 0);
    CHECK(pd.tuned == NULL);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name,
                "mx_gemm_up_swiglu_bf16_sm90a_tma_m128n256k64s4c2g8_gx");
    moe_tuning_free(&t);

    CASE("pingpong: parsed, planned (both GEMMs, persistent, 2 consumers), named, its shared memory");
    {
        const char *pp = "8 2 4096 12288 bf16 sm_90a 1024 64 256 64 4 2 8 pingpong  1 2 2026-12-04 NVIDIA H200\n"
                         "8 2 4096 12288 bf16 sm_90a 4096 128 128 64 4 2 16 pingpong  1 2 2026-12-04 NVIDIA H200\n";
        CHECKF(parse(&t, pp, &d) == 0, "%s", d.msg);
        CHECK(t.n == 2 && t.e[0].pingpong == 1 && t.e[0].persistent == 1 && t.e[0].consumers == 2);
        CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 2000\n",
                      &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(pd.align == 64 && up->threads == 384 && up->tile.pingpong && up->tile.persistent);
        CHECK_STREQ(up->name, "mx_gemm_up_swiglu_bf16_sm90a_tma_pingpong_m64n256k64s4c2g8_gx");
        CHECK_STREQ(down->name, "mx_gemm_down_bf16_sm90a_tma_pingpong_m64n256k64s4c2g8");
        /* the ring, then a staging tile (bm x (min(out cols, 128) + 8) halves) per consumer warpgroup */
        CHECK(up->smem == 4 * (64 + 256) * 64 * 2 + 2 * 64 * (128 + 8) * 2 + 16 * 4);
        CHECK(down->smem == 4 * (64 + 256) * 64 * 2 + 2 * 64 * (128 + 8) * 2 + 16 * 4);
        CHECK(plan_of(&pd, mixtral, &t) == 0);
        up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(pd.align == 128 && up->tile.pingpong && down->tile.pingpong);
        CHECK_STREQ(up->name, "mx_gemm_up_swiglu_bf16_sm90a_tma_pingpong_m128n128k64s4c2g16_gx");
        CHECK(up->smem == 4 * (128 + 128) * 64 * 2 + 2 * 128 * (64 + 8) * 2 + 16 * 4);
        CHECK(down->smem == 4 * (128 + 128) * 64 * 2 + 2 * 128 * (128 + 8) * 2 + 16 * 4);
        /* the sm_80 GEMMs know nothing of it */
        CHECK(!moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].tile.pingpong);
        moe_tuning_free(&t);
    }

    CASE("row blocks of 192 and 256: parsed, the plan's align and tile table, 3 or 4 consumer warpgroups (no "
         "setmaxnreg at 4), the sm_80 GEMMs and the backward's dgrads on the same row block, emitted");
    {
        const char *rb = "8 2 4096 12288 bf16 sm_90a 256 192 128 64 4 3 8 tile  1 2 2026-12-06 NVIDIA H200\n"
                         "8 2 4096 12288 bf16 sm_90a 2048 256 64 64 4 4 8 persist  1 2 2026-12-06 NVIDIA H200\n";
        CHECKF(parse(&t, rb, &d) == 0, "%s", d.msg);
        static const int toks[2] = {1000, 4096}, bms[2] = {192, 256}, bns[2] = {128, 64};
        for (int i = 0; i < 2; i++) {
            char spec[256];
            snprintf(spec, sizeof spec, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\n"
                     "tokens = %d\ntraining = true\n", toks[i]);
            CHECK(plan_of(&pd, spec, &t) == 0);
            const int bm = bms[i];
            const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
            const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
            CHECKF(pd.align == bm && up->tile.bm == bm && up->tile.consumers == bm / 64 &&
                   up->threads == 128 * (bm / 64 + 1) && down->tile.bn == bns[i], "bm %d: align %d, up %s",
                   bm, pd.align, up->name);
            /* the tile table holds the most tiles of any variant: at 4096 tokens the 192-row one's */
            CHECKF(pd.max_tiles == moe_max_tiles(toks[i], 2, 8, 192) && pd.nvariants == i + 1, "bm %d: max_tiles %lld, nvariants %d", bm,
                   (long long)pd.max_tiles, pd.nvariants);
            /* the sm_80 GEMMs read the same tile table: bm rows, warps of 64 rows */
            const moe_kernel_desc_t *up80 = &moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP];
            CHECK(up80->tile.bm == bm && up80->tile.warps_m == bm / 64 && up80->threads == 32 * 4 * (bm / 64));
            /* the dgrads too, with bn 128 (bm 192) or 64 (bm 256); the wgrads keep their 128 x 256 */
            const moe_kernel_desc_t *bg = moe_plan_bgemm(&pd, MOE_ARCH_SM90A);
            CHECK(bg != NULL);
            if (bg)
                CHECKF(bg[0].tile.bm == bm && bg[0].tile.bn == bns[i] && bg[0].tile.consumers == bm / 64 &&
                       bg[2].tile.bm == 128, "dgrad %s, wgrad %s", bg[0].name, bg[2].name);
            moe_buf_t src = {0};
            moe_diag_t ed = {{0}};
            CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
            /* three consumers take registers from the producer; four have none to take */
            const int has = kernel_has(src.data, i ? "mx_gemm_down_bf16_sm90a_tma_persist_m256n64k64s4c4g8"
                                                   : "mx_gemm_down_bf16_sm90a_tma_m192n128k64s4c3g8", "setmaxnreg");
            CHECKF(has == (i == 0), "bm %d: setmaxnreg %s", bm, has < 0 ? "(no kernel)" : has ? "present" : "absent");
            moe_buf_free(&src);
        }
        moe_tuning_free(&t);
    }

    CASE("bm 256 on two consumer warpgroups: planned (384 threads, setmaxnreg), each warpgroup's second m64 block "
         "computed only when it has rows (consume<2> / consume<1>)");
    {
        CHECKF(parse(&t, "8 2 4096 12288 bf16 sm_90a 1 256 128 64 4 2 8 tile  1 2 2026-12-06 NVIDIA H200\n", &d) == 0,
               "%s", d.msg);
        CHECK(plan_of(&pd, mixtral, &t) == 0);
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECKF(pd.align == 256 && down->threads == 384 && down->tile.consumers == 2 &&
               strcmp(down->name, "mx_gemm_down_bf16_sm90a_tma_m256n128k64s4c2g8") == 0, "%s", down->name);
        moe_buf_t src = {0};
        moe_diag_t ed = {{0}};
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        static const char *const down_has[] = {"consume<2>(", "consume<1>(", "rows - cw * WG_ROWS > 64",
                                               "setmaxnreg.dec.sync.aligned.u32 72;",
                                               "setmaxnreg.inc.sync.aligned.u32 216;"};
        for (int i = 0; i < 5; i++)
            CHECKF(kernel_has(src.data, "mx_gemm_down_bf16_sm90a_tma_m256n128k64s4c2g8", down_has[i]) == 1,
                   "down: no %s", down_has[i]);
        /* the gathered up GEMM's producer keeps 88 registers (16 rows a thread; at 72 ptxas spilled) */
        CHECK(kernel_has(src.data, "mx_gemm_up_swiglu_bf16_sm90a_tma_m256n128k64s4c2g8_gx",
                         "setmaxnreg.dec.sync.aligned.u32 88;") == 1 &&
              kernel_has(src.data, "mx_gemm_up_swiglu_bf16_sm90a_tma_m256n128k64s4c2g8_gx",
                         "setmaxnreg.inc.sync.aligned.u32 208;") == 1);
        moe_buf_free(&src);
        moe_tuning_free(&t);
    }

    CASE("splitkS: parsed, planned per GEMM (min(S, k tiles); off for training and EP), named, its workspace");
    {
        /* Qwen3-30B-A3B's shape: up K = 2048 (32 k tiles), down K = 768 (12) */
        const char *sk = "128 8 2048 768 bf16 sm_90a 1 64 128 64 6 1 8 splitk16  1 2 2026-12-04 NVIDIA H200\n"
                         "128 8 2048 768 bf16 sm_90a 128 64 256 64 4 2 8 pingpong  1 2 2026-12-04 NVIDIA H200\n";
        const char *qwen = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        CHECKF(parse(&t, sk, &d) == 0, "%s", d.msg);
        CHECK(t.n == 2 && t.e[0].splitk == 16 && !t.e[0].persistent && !t.e[0].pingpong && t.e[1].splitk == 0);
        CHECK(plan_of(&pd, qwen, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(pd.nvariants == 1 && up->tile.splitk == 16 && down->tile.splitk == 12 && !up->tile.persistent);
        CHECK_STREQ(up->name, "qw_gemm_up_swiglu_bf16_sm90a_tma_splitk16_m64n128k64s6c1g8_gx");
        CHECK_STREQ(down->name, "qw_gemm_down_bf16_sm90a_tma_splitk12_m64n128k64s6c1g8");
        CHECK(up->smem == 6 * (64 + 128) * 64 * 2 + 16 * 6); /* the tile grid's: the output staged in the ring */
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].tile.splitk == 0);
        /* the grid: S CTAs per tile */
        CHECK(moe_sm90_ctas(10, 0, 4, 132) == 40 && moe_sm90_ctas(10, 0, 0, 132) == 10 &&
              moe_sm90_ctas(1000, 1, 0, 132) == 132);
        /* the workspace: partial tiles for the most tiles x N tiles x S, tickets after route's in counts */
        long long tiles = moe_plan_max_tiles(&pd, 64), p_up, t_up, p_dn, t_dn;
        moe_gemm_splitk_space(up, &pd.spec, tiles, &p_up, &t_up);
        moe_gemm_splitk_space(down, &pd.spec, tiles, &p_dn, &t_dn);
        CHECK(t_up == tiles * 12 && p_up == t_up * 16 * 64 * 128 && t_dn == tiles * 16 &&
              p_dn == t_dn * 12 * 64 * 128);
        CHECK(pd.ws[MOE_WS_SPLITK].bytes == 4 * (size_t)(p_up > p_dn ? p_up : p_dn));
        CHECK_STREQ(pd.ws[MOE_WS_SPLITK].name, "splitk");
        CHECK(pd.ws[MOE_WS_COUNTS].bytes == 4 * (size_t)(moe_splitk_tickets_at(128) + t_dn));
        moe_ws_region_t one[MOE_WS_COUNT]; /* a 1-token call: 8 tiles at most */
        moe_fwd_ws_layout(&pd, 1, 0, one);
        CHECK(one[MOE_WS_SPLITK].bytes == 4 * (size_t)(8 * 12 * 16 * 64 * 128));
        /* at 200 tokens: the 1-token bucket's split-K variant, then the 128 bucket's pingpong; the workspace
         * covers the split-K variant at 127 tokens */
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 200\n",
                      &t) == 0);
        CHECK(pd.nvariants == 2 && pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].tile.splitk == 16 &&
              !moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.splitk);
        CHECK(pd.ws[MOE_WS_SPLITK].bytes > 0);
        /* the gathered up GEMM's src_of: an int per row (moe_spec_gather), in the call's layout too */
        CHECK_STREQ(pd.ws[MOE_WS_SRC_OF].name, "src_of");
        CHECK(pd.ws[MOE_WS_SRC_OF].bytes == 4 * (size_t)moe_plan_max_rows(&pd, 200));
        moe_fwd_ws_layout(&pd, 127, 0, one);
        CHECK(one[MOE_WS_SRC_OF].bytes == 4 * (size_t)moe_plan_max_rows(&pd, 127));
        CHECK(one[MOE_WS_SPLITK].bytes == 4 * (size_t)(moe_plan_variant_tiles(&pd, 0, 127) * 16 * 12 * 64 * 128));
        /* training and expert-parallel plans run the entry's tile on the tile grid */
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                           "training = true\n", &t) == 0);
        CHECK(!moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.splitk && pd.ws[MOE_WS_SPLITK].bytes == 0);
        CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name,
                    "qw_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s6c1g8");
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                           "mesh = { ep = 2 }\n", &t) == 0);
        CHECK(!moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].tile.splitk);
        /* nor do they gather (moe_spec_gather: the backward reads xs; an EP rank's rows arrive from its peers) */
        CHECK(!moe_gemm_gathers(&pd.spec, &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP]) &&
              !strstr(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "_gx"));
        /* MOEGEN_GATHER=auto's size rule at the measured calls (docs/PERF.md, sixteenth session, runs 100-101):
         * gathering where it ran faster, not where it ran slower */
        CHECK(moe_gather_tokens(4096, 8, 128, 768) && !moe_gather_tokens(16384, 8, 128, 768));     /* Qwen3 */
        CHECK(moe_gather_tokens(512, 8, 32, 2048) && !moe_gather_tokens(2048, 8, 32, 2048));       /* EP8 rank */
        CHECK(moe_gather_tokens(2048, 4, 128, 2880) && !moe_gather_tokens(4096, 4, 128, 2880));    /* gpt-oss-120b */
        CHECK(!moe_gather_tokens(2048, 2, 8, 14336));                                               /* Mixtral */
        /* router.apply = "input" (the scatter scales the rows) neither; and no src_of region then */
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                           "router = { apply = 'input' }\n", &t) == 0);
        CHECK(!moe_gemm_gathers(&pd.spec, &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP]) &&
              pd.ws[MOE_WS_SRC_OF].bytes == 0);
        /* a GEMM of one k tile stays on the tile grid: F = 40 */
        moe_tuning_free(&t);
        CHECKF(parse(&t, "8 2 72 40 bf16 sm_90a 1 64 128 64 4 1 4 splitk2  1 2 2026-12-04 none\n", &d) == 0, "%s",
               d.msg);
        CHECK(plan_of(&pd, "name = 'tn'\nexperts = 8\ntop_k = 2\nhidden = 72\nffn = 40\ntokens = 16\n", &t) == 0);
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.splitk == 2 &&
              moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].tile.splitk == 0);
        CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].name,
                    "tn_gemm_down_bf16_sm90a_tma_m64n128k64s4c1g4");
        moe_tuning_free(&t);
    }

    CASE("gemv: parsed, planned for both GEMMs (training and EP too, fp8 refused), named, its grid and smem");
    {
        /* Qwen3-30B-A3B's shape: up K = 2048, N = 1536; down K = 768, N = 2048 */
        const char *gv = "128 8 2048 768 bf16 sm_90a 1 64 32 64 2 1 1 gemv  1 2 2026-12-04 NVIDIA H200\n"
                         "128 8 2048 768 bf16 sm_90a 128 64 256 64 4 2 8 pingpong  1 2 2026-12-04 NVIDIA H200\n";
        const char *qwen = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        CHECKF(parse(&t, gv, &d) == 0, "%s", d.msg);
        CHECK(t.n == 2 && t.e[0].gemv == 1 && !t.e[0].persistent && !t.e[0].splitk && t.e[1].gemv == 0);
        CHECK(plan_of(&pd, qwen, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(pd.nvariants == 1 && pd.align == 64 && up->tile.gemv && down->tile.gemv && !up->tile.consumers &&
              up->tile.bn == 32 && up->tile.stages == 2 && up->threads == 256);
        CHECK_STREQ(up->name, "qw_gemm_up_swiglu_bf16_sm90a_gemv_m64n32u2");
        CHECK_STREQ(down->name, "qw_gemm_down_bf16_sm90a_gemv_m64n32u2");
        /* 8 rows x min(K, MOE_GEMV_KC) halves */
        CHECK(up->smem == 8 * 2048 * 2 && down->smem == 8 * 768 * 2 && moe_gemm_gemv_kc(14336, 0) == MOE_GEMV_KC);
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].tile.gemv == 0);
        char grid[16];
        CHECK_STREQ(moe_gemm_sm90_grid_name(&up->tile, grid), "gemv");
        /* the 2D grid of the sm_80 kernels: N slices of bn rows x M tiles; no workspace of its own */
        unsigned g[3];
        moe_family_grid(up, &pd.spec, 1, 8, g);
        CHECK(g[0] == 1536 / 32 && g[1] == 8 && g[2] == 1);
        moe_family_grid(down, &pd.spec, 1, 8, g);
        CHECK(g[0] == 2048 / 32 && g[1] == 8);
        CHECK(pd.ws[MOE_WS_SPLITK].bytes == 0);
        /* at 200 tokens: the 1-token bucket's gemv, then the 128 bucket's pingpong */
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 200\n",
                      &t) == 0);
        CHECK(pd.nvariants == 2 && pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].tile.gemv &&
              moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.pingpong);
        /* training (the U store) and expert-parallel plans keep it: it needs no workspace */
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                           "training = true\n", &t) == 0);
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.gemv);
        CHECK(plan_of(&pd, "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                           "mesh = { ep = 2 }\n", &t) == 0);
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].tile.gemv);
        /* fp8 weights: the entry is the bf16 twin's; the fp8 GEMMs keep their one tile */
        moe_spec_t s8;
        char err[256] = "";
        CHECK(moe_spec_load(&s8, "t.moe", "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\n"
                                          "tokens = 64\narch = 'sm_90a'\nquant = { weights = 'fp8_e4m3' }\n",
                            NULL, 0, &d) == 0);
        moe_plan_desc_free(&pd);
        CHECK(moe_plan_desc_build(&pd, &s8, &t, err, sizeof err) == 0);
        CHECKF(!moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.gemv &&
                   moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.bk == 128,
               "fp8 under a gemv entry: %s", err);
        moe_tuning_free(&t);
    }

    /* gemv3 (three CTAs an SM, rows in chunks of 2) and gemv4 (four, rows one at a time): parsed, planned with
     * their chunks' shared memory, named, their launch bounds in the source; bn < 32, unroll 4 and fp8 refused */
    static const struct {
        const char *grid, *entry, *up, *down, *bounds;
        int gemv, bn, rows;
    } few[] = {
        {"gemv3", "128 8 2048 768 bf16 sm_90a 1 64 32 64 2 1 1 gemv3  1 2 2026-12-06 NVIDIA H200\n",
         "qw_gemm_up_swiglu_bf16_sm90a_gemv3_m64n32u2", "qw_gemm_down_bf16_sm90a_gemv3_m64n32u2",
         "__launch_bounds__(256, 3)  /* <= 80 registers: three CTAs an SM (gemv3) */", 3, 32, 2},
        {"gemv4", "128 8 2048 768 bf16 sm_90a 1 64 64 64 1 1 1 gemv4  1 2 2026-12-06 NVIDIA H100\n",
         "qw_gemm_up_swiglu_bf16_sm90a_gemv4_m64n64u1", "qw_gemm_down_bf16_sm90a_gemv4_m64n64u1",
         "__launch_bounds__(256, 4)  /* <= 64 registers: four CTAs an SM (gemv4) */", 6, 64, 1},
    };
    for (int g = 0; g < 2; g++) {
        CASE(few[g].grid);
        const char *qwen = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        CHECKF(parse(&t, few[g].entry, &d) == 0, "%s", d.msg);
        CHECK(t.n == 1 && t.e[0].gemv == few[g].gemv && !t.e[0].persistent && !t.e[0].splitk);
        CHECK(plan_of(&pd, qwen, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(up->tile.gemv == few[g].gemv && down->tile.gemv == few[g].gemv && up->tile.bn == few[g].bn &&
              up->threads == 256);
        CHECK_STREQ(up->name, few[g].up);
        CHECK_STREQ(down->name, few[g].down);
        /* the chunk's rows x min(K, MOE_GEMV_KC) halves */
        CHECK(up->smem == few[g].rows * 2048 * 2 && down->smem == few[g].rows * 768 * 2);
        char grid[16];
        CHECK_STREQ(moe_gemm_sm90_grid_name(&up->tile, grid), few[g].grid);
        moe_buf_t src = {0};
        moe_diag_t ed;
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        CHECKF(src.data && strstr(src.data, few[g].bounds), "%s: its launch bounds are not in the source",
               few[g].grid);
        moe_buf_free(&src);
        moe_tuning_free(&t);
        for (int i = 0; i < 3; i++) {   /* bn 16, unroll 4, fp8 */
            char bad[160];
            snprintf(bad, sizeof bad, "128 8 2048 768 %s sm_90a 1 64 %d 64 %d 1 1 1 %s  1 2 2026-12-06 x\n",
                     i == 2 ? "e4m3" : "bf16", i == 0 ? 16 : 32, i == 1 ? 4 : 2, few[g].grid);
            CHECKF(parse(&t, bad, &d) != 0 && strstr(d.msg, ":1: error:") && strstr(d.msg, few[g].grid),
                   "%s entry %d accepted, or its message does not name the grid: %s", few[g].grid, i, d.msg);
            moe_tuning_free(&t);
        }
    }
    CASE("a grid named like gemv3 that is none (gemv5) refused");
    CHECKF(parse(&t, "128 8 2048 768 bf16 sm_90a 1 64 32 64 2 1 1 gemv5  1 2 2026-12-06 x\n", &d) != 0 &&
               strstr(d.msg, ":1: error:"), "accepted: %s", d.msg);
    moe_tuning_free(&t);

    CASE("stream: parsed, planned with the ring's shared memory, named, its grid's CTAs; bn, stages, fp8 and a "
         "hidden size not a multiple of 16 refused");
    {
        const char *gv = "128 8 2048 768 bf16 sm_90a 1 64 16 64 4 1 1 stream  1 2 2026-12-06 NVIDIA H200\n";
        const char *qwen = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        CHECKF(parse(&t, gv, &d) == 0, "%s", d.msg);
        CHECK(t.n == 1 && t.e[0].gemv == 4 && !t.e[0].persistent && !t.e[0].splitk);
        CHECK(plan_of(&pd, qwen, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(up->tile.gemv == 4 && down->tile.gemv == 4 && up->tile.bn == 16 && up->threads == 288 &&
              down->threads == 288);
        CHECK_STREQ(up->name, "qw_gemm_up_swiglu_bf16_sm90a_stream_m64n16u4");
        CHECK_STREQ(down->name, "qw_gemm_down_bf16_sm90a_stream_m64n16u4");
        /* 4 stages of 16 rows x min(K, MOE_STREAM_KC) halves, 8 mbarriers, 16 bytes */
        CHECK(up->smem == 4 * 16 * 1024 * 2 + 64 + 16 && down->smem == 4 * 16 * 768 * 2 + 64 + 16);
        char grid[16];
        CHECK_STREQ(moe_gemm_sm90_grid_name(&up->tile, grid), "stream");
        /* as many CTAs an SM as fit 227 KB (1 KB more each), 1 or 2; 132 SMs when unknown */
        CHECK(moe_gemv_stream_ctas(132, up->smem) == 132 && moe_gemv_stream_ctas(132, 64 * 1024) == 264 &&
              moe_gemv_stream_ctas(0, 2048) == 2 * 132 && moe_gemv_stream_ctas(114, 300 * 1024) == 114);
        moe_plan_desc_free(&pd);
        moe_tuning_free(&t);
        static const char *const bad[] = {
            "128 8 2048 768 bf16 sm_90a 1 64 32 64 4 1 1 stream  1 2 2026-12-06 x\n", /* bn 32 */
            "128 8 2048 768 bf16 sm_90a 1 64 16 64 1 1 1 stream  1 2 2026-12-06 x\n", /* 1 stage */
            "128 8 2048 768 bf16 sm_90a 1 64 16 64 9 1 1 stream  1 2 2026-12-06 x\n", /* 9 stages */
            "128 8 2048 768 e4m3 sm_90a 1 64 16 64 4 1 1 stream  1 2 2026-12-06 x\n", /* fp8 */
        };
        for (int i = 0; i < 4; i++) {
            CHECKF(parse(&t, bad[i], &d) != 0 && strstr(d.msg, ":1: error:") && strstr(d.msg, "stream"),
                   "entry %d accepted, or its message does not name stream: %s", i, d.msg);
            moe_tuning_free(&t);
        }
        /* a hidden size of 8 mod 16: the down GEMM's 16-row blocks do not tile H; the plan says so */
        CHECKF(parse(&t, "4 2 2056 768 bf16 sm_90a 1 64 16 64 4 1 1 stream  1 2 2026-12-06 x\n", &d) == 0, "%s", d.msg);
        const char *odd = "name = 'od'\nexperts = 4\ntop_k = 2\nhidden = 2056\nffn = 768\ntokens = 64\n";
        moe_spec_t s;
        char err[512] = "";
        CHECK(moe_spec_load(&s, "od.moe", odd, NULL, 0, &d) == 0);
        CHECKF(moe_plan_desc_build(&pd, &s, &t, err, sizeof err) != 0 && strstr(err, "stream") &&
               strstr(err, "multiple of 16"), "planned, or the error does not say why: %s", err);
        moe_tuning_free(&t);
    }

    CASE("chain: parsed, its up kernel chains (the ring's slots the wider GEMM's stage), its down kernel the stream "
         "grid's; not in a training plan; fp8 and bn refused; its counter within the tickets");
    {
        const char *gv = "128 8 2048 768 bf16 sm_90a 1 64 16 64 2 1 1 chain  1 2 2026-12-06 NVIDIA H200\n";
        const char *qwen = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        CHECKF(parse(&t, gv, &d) == 0, "%s", d.msg);
        CHECK(t.n == 1 && t.e[0].gemv == 5);
        moe_spec_t s;
        CHECK(moe_spec_load(&s, "qw.moe", qwen, NULL, 0, &d) == 0);
        CHECK(plan_of(&pd, qwen, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        const moe_kernel_desc_t *down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK_STREQ(up->name, "qw_gemm_up_swiglu_bf16_sm90a_chain_m64n16u2");
        CHECK_STREQ(down->name, "qw_gemm_down_bf16_sm90a_chain_m64n16u2");
        CHECK(moe_tile_stream(&up->tile) && moe_gemm_chains(&s, up) && !moe_gemm_chains(&s, down));
        /* 2 slots of 16 rows x max(min(H, 1024), min(F, 1024)) halves, 4 mbarriers, 16 bytes; down: its own */
        CHECK(up->smem == 2 * 16 * 1024 * 2 + 32 + 16 && down->smem == 2 * 16 * 768 * 2 + 32 + 16);
        char grid[16];
        CHECK_STREQ(moe_gemm_sm90_grid_name(&up->tile, grid), "chain");
        /* the counter: the int after the stream combine's hidden / 16 tickets, within moe_combine_tickets */
        CHECK(moe_chain_done_at(2048) == 128 && moe_combine_tickets(2048) > moe_chain_done_at(2048) &&
              moe_combine_tickets(16) > moe_chain_done_at(16));
        /* a training plan's up kernel is the stream grid's (it keeps U; its forward combines apart) */
        s.training = 1;
        CHECK(!moe_gemm_chains(&s, up));
        moe_plan_desc_free(&pd);
        moe_tuning_free(&t);
        static const char *const bad[] = {
            "128 8 2048 768 bf16 sm_90a 1 64 32 64 2 1 1 chain  1 2 2026-12-06 x\n", /* bn 32 */
            "128 8 2048 768 e4m3 sm_90a 1 64 16 64 2 1 1 chain  1 2 2026-12-06 x\n", /* fp8 */
        };
        for (int i = 0; i < 2; i++) {
            CHECKF(parse(&t, bad[i], &d) != 0 && strstr(d.msg, ":1: error:") && strstr(d.msg, "chain"),
                   "entry %d accepted, or its message does not name chain: %s", i, d.msg);
            moe_tuning_free(&t);
        }
    }

    CASE("dtype e4m3: an fp8 spec's entries; an fp8 spec takes no other, a bf16 spec none of them");
    {
        moe_tuning_t t;
        moe_diag_t d;
        moe_plan_desc_t pd = {0};
        const char *tab = "128 8 2048 768 bf16 sm_90a 1  64 32 64 2 1 1 gemv  1 2 2026-12-04 H200\n"
                          "128 8 2048 768 e4m3 sm_90a 1  128 256 128 4 2 8 tile  1 2 2026-12-04 H200\n";
        CHECK(parse(&t, tab, &d) == 0 && t.n == 2 && !t.e[0].fp8 && t.e[1].fp8 && t.e[1].dtype == MOE_DTYPE_BF16);
        const char *q = "name = 'qw'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n";
        char q8[400];
        snprintf(q8, sizeof q8, "%sarch = 'sm_90a'\nquant = { weights = 'fp8_e4m3' }\n", q);
        CHECK(plan_of(&pd, q8, &t) == 0);
        const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        CHECKF(up->tile.bm == 128 && up->tile.consumers == 2 && up->tile.bk == 128 && up->threads == 384 &&
                   pd.align == 128 && strstr(up->name, "_e4m3_block_sm90a_tma_m128n256k128s4c2g8"),
               "%s, align %d", up->name, pd.align);
        CHECK(plan_of(&pd, q, &t) == 0); /* the bf16 twin: its gemv entry, not the e4m3 one */
        CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.gemv);
        /* the same key twice is one entry per dtype: bf16 and e4m3 at one bucket are two entries */
        moe_tuning_free(&t);
        CHECK(parse(&t, "8 2 4096 12288 e4m3 sm_90a 1 64 256 128 4 1 8 tile 1 2 2026-12-04 H200\n"
                        "8 2 4096 12288 e4m3 sm_90a 1 128 256 128 4 2 8 tile 1 2 2026-12-04 H200\n", &d) != 0);
        CHECK_STREQ(d.msg, "t.tune:2: error: a second entry for the same shape and tokens (the first is line 1)");
        moe_tuning_free(&t);
        /* the persistent grid: one CTA per SM, a staging tile of bm x 136 halves after the ring */
        CHECK(parse(&t, "128 8 2048 768 e4m3 sm_90a 1  128 256 128 4 2 8 persist  1 2 2026-12-04 H200\n", &d) == 0);
        CHECK(plan_of(&pd, q8, &t) == 0);
        for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++) {
            const moe_kernel_desc_t *g = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[k];
            CHECKF(g->tile.persistent && !g->tile.pingpong && g->tile.consumers == 2 &&
                       g->smem == 4 * (128 + 256) * 128 + 128 * 136 * 2 + 16 * 4 && strstr(g->name, "_tma_persist_m128n256k128s4c2g8"),
                   "%s: smem %d", g->name, g->smem);
        }
        moe_plan_desc_free(&pd);
        moe_tuning_free(&t);
    }

    CASE("variants per call size: one per bucket, the pick, the capacity's as the plan's");
    {
        const char *three = "8 2 4096 12288 bf16 sm_90a 128 64 128 64 6 1 8 tile  1 2 2026-12-04 NVIDIA H200\n"
                            "8 2 4096 12288 bf16 sm_90a 4096 128 256 64 4 2 8 persist  1 2 2026-12-04 NVIDIA H200\n"
                            "8 2 4096 12288 bf16 sm_90a 16384 128 256 64 3 2 8 persist  1 2 2026-12-04 NVIDIA H200\n"
                            "8 2 4096 12288 bf16 sm_90a 32768 64 256 64 4 1 8 tile  1 2 2026-12-04 NVIDIA H200\n";
        const char *big = "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 16384\n";
        CHECKF(parse(&t, three, &d) == 0, "%s", d.msg);
        CHECK(plan_of(&pd, big, &t) == 0);
        CHECK(pd.nvariants == 3); /* the 32768 bucket is past the spec's tokens */
        static const int bucket[3] = {128, 4096, 16384}, align[3] = {64, 128, 128};
        static const char *const up90[3] = {"mx_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s6c1g8_gx",
                                            "mx_gemm_up_swiglu_bf16_sm90a_tma_persist_m128n256k64s4c2g8_gx",
                                            "mx_gemm_up_swiglu_bf16_sm90a_tma_persist_m128n256k64s3c2g8_gx"};
        static const char *const down90[3] = {"mx_gemm_down_bf16_sm90a_tma_m64n128k64s6c1g8",
                                              "mx_gemm_down_bf16_sm90a_tma_persist_m128n256k64s4c2g8",
                                              "mx_gemm_down_bf16_sm90a_tma_persist_m128n256k64s3c2g8"};
        static const char *const plan_k[3] = {"mx_permute_plan_e8_a64", "mx_permute_plan_e8_a128",
                                              "mx_permute_plan_e8_a128"};
        for (int v = 0; v < 3 && v < pd.nvariants; v++) {
            const moe_plan_variant_t *pv = &pd.variants[v];
            CHECKF(pv->bucket == bucket[v] && pv->align == align[v] && pv->tuned == &t.e[v], "variant %d", v);
            CHECK_STREQ(pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].name, up90[v]);
            CHECK_STREQ(pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_DOWN].name, down90[v]);
            CHECK_STREQ(pv->kernels[MOE_ARCH_SM90A][MOE_K_PERMUTE_PLAN].name, plan_k[v]);
            CHECK_STREQ(pv->kernels[MOE_ARCH_SM80][MOE_K_PERMUTE_PLAN].name, plan_k[v]);
            /* the sm_80 GEMMs follow the variant's row block; route, scatter and combine are the plan's */
            CHECK(pv->kernels[MOE_ARCH_SM80][MOE_K_GEMM_UP].tile.bm == align[v]);
            CHECK(pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].tile.bm == align[v]);
            for (int k = 0; k < MOE_K_COUNT; k++)
                if (k != MOE_K_PERMUTE_PLAN && k != MOE_K_GEMM_UP && k != MOE_K_GEMM_DOWN)
                    CHECK_STREQ(pv->kernels[MOE_ARCH_SM90A][k].name, moe_plan_kernels(&pd, MOE_ARCH_SM90A)[k].name);
        }
        /* the capacity's variant is the plan's (align, tuned, kernels) */
        CHECK(pd.align == 128 && pd.tuned == &t.e[2]);
        CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, up90[2]);
        /* the pick: the largest bucket <= T, clamped to the first */
        static const int at[][2] = {{0, 0},    {1, 0},    {7, 0},        {127, 0},     {128, 0},
                                    {129, 0},  {4095, 0}, {4096, 1},     {4097, 1},    {16383, 1},
                                    {16384, 2}};
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
            CHECKF(moe_plan_pick_variant(&pd, at[i][0]) == at[i][1], "T = %d: variant %d, want %d", at[i][0],
                   moe_plan_pick_variant(&pd, at[i][0]), at[i][1]);
        /* the workspace for T covers the variant T runs, and grows with T (so it serves every call of fewer) */
        static const int ts[] = {1, 2, 3, 4, 5, 8, 63, 64, 65, 100, 127, 128, 129, 1000, 4095, 4096, 4097, 8000, 16383,
                                 16384};
        size_t prev = 0;
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            const int T = ts[i], v = moe_plan_pick_variant(&pd, T), a = pd.variants[v].align;
            moe_ws_region_t ws[MOE_WS_COUNT];
            const size_t bytes = moe_fwd_ws_layout(&pd, T, 0, ws);
            const long long rows = moe_max_rows(T, 2, 8, a), tiles = moe_max_tiles(T, 2, 8, a);
            CHECKF(ws[MOE_WS_XS].bytes >= (size_t)rows * 4096 * 2 && ws[MOE_WS_HBUF].bytes >= (size_t)rows * 12288 * 2,
                   "T = %d: xs %zu bytes for %lld rows of variant %d", T, ws[MOE_WS_XS].bytes, rows, v);
            CHECKF(ws[MOE_WS_TILES].bytes >= (size_t)tiles * 16, "T = %d: tiles %zu bytes for %lld", T,
                   ws[MOE_WS_TILES].bytes, tiles);
            CHECK(moe_plan_variant_tiles(&pd, v, T) == tiles);
            CHECKF(bytes >= prev, "T = %d: %zu bytes, fewer than a smaller call's %zu", T, bytes, prev);
            prev = bytes;
            for (int u = 0; u <= v; u++) /* the rows and tiles of every variant a call of T or fewer runs */
                CHECK(moe_plan_max_rows(&pd, T) >= moe_max_rows(T, 2, 8, pd.variants[u].align) &&
                      moe_plan_max_tiles(&pd, T) >= moe_max_tiles(T, 2, 8, pd.variants[u].align));
        }
        /* the capacity's workspace (the vendored launcher's) covers every variant */
        for (int v = 0; v < pd.nvariants; v++)
            CHECK(pd.ws[MOE_WS_XS].bytes >= (size_t)moe_max_rows(16384, 2, 8, pd.variants[v].align) * 4096 * 2 &&
                  pd.ws[MOE_WS_TILES].bytes >= (size_t)moe_max_tiles(16384, 2, 8, pd.variants[v].align) * 16);
        CHECK(pd.max_tiles == moe_max_tiles(16384, 2, 8, 64) && pd.max_rows == moe_max_rows(16384, 2, 8, 128));

        CASE("variants: emitted once each, the vendored launcher picks, the manifest lists them");
        moe_buf_t src = {0};
        moe_diag_t ed = {{0}};
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        const char *text = src.data ? src.data : "";
        const char *names[] = {up90[0], up90[1], up90[2], down90[0], down90[1], down90[2], plan_k[0], plan_k[1],
                               "mx_permute_scatter_bf16_h4096k2_gx"}; /* arch = sm_90a: no sm_80 kernels */
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char def[200];
            snprintf(def, sizeof def, "\n%s(", names[i]); /* a kernel's definition: its name opens a line */
            int n = 0;
            for (const char *at2 = text; (at2 = strstr(at2, def)); at2++)
                n++;
            CHECKF(n == 1, "%s defined %d times", names[i], n);
        }
        CHECK(strstr(text, "static int mx_variant(int tokens) {\n") && strstr(text, "    if (tokens >= 16384) return 2;\n") &&
              strstr(text, "    if (tokens >= 4096) return 1;\n"));
        CHECK(strstr(text, "mx_variant_align[3] = {64, 128, 128};") != NULL);
        moe_buf_free(&src);
        moe_fileset_t fs = {0};
        CHECKF(moe_emit_files(&pd, NULL, &fs, &ed) == 0, "%s", ed.msg);
        const char *man = NULL;
        for (int i = 0; i < fs.nfiles; i++)
            if (strcmp(fs.files[i].path, "manifest.json") == 0)
                man = fs.files[i].data.data;
        CHECK(man && strstr(man, "{\"bucket\": 128, \"from_tokens\": 1, \"align\": 64, \"pdl\": false, \"kernels\": {\"sm_90a\": "
                                 "[\"mx_permute_plan_e8_a64\", \"mx_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s6c1g8_gx\""));
        CHECK(man && strstr(man, "{\"bucket\": 16384, \"from_tokens\": 16384, \"align\": 128"));
        moe_fileset_free(&fs);

        CASE("variants: the cache key holds every variant's kernels");
        char k3[33], k1[33];
        CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, k3, &cd) == 0);
        moe_tuning_t last = {.file = "(last)", .e = &t.e[2], .n = 1};
        CHECK(plan_of(&pd, big, &last) == 0 && pd.nvariants == 1);
        CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, k1, &cd) == 0);
        CHECK(strcmp(k3, k1) != 0);

        CASE("variants: equal neighbours are one (no duplicate kernels)");
        moe_tuning_t same;
        const char *dup = "8 2 4096 12288 bf16 sm_90a 128 64 128 64 6 1 8 tile  1 2 2026-12-04 NVIDIA H200\n"
                          "8 2 4096 12288 bf16 sm_90a 4096 128 256 64 4 2 8 persist  1 2 2026-12-04 NVIDIA H200\n"
                          "8 2 4096 12288 bf16 sm_90a 16384 128 256 64 4 2 8 persist  3 4 2026-12-04 NVIDIA H200\n";
        CHECKF(parse(&same, dup, &d) == 0, "%s", d.msg);
        CHECK(plan_of(&pd, big, &same) == 0);
        CHECK(pd.nvariants == 2 && pd.variants[0].bucket == 128 && pd.variants[1].bucket == 4096);
        CHECK(moe_plan_pick_variant(&pd, 16384) == 1 && moe_plan_pick_variant(&pd, 4095) == 0);
        CHECK(pd.tuned == &same.e[1]); /* the first of the equal entries */
        /* a spec below the second bucket: one variant, the first bucket's */
        CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 4000\n",
                      &same) == 0);
        CHECK(pd.nvariants == 1 && pd.variants[0].bucket == 128 && pd.align == 64);
        moe_tuning_free(&same);

        CASE("variants: +pdl parsed; equal kernels with and without it are two variants; the vendored table, the "
             "manifest");
        moe_tuning_t lo;
        const char *pdl = "8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 gemv3+pdl  1 2 2026-12-07 NVIDIA H100  # a\n"
                          "8 2 4096 12288 bf16 sm_90a 2 64 32 64 2 1 1 gemv3  1 2 2026-12-07 NVIDIA H100\n"
                          "8 2 4096 12288 bf16 sm_90a 8 64 32 64 2 1 1 gemv3  1 2 2026-12-07 NVIDIA H100\n"
                          "8 2 4096 12288 bf16 sm_90a 128 64 128 64 6 1 8 tile+pdl  1 2 2026-12-07 NVIDIA H100\n";
        CHECKF(parse(&lo, pdl, &d) == 0, "%s", d.msg);
        CHECK(lo.n == 4 && lo.e[0].pdl == 1 && lo.e[0].gemv == 3 && lo.e[1].pdl == 0 && lo.e[3].pdl == 1 &&
              lo.e[3].gemv == 0 && !lo.e[3].persistent && !strcmp(lo.e[3].gpu, "NVIDIA H100"));
        CHECK(plan_of(&pd, big, &lo) == 0);
        CHECK(pd.nvariants == 3 && pd.variants[0].bucket == 1 && pd.variants[0].pdl == 1 &&
              pd.variants[1].bucket == 2 && pd.variants[1].pdl == 0 && pd.variants[2].bucket == 128 &&
              pd.variants[2].pdl == 1);
        CHECK_STREQ(pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].name,
                    pd.variants[1].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].name);
        CHECK(moe_plan_pick_variant(&pd, 1) == 0 && moe_plan_pick_variant(&pd, 7) == 1 &&
              moe_plan_pick_variant(&pd, 8) == 1);
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        text = src.data ? src.data : "";
        CHECK(strstr(text, "mx_variant_pdl[3] = {true, false, true};") != NULL);
        CHECK(strstr(text, "const bool pdl = dev->pdl == 1 || (dev->pdl == 2 && mx_variant_pdl[v]);") != NULL);
        /* never without the sm_90a kernels (their moe_pdl_begin waits; the sm_80 ones' is empty) */
        CHECK(strstr(text, "    if (!d->use90) /* the sm_80 kernels' moe_pdl_begin is empty") != NULL);
        moe_buf_free(&src);
        CHECKF(moe_emit_files(&pd, NULL, &fs, &ed) == 0, "%s", ed.msg);
        man = NULL;
        for (int i = 0; i < fs.nfiles; i++)
            if (strcmp(fs.files[i].path, "manifest.json") == 0)
                man = fs.files[i].data.data;
        CHECK(man && strstr(man, "{\"bucket\": 1, \"from_tokens\": 1, \"align\": 64, \"pdl\": true,") &&
              strstr(man, "{\"bucket\": 2, \"from_tokens\": 2, \"align\": 64, \"pdl\": false,"));
        moe_fileset_free(&fs);
        moe_tuning_free(&lo);

        CASE("variants: +ef parsed (with +pdl, either order); the up GEMM alone gets it: its name and its weight "
             "loads, the down GEMM's kernel the same as without");
        moe_tuning_t ef;
        const char *eft = "8 2 4096 12288 bf16 sm_90a 128 64 128 64 6 1 8 tile  1 2 2026-12-07 NVIDIA H100\n"
                          "8 2 4096 12288 bf16 sm_90a 512 64 128 64 6 1 8 tile+ef+pdl  1 2 2026-12-07 NVIDIA H100\n"
                          "8 2 4096 12288 bf16 sm_90a 1024 128 256 64 4 2 8 persist+pdl+ef  1 2 2026-12-07 H100\n";
        CHECKF(parse(&ef, eft, &d) == 0, "%s", d.msg);
        CHECK(ef.n == 3 && !ef.e[0].evict && !ef.e[0].pdl && ef.e[1].evict && ef.e[1].pdl && ef.e[2].evict &&
              ef.e[2].pdl && ef.e[2].persistent && !ef.e[1].persistent);
        CHECK(plan_of(&pd, big, &ef) == 0);
        CHECK(pd.nvariants == 3);
        if (pd.nvariants == 3) {
            const moe_kernel_desc_t *u0 = &pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP],
                                    *u1 = &pd.variants[1].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP],
                                    *d0 = &pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_DOWN],
                                    *d1 = &pd.variants[1].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_DOWN];
            CHECK(!u0->tile.evict && u1->tile.evict && !d1->tile.evict);
            CHECK(strstr(u1->name, "_ef") && !strstr(u0->name, "_ef") && !strstr(d1->name, "_ef"));
            CHECK_STREQ(d0->name, d1->name); /* the same down kernel: the bucket split by the up GEMM alone */
        }
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        text = src.data ? src.data : "";
        {   /* the hinted loads in the +ef up kernels only: two of them (512 and 1024), the producer's B boxes */
            int pol = 0;
            for (const char *q = text; (q = strstr(q, "createpolicy.fractional.L2::evict_first.b64")); q++)
                pol++;
            CHECK(pol == 2);
            CHECK(strstr(text, "tma_load_pol(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * 64, brow, full, pol_b);"));
        }
        moe_buf_free(&src);
        CHECKF(moe_emit_files(&pd, NULL, &fs, &ed) == 0, "%s", ed.msg);
        man = NULL;
        for (int i = 0; i < fs.nfiles; i++)
            if (strcmp(fs.files[i].path, "manifest.json") == 0)
                man = fs.files[i].data.data;
        {   /* the manifest's tile says it, for the up kernels of the +ef buckets alone */
            int n = 0;
            for (const char *q = man; q && (q = strstr(q, "\"evict_first\": true")); q++)
                n++;
            CHECK(man && n == 2);
        }
        moe_fileset_free(&fs);
        moe_tuning_free(&ef);

        CASE("variants: +mc parsed (with +pdl, either order); both GEMMs of its buckets run in CTA pairs, never "
             "gathering: their names, cluster dims, multicast loads, the launcher's pair grid and the manifest");
        moe_tuning_t mc;
        const char *mct = "8 2 4096 12288 bf16 sm_90a 128 64 128 64 6 1 8 persist  1 2 2026-12-07 NVIDIA H100\n"
                          "8 2 4096 12288 bf16 sm_90a 512 64 256 64 4 2 8 pingpong+mc+pdl  1 2 2026-12-07 H100\n"
                          "8 2 4096 12288 bf16 sm_90a 1024 128 256 64 4 2 8 persist+pdl+mc  1 2 2026-12-07 H100\n";
        CHECKF(parse(&mc, mct, &d) == 0, "%s", d.msg);
        CHECK(mc.n == 3 && !mc.e[0].cluster && mc.e[1].cluster && mc.e[1].pdl && mc.e[1].pingpong &&
              mc.e[2].cluster && mc.e[2].pdl && !mc.e[2].pingpong);
        CHECK(plan_of(&pd, big, &mc) == 0);
        CHECK(pd.nvariants == 3);
        if (pd.nvariants == 3) {
            for (int v = 0; v < 3; v++)
                for (int f = MOE_K_GEMM_UP; f <= MOE_K_GEMM_DOWN; f += MOE_K_GEMM_DOWN - MOE_K_GEMM_UP) {
                    const moe_kernel_desc_t *k = &pd.variants[v].kernels[MOE_ARCH_SM90A][f];
                    CHECK(k->tile.cluster == (v > 0));
                    CHECK((strstr(k->name, "_mc") != NULL) == (v > 0));
                }
            const moe_kernel_desc_t *u0 = &pd.variants[0].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP],
                                    *u1 = &pd.variants[1].kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP];
            CHECK(moe_gemm_gathers(&pd.spec, u0) && !moe_gemm_gathers(&pd.spec, u1)); /* pairs never gather */
            CHECK(strstr(u0->name, "_gx") && !strstr(u1->name, "_gx"));
        }
        CHECKF(moe_emit_source(&pd, NULL, &src, &ed) == 0, "%s", ed.msg);
        text = src.data ? src.data : "";
        {   /* four kernels in pairs (two buckets' up and down), each loading its B tile into both CTAs */
            int dims = 0, pair_loads = 0;
            for (const char *q = text; (q = strstr(q, "__launch_bounds__(384, 1) MOE_CTA_PAIR\n")); q++)
                dims++;
            for (const char *q = text; (q = strstr(q, "tma_load_pair(so + A_BYTES + a * (BN * 128), mb, kt * BK + "
                                                  "a * 64, brow, full);")); q++)
                pair_loads++;
            CHECK(dims == 4 && pair_loads == 4);
            CHECK(strstr(text, "bar_init(sbase + BAR_OFF + (STAGES + s) * 8, 128 + 128 / 32);") &&
                  strstr(text, "bar_init(sbase + BAR_OFF + (STAGES + s) * 8, CTHREADS + CTHREADS / 32);"));
        }
        moe_buf_free(&src);
        CHECKF(moe_emit_files(&pd, NULL, &fs, &ed) == 0, "%s", ed.msg);
        man = NULL;
        int pair_grids = 0;
        for (int i = 0; i < fs.nfiles; i++) {
            if (strcmp(fs.files[i].path, "manifest.json") == 0)
                man = fs.files[i].data.data;
            for (const char *q = fs.files[i].data.data; q && (q = strstr(q, "moe_sm90_pair_ctas((unsigned long long)"
                                                                          "tiles_y, ")); q++)
                pair_grids++; /* the vendored launcher sizes the pair kernels' grids by their pairs */
        }
        CHECK(pair_grids == 4);
        {
            int n = 0;
            for (const char *q = man; q && (q = strstr(q, "\"cluster\": 2")); q++)
                n++;
            CHECK(man && n == 4);
        }
        moe_fileset_free(&fs);
        moe_tuning_free(&mc);
        CHECK(moe_sm90_pair_ctas(5, 3, 4, 132) == 8 && moe_sm90_pair_ctas(5, 3, 0, 132) == 18 &&
              moe_sm90_pair_ctas(5, 3, 0, 8) == 8 && moe_sm90_pair_ctas(0, 3, 4, 132) == 2 &&
              moe_sm90_pair_ctas(200, 100, 132, 132) == 132 && /* an answer past half the SMs is capped there */
              moe_sm90_pair_ctas(200, 100, 60, 132) == 120 && moe_sm90_pair_ctas(200, 100, 9, 0) == 18);

        CASE("variants: a training plan's saved region, the cuDNN path's tile table cover the capacity's variant");
        CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 16384\n"
                           "training = true\n", &t) == 0);
        CHECK(pd.nvariants == 3 && pd.variants[0].align == 64 && pd.align == 128);
        for (int T = 1; T <= 16384; T = T * 3 + 1) { /* below 128 the pick's bm is 64, the capacity's (run) 128 */
            moe_ws_region_t sv[MOE_SV_COUNT], bw[MOE_BW_COUNT];
            moe_saved_layout(&pd, T, 0, sv);
            moe_bwd_ws_layout(&pd, T, 1, bw);
            for (int a = 64; a <= 128; a += 64) {
                CHECKF(sv[MOE_SV_XS].bytes >= (size_t)moe_max_rows(T, 2, 8, a) * 4096 * 2 &&
                           sv[MOE_SV_TILES].bytes >= (size_t)moe_max_tiles(T, 2, 8, a) * 16 &&
                           bw[MOE_BW_DU].bytes >= (size_t)moe_max_rows(T, 2, 8, a) * 12288 * 4,
                       "T = %d: the saved region or the backward's workspace does not hold bm %d's rows", T, a);
            }
        }
        moe_tuning_t rev; /* the capacity's row block smaller than a small call's */
        const char *revt = "8 2 4096 12288 bf16 sm_90a 128 128 256 64 4 2 8 tile  1 2 2026-12-04 NVIDIA H200\n"
                           "8 2 4096 12288 bf16 sm_90a 4096 64 256 64 4 1 8 tile  1 2 2026-12-04 NVIDIA H200\n";
        CHECKF(parse(&rev, revt, &d) == 0, "%s", d.msg);
        CHECK(plan_of(&pd, big, &rev) == 0 && pd.nvariants == 2 && pd.align == 64);
        {
            moe_ws_region_t ws[MOE_WS_COUNT], wf[MOE_WS_COUNT];
            moe_fwd_ws_layout(&pd, 1000, 0, ws); /* 1000 tokens run bm 128 */
            moe_fwd_ws_layout(&pd, 1000, 1, wf); /* with cuDNN, the capacity's bm 64 */
            CHECK(ws[MOE_WS_TILES].bytes >= (size_t)moe_max_tiles(1000, 2, 8, 128) * 16 &&
                  ws[MOE_WS_XS].bytes >= (size_t)moe_max_rows(1000, 2, 8, 128) * 4096 * 2);
            CHECK(wf[MOE_WS_TILES].bytes >= (size_t)moe_max_tiles(1000, 2, 8, 64) * 16);
            CHECK(moe_max_tiles(1000, 2, 8, 64) > moe_max_tiles(1000, 2, 8, 128));
        }
        moe_tuning_free(&rev);

        CASE("variants: an expert-parallel spec keeps the capacity's alone");
        CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 16384\n"
                           "mesh = { ep = 2 }\n", &t) == 0);
        CHECK(pd.nvariants == 1 && pd.variants[0].bucket == 16384 && pd.tuned == &t.e[2]);
        moe_tuning_free(&t);
    }

    CASE("every sm_90a tile the check accepts, the template emits (both GEMMs, each grid, N tails)");
    {
        int accepted = 0;
        for (int bm = 64; bm <= 256; bm += 64)
            for (int bn = 64; bn <= 256; bn += 64)
                for (int stages = 2; stages <= 8; stages += 3)
                    for (int grid = 0; grid < 6; grid++) { /* tile, persist, pingpong, splitk3; bm 256 on two
                                                              * consumers: tile, persist */
                        if (grid >= 4 && bm != 256)
                            continue;
                        moe_tuning_entry_t e = {.experts = 8, .top_k = 2, .hidden = 264, .ffn = 200,
                                                .dtype = MOE_DTYPE_BF16, .arch = MOE_ARCH_SM90A, .tokens = 1,
                                                .bm = bm, .bn = bn, .bk = 64, .stages = stages,
                                                .consumers = grid == 2 || grid >= 4 ? 2 : bm / 64, .group_m = 8,
                                                .persistent = grid == 1 || grid == 2 || grid == 5,
                                                .pingpong = grid == 2, .splitk = grid == 3 ? 3 : 0};
                        const moe_tile_cfg_t c = {.bm = bm, .bn = bn, .bk = 64, .stages = stages,
                                                  .consumers = e.consumers, .group_m = 8, .persistent = e.persistent,
                                                  .pingpong = e.pingpong, .splitk = e.splitk};
                        char why[128];
                        if (moe_gemm_sm90_tile_check(&c, why, sizeof why))
                            continue;
                        accepted++;
                        moe_tuning_t one = {.file = "(tile)", .e = &e, .n = 1};
                        moe_buf_t src = {0};
                        moe_diag_t ed = {{0}};
                        int bad = plan_of(&pd, "name = 'tl'\nexperts = 8\ntop_k = 2\nhidden = 264\nffn = 200\n"
                                               "arch = 'sm_90a'\n", &one);
                        if (!bad)
                            bad = moe_emit_source(&pd, NULL, &src, &ed);
                        CHECKF(!bad, "m%dn%ds%d %s: %s", bm, bn, stages,
                               (const char *[]){"tile", "persist", "pingpong", "splitk3", "tile c2", "persist c2"}[grid],
                               ed.msg);
                        moe_buf_free(&src);
                    }
        CHECKF(accepted >= 20, "only %d tiles accepted", accepted);
        /* and every gemv tile (bf16 and fp16, the clamped SwiGLU with biases, training's U store; K of 264
         * and 4360: one staging pass and two) */
        int gemv = 0;
        for (int bm = 64; bm <= 128; bm += 64)
            for (int bn = 4; bn <= 512; bn *= 2)
                for (int u = 1; u <= 4; u++)
                    for (int hi = 0; hi < 2; hi++) {
                        const int H = hi ? 4360 : 264;
                        moe_tuning_entry_t e = {.experts = 8, .top_k = 2, .hidden = H, .ffn = 200,
                                                .dtype = hi ? MOE_DTYPE_FP16 : MOE_DTYPE_BF16,
                                                .arch = MOE_ARCH_SM90A, .tokens = 1, .bm = bm, .bn = bn, .bk = 64,
                                                .stages = u, .consumers = 1, .group_m = 1, .gemv = 1};
                        const moe_tile_cfg_t c = {.bm = bm, .bn = bn, .bk = 64, .stages = u, .consumers = 1,
                                                  .group_m = 1, .gemv = 1};
                        char why[128];
                        if (moe_gemm_sm90_tile_check(&c, why, sizeof why))
                            continue;
                        gemv++;
                        moe_tuning_t one = {.file = "(tile)", .e = &e, .n = 1};
                        moe_buf_t src = {0};
                        moe_diag_t ed = {{0}};
                        char spec[256];
                        snprintf(spec, sizeof spec, "name = 'tl'\nexperts = 8\ntop_k = 2\nhidden = %d\nffn = 200\n"
                                 "arch = 'sm_90a'\ndtype = '%s'\nffn_bias = true\ntraining = true\n"
                                 "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", H,
                                 hi ? "fp16" : "bf16");
                        int bad = plan_of(&pd, spec, &one);
                        if (!bad)
                            bad = moe_emit_source(&pd, NULL, &src, &ed);
                        CHECKF(!bad, "gemv m%dn%du%d H %d: %s", bm, bn, u, H, ed.msg);
                        CHECKF(bad || strstr(src.data, "_sm90a_gemv_"), "gemv m%dn%du%d: no gemv kernel", bm, bn, u);
                        moe_buf_free(&src);
                    }
        CHECKF(gemv == 2 * 6 * 3 * 2, "%d gemv tiles accepted; 72 (bm 64, 128 x bn 8..256 x unroll 1, 2, 4 x 2 "
               "shapes)", gemv);
    }

    CASE("the GPU tests' tables (tests/tune) parse, every entry on their grid");
    static const char *const grids[6] = {"tests/tune/tile.tune", "tests/tune/persist.tune",
                                         "tests/tune/pingpong.tune", "tests/tune/splitk.tune",
                                         "tests/tune/gemv.tune", "tests/tune/rowblock.tune"};
    for (int g = 0; g < 6; g++) {
        moe_tuning_t gt;
        moe_diag_t gd;
        CHECKF(moe_tuning_load(&gt, grids[g], &gd) == 0, "%s", gd.msg);
        CHECK(gt.n >= 10);
        for (int i = 0; i < gt.n; i++)
            CHECK(g == 5 ? gt.e[i].bm >= 192 && !gt.e[i].pingpong && !gt.e[i].gemv
                         : gt.e[i].persistent == (g == 1 || g == 2) && gt.e[i].pingpong == (g == 2) &&
                               (gt.e[i].splitk >= 2) == (g == 3) && (gt.e[i].gemv != 0) == (g == 4));
        moe_tuning_free(&gt);
    }

    CASE("the A/B tables gemv3.tune and gemv4.tune parse, four entries on their grid each");
    for (int g = 0; g < 2; g++) {
        moe_tuning_t gt;
        moe_diag_t gd;
        CHECKF(moe_tuning_load(&gt, g ? "tests/tune/gemv4.tune" : "tests/tune/gemv3.tune", &gd) == 0, "%s", gd.msg);
        int on = 0;
        for (int i = 0; i < gt.n; i++)
            on += gt.e[i].gemv == (g ? 6 : 3);
        CHECKF(on == 4, "%s: %d entries on its grid", g ? "gemv4.tune" : "gemv3.tune", on);
        moe_tuning_free(&gt);
    }

    CASE("the fp8 GPU tests' tables parse: e4m3 entries on the tile grid (fp8.tune), the persistent one (fp8p.tune) "
         "and that one in CTA pairs (fp8pairs.tune)");
    for (int g = 0; g < 3; g++) {
        static const char *const fp8_tables[] = {"tests/tune/fp8.tune", "tests/tune/fp8p.tune",
                                                 "tests/tune/fp8pairs.tune"};
        moe_tuning_t gt;
        moe_diag_t gd;
        CHECKF(moe_tuning_load(&gt, fp8_tables[g], &gd) == 0, "%s", gd.msg);
        CHECK(gt.n >= 10);
        for (int i = 0; i < gt.n; i++)
            CHECK(gt.e[i].fp8 && gt.e[i].persistent == (g > 0) && gt.e[i].cluster == (g == 2) && !gt.e[i].pingpong &&
                  gt.e[i].bk == 128);
        moe_tuning_free(&gt);
    }

    CASE("tests/tune/fp8pairs.tune: an fp8 spec's GEMMs run in CTA pairs, the fp8 consumer releasing its stages to "
         "both CTAs; +mc on an e4m3 tile entry is refused");
    {
        moe_tuning_t gt;
        moe_diag_t gd;
        moe_plan_desc_t pd8 = {0};
        CHECKF(moe_tuning_load(&gt, "tests/tune/fp8pairs.tune", &gd) == 0, "%s", gd.msg);
        CHECK(plan_of(&pd8, "name = 'q8'\nexperts = 128\ntop_k = 8\nhidden = 2048\nffn = 768\ntokens = 64\n"
                            "arch = 'sm_90a'\nquant = { weights = 'fp8_e4m3' }\n", &gt) == 0);
        for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++) {
            const moe_kernel_desc_t *g = &moe_plan_kernels(&pd8, MOE_ARCH_SM90A)[k];
            CHECKF(g->tile.cluster && g->tile.persistent && strstr(g->name, "_e4m3_block_sm90a_tma_persist_") &&
                       strstr(g->name, "_mc"), "%s", g->name);
        }
        moe_buf_t src8 = {0};
        moe_diag_t ed8;
        CHECKF(moe_emit_source(&pd8, NULL, &src8, &ed8) == 0, "%s", ed8.msg);
        const char *t8 = src8.data ? src8.data : "";
        int pairs = 0, fp8_release = 0;
        for (const char *q = t8; (q = strstr(q, "__launch_bounds__(256, 1) MOE_CTA_PAIR\n")); q++)
            pairs++; /* one consumer warpgroup: 256 threads */
        for (const char *q = t8; (q = strstr(q, "(i & 4 ? u : g));\n        }\n"
                                                "        release(sbase + BAR_OFF + (STAGES + s) * 8);\n")); q++)
            fp8_release++; /* consume_fp8's stage release (after the promotion), one per pair kernel */
        CHECKF(pairs == 2 && fp8_release == 2, "%d pair kernels, %d fp8 pair releases", pairs, fp8_release);
        moe_buf_free(&src8);
        moe_plan_desc_free(&pd8);
        moe_tuning_free(&gt);
        moe_tuning_t t8t;
        CHECK(parse(&t8t, "128 8 2048 768 e4m3 sm_90a 1  128 256 128 4 2 8 tile+mc  1 2 2026-12-07 H100\n", &gd) != 0);
        CHECK(strstr(gd.msg, "+mc: the persistent grids (persist, pingpong; e4m3 entries persist)") != NULL);
    }

    CASE("tests/tune/gemv8.tune: e4m3 gemv entries; an fp8 spec plans both GEMMs on the gemv grid, its up GEMM's "
         "cluster and shared memory as documented");
    {
        moe_tuning_t gt;
        moe_diag_t gd;
        CHECKF(moe_tuning_load(&gt, "tests/tune/gemv8.tune", &gd) == 0, "%s", gd.msg);
        CHECK(gt.n >= 10);
        for (int i = 0; i < gt.n; i++)
            CHECK(gt.e[i].fp8 && gt.e[i].gemv && gt.e[i].bn >= 32);
        moe_spec_t s8;
        moe_diag_t d8;
        moe_plan_desc_t pd8;
        char err[256];
        CHECKF(moe_spec_load(&s8, "q.moe", "name = 'q' experts = 128 top_k = 8 hidden = 2048 ffn = 768 tokens = 64 "
                             "arch = 'sm_90a' quant = { weights = 'fp8_e4m3' }\n", NULL, 0, &d8) == 0, "%s", d8.msg);
        if (moe_plan_desc_build(&pd8, &s8, &gt, err, sizeof err) == 0) {
            const moe_kernel_desc_t *up = &moe_plan_kernels(&pd8, MOE_ARCH_SM90A)[MOE_K_GEMM_UP],
                                    *dn = &moe_plan_kernels(&pd8, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
            CHECKF(up->tile.gemv && dn->tile.gemv && strstr(up->name, "_e4m3_block_sm90a_gemv_m64n32u2"), "%s", up->name);
            /* 4 rows x KC (2048) e4m3, their 16 scales, 4 x 16 activations and 4 amaxes; down: K 768 */
            CHECKF(up->smem == 4 * 2048 + 4 * 16 * 4 + 4 * 16 * 4 + 4 * 4, "up smem %d", up->smem);
            CHECKF(dn->smem == 4 * 768 + 4 * 6 * 4, "down smem %d", dn->smem);
            CHECK(moe_gemm_gemv_kc(7168, 1) == 7168 && moe_gemm_gemv_kc(9216, 1) == 2 * MOE_GEMV_KC);
            moe_plan_desc_free(&pd8);
        } else {
            CHECKF(0, "%s", err);
        }
        moe_tuning_free(&gt);
    }

    CASE("moegen reads MOEGEN_TUNING; --tuning overrides it; a bad one exits 2 naming it");
    {
        char out[8192];
        static const char *const cmds[3] = {
            "MOEGEN_TUNING=tests/tune/persist.tune " MOEGEN_BUILD "/moegen plan examples/specs/mixtral-8x7b.moe 2>&1",
            "MOEGEN_TUNING=tests/tune/persist.tune " MOEGEN_BUILD "/moegen plan examples/specs/mixtral-8x7b.moe "
            "--tuning tests/tune/tile.tune 2>&1",
            "MOEGEN_TUNING=/nonexistent.tune " MOEGEN_BUILD "/moegen plan examples/specs/mixtral-8x7b.moe 2>&1"};
        static const char *const want[3] = {"mixtral_8x7b_gemm_up_swiglu_bf16_sm90a_tma_persist_m128n256k64s4c2g8",
                                            "mixtral_8x7b_gemm_up_swiglu_bf16_sm90a_tma_m128n256k64s4c2g8",
                                            "/nonexistent.tune: error: "};
        for (int i = 0; i < 3; i++) {
            FILE *f = popen(cmds[i], "r");
            size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
            out[n] = 0;
            int rc = f ? pclose(f) : -1;
            CHECKF(strstr(out, want[i]) != NULL, "%s: no '%s' in:\n%s", cmds[i], want[i], out);
            CHECKF(i < 2 ? rc == 0 : WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "%s: exit %d", cmds[i], rc);
        }
    }

    CASE("moegen plan under gemv.tune names the gemv GEMMs; an fp8 spec under it keeps the fp8 tile");
    {
        char out[8192];
        static const char *const cmds[2] = {
            MOEGEN_BUILD "/moegen plan examples/specs/qwen3-30b-a3b.moe --tuning tests/tune/gemv.tune 2>&1",
            MOEGEN_BUILD "/moegen plan examples/specs/qwen3-30b-a3b.moe --tuning tests/tune/gemv.tune "
            "--set quant.weights=fp8_e4m3 --set arch=sm_90a 2>&1"};
        static const char *const want[2] = {
            "qwen3_30b_a3b_gemm_down_bf16_sm90a_gemv_m64n16u2           threads  256  smem  13312  gemv, 16 weight "
            "rows per CTA of a 64-row tile, rows in chunks of 8, K unrolled 2",
            "qwen3_30b_a3b_gemm_down_e4m3_block_sm90a_tma_m64n256k128s4c1g8"};
        for (int i = 0; i < 2; i++) {
            FILE *f = popen(cmds[i], "r");
            size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
            out[n] = 0;
            int rc = f ? pclose(f) : -1;
            CHECKF(strstr(out, want[i]) != NULL, "%s: no '%s' in:\n%s", cmds[i], want[i], out);
            CHECKF(rc == 0, "%s: exit %d", cmds[i], rc);
        }
    }

    CASE("moegen tune's candidates, bf16 and fp8, all pass a tuning entry's tile checks");
    {
        char why[256] = "";
        CHECKF(moe_tune_check_candidates(why, sizeof why) == 0, "%s", why);
    }

    CASE("moegen tune's winner: the bucket's own count with variants, every count up to it without");
    {
        /* three candidates at 128, 512, 2048 tokens (times[c][t]): A wins at
         * 128 by far, B at 512 and 2048; C never ran */
        const float t[3][3] = {{100, 900, 3000}, {140, 800, 2900}, {1, 1, 1}};
        const int ok[3] = {1, 1, 0}, tok[3] = {128, 512, 2048};
        int second = 0;
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 0, 0, &second) == 0 && second == 1);
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 1, 0, &second) == 1 && second == 0);
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 2, 0, &second) == 1 && second == 0);
        /* cumulative (expert parallelism: one configuration at every size):
         * at 512, A scores 1 + 900/800 = 2.125 against B's 1.4 + 1 = 2.4;
         * at 2048, 2.125 + 3000/2900 = 3.16 against 3.4 */
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 1, 1, &second) == 0 && second == 1);
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 2, 1, &second) == 0 && second == 1);
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, ok, tok, 0, 1, &second) == 0 && second == 1);
        const int one[3] = {0, 1, 0}, none[3] = {0, 0, 0};
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, one, tok, 1, 0, &second) == 1 && second == -1);
        CHECK(moe_tune_winner(3, 3, &t[0][0], 3, none, tok, 1, 0, &second) == -1 && second == -1);
    }

    CASE("moegen tune -o: entries of the same shape and bucket replaced, the rest kept, never through a planted link");
    {
        char dir[] = "/tmp/moegen_tune_write.XXXXXX", path[256], link[300], victim[300], buf[4096];
        CHECK(mkdtemp(dir) != NULL);
        snprintf(path, sizeof path, "%s/t.tune", dir);
        snprintf(link, sizeof link, "%s.tmp", path); /* the name the old writer opened (fopen "w": followed) */
        snprintf(victim, sizeof victim, "%s/victim", dir);
        const char *old_table = "# a comment\n"
                                "8 2 4096 14336 bf16 sm_90a 1  64 32 64 4 1 1 gemv  188.4 195.9 2026-12-04 NVIDIA H200\n"
                                "8 2 4096 14336 bf16 sm_90a 512  64 256 64 4 2 8 pingpong  892.8 903.6 2026-12-04 NVIDIA H200\n"
                                "32 8 7168 2048 bf16 sm_90a 1  64 64 64 2 1 1 gemv  185.3 192.4 2026-12-04 NVIDIA H200\n";
        FILE *f = fopen(path, "w");
        CHECK(f && fputs(old_table, f) >= 0 && fclose(f) == 0);
        f = fopen(victim, "w");
        CHECK(f && fputs("victim\n", f) >= 0 && fclose(f) == 0);
        CHECK(symlink(victim, link) == 0);
        moe_spec_t sp;
        memset(&sp, 0, sizeof sp);
        sp.experts = 8, sp.top_k = 2, sp.hidden = 4096, sp.ffn = 14336, sp.dtype = MOE_DTYPE_BF16;
        const int tok[2] = {1, 128};
        char lines[2][256] = {"8 2 4096 14336 bf16 sm_90a 1  64 64 64 2 1 1 gemv  150.0 151.0 2026-12-06 GPU",
                              "8 2 4096 14336 bf16 sm_90a 128  64 256 64 4 2 8 pingpong  689.5 689.7 2026-12-06 GPU"};
        CHECK(moe_tune_write_table(path, &sp, tok, 2, lines) == 0);
        size_t n = read_back(path, buf, sizeof buf);
        CHECKF(strcmp(buf, "# a comment\n"
                           "8 2 4096 14336 bf16 sm_90a 512  64 256 64 4 2 8 pingpong  892.8 903.6 2026-12-04 NVIDIA H200\n"
                           "32 8 7168 2048 bf16 sm_90a 1  64 64 64 2 1 1 gemv  185.3 192.4 2026-12-04 NVIDIA H200\n"
                           "8 2 4096 14336 bf16 sm_90a 1  64 64 64 2 1 1 gemv  150.0 151.0 2026-12-06 GPU\n"
                           "8 2 4096 14336 bf16 sm_90a 128  64 256 64 4 2 8 pingpong  689.5 689.7 2026-12-06 GPU\n") == 0,
               "the merged table:\n%s", buf);
        moe_tuning_t t;
        moe_diag_t d;
        CHECKF(moe_tuning_parse(&t, path, buf, n, &d) == 0, "%s", d.msg);
        moe_tuning_free(&t);
        n = read_back(victim, buf, sizeof buf);
        CHECKF(strcmp(buf, "victim\n") == 0, "the planted link's target was written: %s", buf);
        struct stat st;
        CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode)); /* the planted link itself left alone */
        CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
        /* no temporary file left beside the table */
        DIR *dd = opendir(dir);
        int others = 0;
        for (struct dirent *e; dd && (e = readdir(dd));)
            others += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "t.tune") &&
                      strcmp(e->d_name, "t.tune.tmp") && strcmp(e->d_name, "victim");
        if (dd)
            closedir(dd);
        CHECK(others == 0);
        /* a table that does not parse: 2, and it is left as it was */
        f = fopen(path, "w");
        CHECK(f && fputs("8 2 4096 14336 bf16 sm_90a 1 64\n", f) >= 0 && fclose(f) == 0);
        CHECK(moe_tune_write_table(path, &sp, tok, 2, lines) == 2);
        n = read_back(path, buf, sizeof buf);
        CHECK(strcmp(buf, "8 2 4096 14336 bf16 sm_90a 1 64\n") == 0);
        /* a folder that does not exist: 1, no crash */
        char missing[300];
        snprintf(missing, sizeof missing, "%s/no/such/t.tune", dir);
        CHECK(moe_tune_write_table(missing, &sp, tok, 2, lines) == 1);
        unlink(path), unlink(link), unlink(victim), rmdir(dir);
    }

    CASE("backward entries: parsed after their stage's name, completing the forward entry of their key");
    {
        const char *bt = "12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                         "wgrad_down\t12 2 264 136 bf16 sm_90a 1  256 128 64 3 2 8 persist  3 4 2026-12-07 G H\n"
                         "dgrad_down 12 2 264 136 bf16 sm_90a 1  64 128 64 6 2 8 pingpong  1 2 2026-12-07 G\n"
                         "12 2 264 136 bf16 sm_90a 512  128 256 64 4 2 8 tile  1 2 2026-12-07 G\n";
        moe_tuning_t b;
        moe_diag_t bd;
        CHECKF(parse(&b, bt, &bd) == 0, "%s", bd.msg);
        CHECK(b.n == 4);
        if (b.n == 4) {
            CHECK(b.e[0].stage == 0 && b.e[1].stage == MOE_K_WGRAD_DOWN && b.e[2].stage == MOE_K_DGRAD_DOWN);
            CHECK(b.e[1].bm == 256 && b.e[1].bn == 128 && b.e[1].consumers == 2 && b.e[1].persistent == 1);
            CHECK(b.e[1].best_us == 3 && b.e[1].line == 2);
            CHECK_STREQ(b.e[1].gpu, "G H");
            CHECK(moe_tuning_find_bgemm(&b, &b.e[0], MOE_K_WGRAD_DOWN) == &b.e[1]);
            CHECK(moe_tuning_find_bgemm(&b, &b.e[0], MOE_K_DGRAD_DOWN) == &b.e[2]);
            CHECK(moe_tuning_find_bgemm(&b, &b.e[0], MOE_K_WGRAD_UP) == NULL);
            CHECK(moe_tuning_find_bgemm(&b, &b.e[3], MOE_K_DGRAD_DOWN) == NULL); /* another bucket's */
            CHECK(moe_tuning_find_bgemm(&b, NULL, MOE_K_DGRAD_DOWN) == NULL);
        }
        /* the forward lookups never return a backward entry */
        moe_spec_t sp;
        moe_diag_t sd;
        CHECKF(moe_spec_load(&sp, "t.moe", "name='b'\nexperts=12\ntop_k=2\nhidden=264\nffn=136\ntokens=300\n", NULL,
                             0, &sd) == 0, "%s", sd.msg);
        CHECK(b.n == 4 && moe_tuning_find(&b, &sp, MOE_ARCH_SM90A) == &b.e[0]);
        int bk[8];
        CHECK(moe_tuning_buckets(&b, &sp, MOE_ARCH_SM90A, bk, 8) == 1 && bk[0] == 1);
        moe_tuning_free(&b);
    }
    expect_error("dgrad_sideways 12 2 264 136 bf16 sm_90a 1  64 128 64 6 2 8 pingpong  1 2 2026-12-07 G\n",
                 "t.tune:1: error: an entry starts with E (an integer) or with a backward GEMM's name (dgrad_down, "
                 "dgrad_up, wgrad_up, wgrad_down) ('dgrad_sideways')");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_up 12 2 264 136 bf16 sm_90a 1  128 256 64 3 2 8 pingpong  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a backward entry's grid is tile, persist or pingpong (dgrad_down, dgrad_up) or "
                 "persist (wgrad_up, wgrad_down), without suffixes ('pingpong')");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "dgrad_up 12 2 264 136 bf16 sm_90a 1  64 256 64 4 1 8 splitk2  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a backward entry's grid is tile, persist or pingpong (dgrad_down, dgrad_up) or "
                 "persist (wgrad_up, wgrad_down), without suffixes ('splitk2')");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "dgrad_up 12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong+pdl  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a backward entry's grid is tile, persist or pingpong (dgrad_down, dgrad_up) or "
                 "persist (wgrad_up, wgrad_down), without suffixes ('pingpong')");
    expect_error("12 2 264 136 e4m3 sm_90a 1  128 256 128 4 2 8 tile  1 2 2026-12-07 G\n"
                 "wgrad_up 12 2 264 136 e4m3 sm_90a 1  128 256 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a backward entry's dtype is bf16 or fp16 (training runs no fp8 GEMMs) ('e4m3')");
    expect_error("wgrad_up 12 2 264 136 bf16 sm_90a 1  128 256 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:1: error: a backward entry needs the forward entry of its shape and tokens (its row block "
                 "is the dgrads' M tile)");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "dgrad_down 12 2 264 136 bf16 sm_90a 1  128 128 64 4 2 8 tile  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a dgrad's bm must be the row block of the forward entry of its shape and tokens "
                 "(line 1: bm 64)");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_down 12 2 264 136 bf16 sm_90a 1  128 256 64 3 2 8 persist  1 2 2026-12-07 G\n"
                 "wgrad_down 12 2 264 136 bf16 sm_90a 1  128 128 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:3: error: a second entry for the same backward GEMM, shape and tokens (the first is line 2)");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_down 12 2 264 136 bf16 sm_90a 1  128 64 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:2: error: a weight gradient's bn must be 128 or 256 (two staging passes of whole 128-byte "
                 "boxes)");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_down 12 2 264 136 bf16 sm_90a 1  256 256 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:2: error: accumulators over the register cap (bm / consumers / 64 x bn / 2 + 40 a thread): bm "
                 "192 and 256 (on 2 consumers) take bn 128");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_up 12 2 264 136 bf16 sm_90a 1  128 256 64 4 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:2: error: stages must be >= 2 and fit 227 KB of shared memory with half the output tile in "
                 "fp32");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "wgrad_up 12 2 264 136 bf16 sm_90a 1  192 128 64 3 2 8 persist  1 2 2026-12-07 G\n",
                 "t.tune:2: error: consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)");
    expect_error("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                 "dgrad_down 12 2 264 136 bf16 sm_90a 1  64 256 64 5 2 8 pingpong  1 2 2026-12-07 G\n",
                 "t.tune:2: error: stages must be >= 2 and fit 227 KB of shared memory with the two staging tiles");

    CASE("backward entries choose the backward GEMMs' sm_90a tiles (tests/tune/bwd.tune, bwd2.tune); without "
         "them the heuristics");
    {
        static const struct {
            const char *spec, *table, *names[4];
            int smem_wgrad_up;
        } want[] = {
            {"tests/specs/train_softmax.moe", "tests/tune/bwd.tune",
             {"train_softmax_dgrad_down_bf16_sm90a_tma_persist_m128n128k64s5c2g8",
              "train_softmax_dgrad_up_bf16_sm90a_tma_pingpong_m128n128k64s4c2g4",
              "train_softmax_wgrad_up_bf16_sm90a_tma_persist_m256n128k64s3c2g8",
              "train_softmax_wgrad_down_bf16_sm90a_tma_persist_m64n256k64s4c1g8"},
             3 * (256 + 128) * 64 * 2 + 256 * 64 * 4 + 16 * 3},
            {"tests/specs/train_softmax_hgrad.moe", "tests/tune/bwd.tune",
             {"train_softmax_hgrad_dgrad_down_bf16_sm90a_tma_persist_m128n128k64s5c2g8",
              "train_softmax_hgrad_dgrad_up_bf16_sm90a_tma_pingpong_m128n128k64s4c2g4",
              "train_softmax_hgrad_wgrad_up_bf16_sm90a_tma_persist_m256n128k64s3c2g8_gbf16",
              "train_softmax_hgrad_wgrad_down_bf16_sm90a_tma_persist_m64n256k64s4c1g8_gbf16"},
             3 * (256 + 128) * 64 * 2 + 256 * 64 * 2 + 16 * 3},
            {"tests/specs/train_softmax.moe", "tests/tune/bwd2.tune",
             {"train_softmax_dgrad_down_bf16_sm90a_tma_pingpong_m64n128k64s6c2g8",
              "train_softmax_dgrad_up_bf16_sm90a_tma_m64n256k64s4c1g8",
              "train_softmax_wgrad_up_bf16_sm90a_tma_persist_m192n128k64s4c3g8",
              "train_softmax_wgrad_down_bf16_sm90a_tma_persist_m128n128k64s5c2g8"},
             4 * (192 + 128) * 64 * 2 + 192 * 64 * 4 + 16 * 4},
            {"tests/specs/train_gptoss.moe", "tests/tune/bwd.tune",
             {"train_gptoss_dgrad_down_fp16_sm90a_tma_pingpong_m64n128k64s6c2g8",
              "train_gptoss_dgrad_up_fp16_sm90a_tma_persist_m64n256k64s4c1g8",
              "train_gptoss_wgrad_up_fp16_sm90a_tma_persist_m192n128k64s3c3g8",
              "train_gptoss_wgrad_down_fp16_sm90a_tma_persist_m128n128k64s4c2g8"},
             3 * (192 + 128) * 64 * 2 + 192 * 64 * 4 + 16 * 3},
            {"tests/specs/train_softmax.moe", NULL, /* the heuristics: the 128-row block's tiles */
             {"train_softmax_dgrad_down_bf16_sm90a_tma_m128n256k64s4c2g8",
              "train_softmax_dgrad_up_bf16_sm90a_tma_m128n256k64s4c2g8",
              "train_softmax_wgrad_up_bf16_sm90a_tma_persist_m128n256k64s3c2g8",
              "train_softmax_wgrad_down_bf16_sm90a_tma_persist_m128n256k64s3c2g8"},
             3 * (128 + 256) * 64 * 2 + 128 * 128 * 4 + 16 * 3},
        };
        for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
            moe_tuning_t bt = {0};
            moe_diag_t bd;
            if (want[i].table)
                CHECKF(moe_tuning_load(&bt, want[i].table, &bd) == 0, "%s", bd.msg);
            moe_spec_t sp;
            moe_diag_t sd;
            char err[256];
            moe_plan_desc_t bp = {0};
            CHECKF(moe_spec_load(&sp, want[i].spec, NULL, NULL, 0, &sd) == 0, "%s", sd.msg);
            const int rc = moe_plan_desc_build(&bp, &sp, want[i].table ? &bt : embedded, err, sizeof err);
            CHECKF(rc == 0, "%s: %s", want[i].spec, err);
            const moe_kernel_desc_t *bg = rc ? NULL : moe_plan_bgemm(&bp, MOE_ARCH_SM90A);
            for (int k = 0; bg && k < 4; k++)
                CHECKF(strcmp(bg[k].name, want[i].names[k]) == 0, "%s under %s: %s, want %s", want[i].spec,
                       want[i].table ? want[i].table : "the embedded table", bg[k].name, want[i].names[k]);
            if (bg) {
                CHECKF(bg[2].smem == want[i].smem_wgrad_up, "wgrad_up smem %d, want %d", bg[2].smem,
                       want[i].smem_wgrad_up);
                CHECK(bg[2].threads == 128 * (bg[2].tile.consumers + 1));
                /* sm_80 keeps its mma.sync tiles */
                CHECK(moe_plan_bgemm(&bp, MOE_ARCH_SM80)[0].tile.consumers == 0);
            }
            moe_plan_desc_free(&bp);
            moe_tuning_free(&bt);
        }
    }

    CASE("backward entries complete the entry of the spec's tokens, also where the plan merged it into an "
         "earlier bucket's identical variant");
    {
        const char *mt = "12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                         "12 2 264 136 bf16 sm_90a 512  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                         "dgrad_down 12 2 264 136 bf16 sm_90a 512  64 128 64 6 2 8 pingpong  1 2 2026-12-07 G\n"
                         "wgrad_up 12 2 264 136 bf16 sm_90a 1  64 256 64 4 1 8 persist  1 2 2026-12-07 G\n";
        moe_tuning_t mtab;
        moe_diag_t md;
        CHECKF(parse(&mtab, mt, &md) == 0, "%s", md.msg);
        moe_plan_desc_t mp = {0};
        CHECK(plan_of(&mp, "name='m'\nexperts=12\ntop_k=2\nhidden=264\nffn=136\ntokens=1024\ntraining=true\n",
                      &mtab) == 0);
        CHECK(mp.nvariants == 1 && mp.tuned == &mtab.e[0]); /* the 512 bucket merged into the 1 bucket's */
        const moe_kernel_desc_t *bg = mp.has_bwd ? moe_plan_bgemm(&mp, MOE_ARCH_SM90A) : NULL;
        CHECK(bg && strcmp(bg[0].name, "m_dgrad_down_bf16_sm90a_tma_pingpong_m64n128k64s6c2g8") == 0);
        /* the 1 bucket's wgrad_up entry is not the 1024-token plan's: the heuristics' tile */
        CHECK(bg && strcmp(bg[2].name, "m_wgrad_up_bf16_sm90a_tma_persist_m128n256k64s3c2g8") == 0);
        CHECK(plan_of(&mp, "name='m'\nexperts=12\ntop_k=2\nhidden=264\nffn=136\ntokens=100\ntraining=true\n",
                      &mtab) == 0);
        bg = mp.has_bwd ? moe_plan_bgemm(&mp, MOE_ARCH_SM90A) : NULL;
        CHECK(bg && strcmp(bg[0].name, "m_dgrad_down_bf16_sm90a_tma_pingpong_m64n256k64s4c2g8") == 0);
        CHECK(bg && strcmp(bg[2].name, "m_wgrad_up_bf16_sm90a_tma_persist_m64n256k64s4c1g8") == 0);
        moe_plan_desc_free(&mp);
        moe_tuning_free(&mtab);
    }

    CASE("moegen tune -o: a replaced forward entry drops the backward entries completing it, keeps the others'");
    {
        char dir[] = "/tmp/moegen_tune_bwd.XXXXXX", path[256], buf[4096];
        CHECK(mkdtemp(dir) != NULL);
        snprintf(path, sizeof path, "%s/t.tune", dir);
        FILE *f = fopen(path, "w");
        CHECK(f && fputs("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                         "dgrad_down 12 2 264 136 bf16 sm_90a 1  64 128 64 6 2 8 pingpong  1 2 2026-12-07 G\n"
                         "12 2 264 136 bf16 sm_90a 512  128 256 64 4 2 8 tile  1 2 2026-12-07 G\n"
                         "wgrad_up\t12 2 264 136 bf16 sm_90a 512  128 128 64 4 2 8 persist  1 2 2026-12-07 G\n",
                         f) >= 0 && fclose(f) == 0);
        moe_spec_t sp;
        memset(&sp, 0, sizeof sp);
        sp.experts = 12, sp.top_k = 2, sp.hidden = 264, sp.ffn = 136, sp.dtype = MOE_DTYPE_BF16;
        const int tok[1] = {1};
        char lines[1][256] = {"12 2 264 136 bf16 sm_90a 1  128 128 64 4 2 8 tile  5 6 2026-12-08 G"};
        CHECK(moe_tune_write_table(path, &sp, tok, 1, lines) == 0);
        size_t n = read_back(path, buf, sizeof buf);
        CHECKF(strcmp(buf, "12 2 264 136 bf16 sm_90a 512  128 256 64 4 2 8 tile  1 2 2026-12-07 G\n"
                           "wgrad_up\t12 2 264 136 bf16 sm_90a 512  128 128 64 4 2 8 persist  1 2 2026-12-07 G\n"
                           "12 2 264 136 bf16 sm_90a 1  128 128 64 4 2 8 tile  5 6 2026-12-08 G\n") == 0,
               "the merged table:\n%s", buf);
        moe_tuning_t t2;
        moe_diag_t d2;
        CHECKF(moe_tuning_parse(&t2, path, buf, n, &d2) == 0, "%s", d2.msg);
        moe_tuning_free(&t2);
        unlink(path), rmdir(dir);
    }

    CASE("errors name the file and line");
    expect_error("# c\n8 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02\n",
                 "t.tune:2: error: an entry has 18 fields or more: [backward GEMM] E top_k H F dtype arch tokens bm bn "
                 "bk stages consumers group_m grid best_us runner_up_us date gpu");
    expect_error("8 2 4096 12288 bf32 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: dtype must be bf16, fp16 or e4m3 (an fp8 spec's GEMMs) ('bf32')");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 128 256 64 4 2 8 tile 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: fp8 (dtype e4m3): bk must be 128 (one scale block) and bn 256 (the up GEMM's 128 "
                 "output columns, one quantization block)");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 128 256 128 4 1 8 tile 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: fp8 (dtype e4m3): one or two consumer warpgroups of 64 rows each (bm = 64 x "
                 "consumers)");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 128 256 128 4 2 8 pingpong 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: fp8 (dtype e4m3): the grid must be tile (one CTA per tile), persist (one CTA "
                 "per SM) or gemv");
    /* the fp8 gemv grid: the gemv checks, and bn at least 32 (the up GEMM's cluster of 256 / bn CTAs) */
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 64 16 64 2 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: fp8 (dtype e4m3) gemv: bn must be 32, 64, 128 or 256 (the up GEMM's clusters of "
                 "256 / bn CTAs, at most 8)");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 64 48 64 2 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: bn (the weight rows per CTA) must be 8, 16, 32, 64, 128 or 256");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 64 32 64 3 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: stages (the K loop's unroll: 16-byte loads in flight per weight row and "
                 "lane) must be 1, 2 or 4");
    expect_error("8 2 4096 12288 e4m3 sm_90a 1 128 256 128 5 2 8 tile 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: fp8 (dtype e4m3): stages must be >= 2, fit 227 KB of shared memory and hold the "
                 "down GEMM's output tile");
    expect_error("x 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: an entry starts with E (an integer) or with a backward GEMM's name (dgrad_down, "
                 "dgrad_up, wgrad_up, wgrad_down) ('x')");
    expect_error("0 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: E must be an integer 1..65536 ('0')");
    expect_error("8 2 4096 12288 bf16 sm_80 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: arch must be sm_90a (the only tuned arch) ('sm_80')");
    expect_error("\n8 2 4096 12288 bf16 sm_90a 1024 128 256 64 6 2 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:2: error: stages must be >= 2, fit 227 KB of shared memory and hold the output tile");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 128 256 64 5 2 4 persist 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: stages must be >= 2 and fit 227 KB of shared memory with the epilogue's staging "
                 "tile");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 128 64 4 1 4 persistent 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid must be tile (one CTA per tile), persist (one CTA per SM), pingpong (one "
                 "CTA per SM, its consumer warpgroups on alternate tiles), splitkS (S = 2..16 CTAs per tile, "
                 "each over a share of K), gemv (a CTA per bn weight rows of a tile, for few rows per expert), "
                 "gemv3 (gemv, three CTAs an SM), gemv4 (gemv, four CTAs an SM), stream (a CTA per SM streaming the weights through a ring) or "
                 "chain (stream, the up GEMM's grid running the down GEMM and the combine too) "
                 "('persistent')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 48 64 2 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: bn (the weight rows per CTA) must be 8, 16, 32, 64, 128 or 256");
#define SUFFIXES "t.tune:1: error: the grid's suffixes are +pdl (launch overlap for the bucket's calls), +ef (the " \
                 "up GEMM's weights loaded evict-first in L2) and +mc (CTA pairs sharing the weight tile by TMA " \
                 "multicast), each at most once "
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 gemv+pd 1 2 2026-12-07 H100\n", SUFFIXES "('gemv+pd')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 gemv+pdl+pdl 1 2 2026-12-07 H100\n",
                 SUFFIXES "('gemv+pdl+pdl')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 2 1 8 tile+ef+pdl+ef 1 2 2026-12-07 H100\n",
                 SUFFIXES "('tile+ef+pdl+ef')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 2 1 8 tile+ 1 2 2026-12-07 H100\n", SUFFIXES "('tile+')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 2 1 8 tile+efx 1 2 2026-12-07 H100\n", SUFFIXES "('tile+efx')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 256 64 4 2 8 pingpong+mc+mc 1 2 2026-12-07 H100\n",
                 SUFFIXES "('pingpong+mc+mc')");
#undef SUFFIXES
#define PAIRS "t.tune:1: error: +mc: the persistent grids (persist, pingpong; e4m3 entries persist), without +ef "
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 2 1 8 tile+mc 1 2 2026-12-07 H100\n", PAIRS "('tile')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 gemv+mc 1 2 2026-12-07 H100\n", PAIRS "('gemv')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 128 256 64 4 2 8 persist+ef+mc 1 2 2026-12-07 H100\n",
                 PAIRS "('persist')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 2 1 8 splitk4+mc 1 2 2026-12-07 H100\n", PAIRS "('splitk4')");
#undef PAIRS
    {   /* a fuzz finding: stages 1696 x (bm + bn 2048) x bk 1408 x 2 wrapped the old int product */
        const moe_tile_cfg_t huge = {.bm = 64, .bn = 2048, .bk = 1408, .stages = 1696, .consumers = 1, .group_m = 8};
        moe_tile_cfg_t huge_p = huge;
        huge_p.persistent = 1;
        CHECK(moe_gemm_sm90_smem(&huge, 2048) == 0 && moe_gemm_sm90_smem(&huge_p, 2048) == 0);
    }
    expect_error("8 2 4096 14336 bf16 sm_90a 1 64 2048 1408 1696 1 8 tile 1 2 2026-12-07 H100\n",
                 "t.tune:1: error: bk must be 64 (one 128-byte swizzle row)");
    expect_error("8 2 4096 14336 e4m3 sm_90a 1 64 256 128 4096 1 8 persist 1 2 2026-12-07 H100\n",
                 "t.tune:1: error: fp8 (dtype e4m3): stages must be >= 2, fit 227 KB of shared memory and hold "
                 "the down GEMM's output tile");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 gemv3+ef 1 2 2026-12-07 H100\n",
                 "t.tune:1: error: +ef: the TMA grids only (tile, persist, pingpong, splitkS: the gemv, stream and "
                 "chain grids load no TMA boxes) ('gemv3')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 32 64 2 1 1 +pdl 1 2 2026-12-07 H100\n",
                 "t.tune:1: error: grid must be tile (one CTA per tile), persist (one CTA per SM), pingpong (one "
                 "CTA per SM, its consumer warpgroups on alternate tiles), splitkS (S = 2..16 CTAs per tile, "
                 "each over a share of K), gemv (a CTA per bn weight rows of a tile, for few rows per expert), "
                 "gemv3 (gemv, three CTAs an SM), gemv4 (gemv, four CTAs an SM), stream (a CTA per SM streaming the weights through a ring) or "
                 "chain (stream, the up GEMM's grid running the down GEMM and the combine too) "
                 "('')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 32 64 64 2 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: bm (the tile table's row block) must be 64 or 128");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 64 64 3 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: stages (the K loop's unroll: 16-byte loads in flight per weight row and "
                 "lane) must be 1, 2 or 4");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 64 64 2 1 8 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: consumers and group_m must be 1 (no warpgroups, no raster)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 64 128 2 1 1 gemv 1 2 2026-12-04 H200\n",
                 "t.tune:1: error: gemv: bk must be 64 (unused by the gemv kernels, as the other grids spell it)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 4 1 4 splitk1 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid splitkS: S (the CTAs that split one tile's K) must be an integer 2..16 "
                 "('splitk1')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 4 1 4 splitk17 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid splitkS: S (the CTAs that split one tile's K) must be an integer 2..16 "
                 "('splitk17')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1 64 128 64 4 1 4 splitk 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid splitkS: S (the CTAs that split one tile's K) must be an integer 2..16 "
                 "('splitk')");
    expect_error("8 2 200 120 bf16 sm_90a 1 64 128 64 4 1 4 splitk5 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid splitk5: more splits than the longer GEMM's 4 k tiles (max(H, F) / bk, "
                 "rounded up) ('splitk5')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 256 64 4 1 4 pingpong 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: pingpong: consumers must be 2 (the warpgroups taking alternate tiles), on a "
                 "persistent grid");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 128 256 64 3 2 4 pingpong 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: pingpong: one warpgroup holds a whole tile's accumulators, so bm x bn must be at "
                 "most 16384 (64 x 256, 128 x 128)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 192 64 4 1 4 persist 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: bn must be 64, 128 or 256 on a persistent grid (the down GEMM's output is staged "
                 "128 columns at a time)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 256 64 5 2 4 pingpong 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: stages must be >= 2 and fit 227 KB of shared memory with the two staging tiles");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 128 256 64 4 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)");
    /* row blocks of 192 and 256: bm / 64 consumers, bn within their register cap, never the ping-pong */
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 320 64 64 4 5 4 tile 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: bm must be 64, 128, 192 or 256");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 192 128 64 4 2 4 tile 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 256 256 64 3 2 4 tile 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: bm 256 on two consumer warpgroups (two m64 blocks each, 384 threads: at most 168 "
                 "registers) takes bn 64 or 128");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 256 128 64 4 3 4 tile 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: consumers must be bm / 64 (or 2 with bm 256: two m64 blocks each)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 192 256 64 3 3 4 tile 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: bm 192 (three consumer warpgroups, 512 threads: at most 128 registers) takes bn "
                 "64 or 128");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 256 128 64 3 4 4 persist 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: bm 256 (four consumer warpgroups, 640 threads: at most 96 registers) takes bn 64");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 192 64 64 4 2 4 pingpong 1 2 2026-12-06 H200\n",
                 "t.tune:1: error: pingpong: bm must be 64 or 128 (one warpgroup holds a whole tile)");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 128 64 4 1 4 tile 0 2 2026-12-02 H200\n",
                 "t.tune:1: error: best_us and runner_up_us are positive numbers ('0')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 128 64 4 1 4 tile 1 2 2026-12 H200\n",
                 "t.tune:1: error: date must be YYYY-MM-DD ('2026-12')");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 128 64 4 1 4 tile 1 2 2026-12-02 H200\n"
                 "8 2 4096 12288 bf16 sm_90a 1024 64 256 64 4 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:2: error: a second entry for the same shape and tokens (the first is line 1)");

    moe_plan_desc_free(&pd);
    return check_report("test_tuning");
}
