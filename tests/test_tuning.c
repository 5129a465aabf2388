#define _POSIX_C_SOURCE 200809L
/* test_tuning.c — the tuning table: parsing, errors with FILE:LINE, the
 * planner's use of an entry (kernel names), heuristics without one, and the
 * JIT cache key following the chosen tiles. No GPU. (The family table and
 * the plan's other parts: test_plan.c.) */
#include "cache.h"
#include "check.h"
#include "emit.h"
#include "plan.h"
#include "spec.h"
#include "tuning.h"

#include <stdio.h>
#include <sys/wait.h>
#include <string.h>

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
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_m128n256k64s4c2g8");
    /* one CTA per tile: the output is staged in the ring, no staging tile of its own */
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].smem == 4 * (128 + 256) * 64 * 2 + 16 * 4 && !moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.persistent);
    char key_heur[33], key_tuned[33], key_small[33];
    moe_diag_t cd;
    CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, key_heur, &cd) == 0);

    CASE("an entry: the largest bucket <= tokens chooses the sm_90a tiles");
    CHECK(plan_of(&pd, mixtral, &t) == 0);
    CHECK(pd.tuned == &t.e[1]);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_persist_m128n256k64s3c2g16");
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.persistent == 1);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].name, "mx_gemm_down_bf16_sm90a_tma_persist_m128n256k64s3c2g16");
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].smem == 3 * (128 + 256) * 64 * 2 + 128 * (128 + 8) * 2 + 16 * 3);
    CHECK(moe_cache_key(&pd, NULL, MOE_ARCH_SM90A, key_tuned, &cd) == 0);
    CHECK(strcmp(key_heur, key_tuned) != 0);

    CASE("a smaller bucket sets bm (align) for both arches");
    CHECK(plan_of(&pd, "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\ntokens = 2000\n", &t) == 0);
    CHECK(pd.tuned == &t.e[0] && pd.align == 64);
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name, "mx_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s5c1g4");
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
                "mx_gemm_up_swiglu_bf16_sm90a_tma_m128n256k64s4c2g8");
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
        CHECK_STREQ(up->name, "mx_gemm_up_swiglu_bf16_sm90a_tma_pingpong_m64n256k64s4c2g8");
        CHECK_STREQ(down->name, "mx_gemm_down_bf16_sm90a_tma_pingpong_m64n256k64s4c2g8");
        /* the ring, then a staging tile (bm x (min(out cols, 128) + 8) halves) per consumer warpgroup */
        CHECK(up->smem == 4 * (64 + 256) * 64 * 2 + 2 * 64 * (128 + 8) * 2 + 16 * 4);
        CHECK(down->smem == 4 * (64 + 256) * 64 * 2 + 2 * 64 * (128 + 8) * 2 + 16 * 4);
        CHECK(plan_of(&pd, mixtral, &t) == 0);
        up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
        down = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
        CHECK(pd.align == 128 && up->tile.pingpong && down->tile.pingpong);
        CHECK_STREQ(up->name, "mx_gemm_up_swiglu_bf16_sm90a_tma_pingpong_m128n128k64s4c2g16");
        CHECK(up->smem == 4 * (128 + 128) * 64 * 2 + 2 * 128 * (64 + 8) * 2 + 16 * 4);
        CHECK(down->smem == 4 * (128 + 128) * 64 * 2 + 2 * 128 * (128 + 8) * 2 + 16 * 4);
        /* the sm_80 GEMMs know nothing of it */
        CHECK(!moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].tile.pingpong);
        moe_tuning_free(&t);
    }

    CASE("every sm_90a tile the check accepts, the template emits (both GEMMs, each grid, N tails)");
    {
        int accepted = 0;
        for (int bm = 64; bm <= 128; bm += 64)
            for (int bn = 64; bn <= 256; bn += 64)
                for (int stages = 2; stages <= 8; stages += 3)
                    for (int grid = 0; grid < 3; grid++) {
                        moe_tuning_entry_t e = {.experts = 8, .top_k = 2, .hidden = 264, .ffn = 200,
                                                .dtype = MOE_DTYPE_BF16, .arch = MOE_ARCH_SM90A, .tokens = 1,
                                                .bm = bm, .bn = bn, .bk = 64, .stages = stages,
                                                .consumers = grid == 2 ? 2 : bm / 64, .group_m = 8,
                                                .persistent = grid > 0, .pingpong = grid == 2};
                        const moe_tile_cfg_t c = {.bm = bm, .bn = bn, .bk = 64, .stages = stages,
                                                  .consumers = e.consumers, .group_m = 8, .persistent = e.persistent,
                                                  .pingpong = e.pingpong};
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
                        CHECKF(!bad, "m%dn%ds%d %s: %s", bm, bn, stages, grid == 2 ? "pingpong" : grid ? "persist" : "tile",
                               ed.msg);
                        moe_buf_free(&src);
                    }
        CHECKF(accepted >= 20, "only %d tiles accepted", accepted);
    }

    CASE("the GPU tests' tables (tests/tune) parse, every entry on their grid");
    static const char *const grids[3] = {"tests/tune/tile.tune", "tests/tune/persist.tune",
                                         "tests/tune/pingpong.tune"};
    for (int g = 0; g < 3; g++) {
        moe_tuning_t gt;
        moe_diag_t gd;
        CHECKF(moe_tuning_load(&gt, grids[g], &gd) == 0, "%s", gd.msg);
        CHECK(gt.n >= 10);
        for (int i = 0; i < gt.n; i++)
            CHECK(gt.e[i].persistent == (g > 0) && gt.e[i].pingpong == (g == 2));
        moe_tuning_free(&gt);
    }

    CASE("moegen reads MOEGEN_TUNING; --tuning overrides it; a bad one exits 2 naming it");
    {
        char out[8192];
        static const char *const cmds[3] = {
            "MOEGEN_TUNING=tests/tune/persist.tune build/moegen plan examples/specs/mixtral-8x7b.moe 2>&1",
            "MOEGEN_TUNING=tests/tune/persist.tune build/moegen plan examples/specs/mixtral-8x7b.moe "
            "--tuning tests/tune/tile.tune 2>&1",
            "MOEGEN_TUNING=/nonexistent.tune build/moegen plan examples/specs/mixtral-8x7b.moe 2>&1"};
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

    CASE("errors name the file and line");
    expect_error("# c\n8 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02\n",
                 "t.tune:2: error: an entry has 18 fields or more: E top_k H F dtype arch tokens bm bn bk stages "
                 "consumers group_m grid best_us runner_up_us date gpu");
    expect_error("8 2 4096 12288 bf32 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: dtype must be bf16 or fp16 ('bf32')");
    expect_error("x 2 4096 12288 bf16 sm_90a 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: E must be an integer 1..65536 ('x')");
    expect_error("8 2 4096 12288 bf16 sm_80 1024 64 128 64 5 1 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: arch must be sm_90a (the only tuned arch) ('sm_80')");
    expect_error("\n8 2 4096 12288 bf16 sm_90a 1024 128 256 64 6 2 4 tile 1 2 2026-12-02 H200\n",
                 "t.tune:2: error: stages must be >= 2, fit 227 KB of shared memory and hold the output tile");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 128 256 64 5 2 4 persist 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: stages must be >= 2 and fit 227 KB of shared memory with the epilogue's staging "
                 "tile");
    expect_error("8 2 4096 12288 bf16 sm_90a 1024 64 128 64 4 1 4 persistent 1 2 2026-12-02 H200\n",
                 "t.tune:1: error: grid must be tile (one CTA per tile), persist (one CTA per SM) or pingpong (one "
                 "CTA per SM, its consumer warpgroups on alternate tiles) ('persistent')");
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
                 "t.tune:1: error: consumers must be bm / 64");
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
