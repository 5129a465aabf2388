/* test_plan.c — the family table and the plan built once: one descriptor
 * per family, with a variant for every arch whose templates exist; the
 * kernels, grids, mesh tables and EP part a plan holds; a plan that cannot
 * be built is left empty. No GPU. (Tiles and the tuning table:
 * test_tuning.c.) */
#include "check.h"
#include "family.h"
#include "plan.h"
#include "spec.h"
#include "template.h"
#include "tuning.h"

#include <stdio.h>
#include <string.h>

static const char *const mixtral = "name = 'mx'\nexperts = 8\ntop_k = 2\nhidden = 4096\nffn = 12288\n"
                                   "tokens = 4096\n";
static const char *const ep4 = "name = 'e' experts = 64 top_k = 4 hidden = 128 ffn = 64 tokens = 1000 "
                               "mesh = { ep = 4 }\n";

/* Rebuild *pd (empty or built before) for spec under the embedded table. */
static int plan_of(moe_plan_desc_t *pd, const char *spec) {
    moe_spec_t s;
    moe_diag_t d;
    char err[256];
    moe_plan_desc_free(pd);
    if (moe_spec_load(&s, "t.moe", spec, NULL, 0, &d))
        return fprintf(stderr, "%s\n", d.msg), 1;
    return moe_plan_desc_build(pd, &s, moe_tuning_default(), err, sizeof err) ? (fprintf(stderr, "%s\n", err), 1)
                                                                               : 0;
}

/* Whether templates/NAME.lua is one of the embedded templates. */
static int has_template(const char *name) {
    char path[128];
    snprintf(path, sizeof path, "templates/%s.lua", name);
    for (size_t i = 0; i < moe_embedded_templates_count; i++)
        if (strcmp(moe_embedded_templates[i].path, path) == 0)
            return 1;
    return 0;
}

int main(void) {
    CASE("the family table: one descriptor per id, a variant for every arch, its templates embedded");
    for (int id = 0; id < MOE_FAMILY_COUNT; id++) {
        const moe_family_t *f = moe_family((moe_kfamily_t)id);
        CHECKF(f && (int)f->id == id && f->name && f->spell, "family %d", id);
        for (int a = 0; f && a < MOE_FAMILY_ARCHES; a++) {
            const moe_family_variant_t *v = moe_family_variant(f, (moe_arch_t)a);
            CHECKF(v && v->geometry, "family %s arch %d", f->name, a);
            if (v)
                CHECKF(has_template(v->tmpl) && has_template(v->code), "family %s: templates/%s.lua, templates/%s.lua",
                       f->name, v->tmpl, v->code);
        }
        for (int j = 0; f && j < id; j++)
            CHECKF(strcmp(moe_family((moe_kfamily_t)j)->name, f->name) != 0, "two families named %s", f->name);
    }
    CHECK(moe_family(MOE_FAMILY_COUNT) == NULL);
    CHECK_STREQ(moe_family_variant(moe_family(MOE_K_GEMM_UP), MOE_ARCH_SM90A)->code, "gemm_sm90");
    CHECK(moe_family_variant(moe_family(MOE_K_GEMM_DOWN), MOE_ARCH_SM80)->engine != NULL);
    CHECK(moe_family_variant(moe_family(MOE_K_ROUTE), MOE_ARCH_SM80) ==
          moe_family_variant(moe_family(MOE_K_ROUTE), MOE_ARCH_SM90A));

    CASE("a plan's kernels: every forward family on every arch, named by its family");
    moe_plan_desc_t pd = {0};
    CHECK(plan_of(&pd, mixtral) == 0);
    for (int a = 0; a < MOE_FAMILY_ARCHES; a++)
        for (int k = 0; k < MOE_K_COUNT; k++) {
            const moe_kernel_desc_t *d = &moe_plan_kernels(&pd, (moe_arch_t)a)[k];
            char name[128];
            moe_family_ctx_t ctx = moe_plan_family_ctx(&pd, (moe_arch_t)a);
            moe_family((moe_kfamily_t)k)->spell(name, sizeof name, &ctx, d);
            CHECKF((int)d->family == k && d->threads > 0 && strcmp(d->name, name) == 0, "%s", d->name);
            CHECKF(strncmp(d->name, "mx_", 3) == 0, "%s", d->name);
        }
    /* arch-neutral families are one kernel on every arch */
    CHECK_STREQ(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_ROUTE].name,
                moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_ROUTE].name);
    CHECK(strcmp(moe_plan_kernels(&pd, MOE_ARCH_SM80)[MOE_K_GEMM_UP].name,
                 moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].name) != 0);
    CHECK(pd.swiglu.family == MOE_K_SWIGLU);
    CHECK_STREQ(pd.swiglu.name, "mx_swiglu_bf16_f12288");
    CHECK(pd.pack.family == MOE_K_PACK && pd.pack.threads == 256);
    CHECK_STREQ(pd.pack.name, "mx_pack_bf16_f12288_h4096");

    CASE("grids: the family's, for a token count");
    unsigned g[3];
    moe_family_grid(&pd.swiglu, &pd.spec, 0, 100, g);
    CHECK(g[0] == (100 * 12288 / 8 + 255) / 256 && g[1] == 1 && g[2] == 1);
    moe_family_grid(&pd.pack, &pd.spec, 0, 1000, g); /* pack: n elements, one per thread */
    CHECK(g[0] == (1000 + 255) / 256 && g[1] == 1 && g[2] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM90A, MOE_K_GEMM_DOWN, 4096, g);
    CHECK(g[0] == 4096 / 256 && g[1] == (unsigned)moe_plan_max_tiles(&pd, 4096) && g[2] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_GEMM_UP, 4096, g);
    CHECK(g[0] == 2 * 12288 / 128 && g[1] == (unsigned)moe_plan_max_tiles(&pd, 4096));
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_ROUTE, 33, g);
    CHECK(g[0] == 2 && g[1] == 16); /* few tokens: H = 4096 split in 16 shares of 256 */
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_ROUTE, 4096, g);
    CHECK(g[0] == 128 && g[1] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_COMBINE, 1, g);
    CHECK(g[0] == 1 && g[1] == 16);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_COMBINE, 4096, g);
    CHECK(g[0] == 4096 / 8 && g[1] == 1);
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_PERMUTE_SCATTER, 5, g);
    CHECK(g[0] == 2); /* 10 rows, 8 per block */
    moe_plan_grid(&pd, MOE_ARCH_SM80, MOE_K_PERMUTE_PLAN, 4096, g);
    CHECK(g[0] == 1 && g[1] == 1 && g[2] == 1);

    CASE("the backward GEMMs: planned only with training = true, named, sized and gridded by their family");
    CHECK(moe_plan_bgemm(&pd, MOE_ARCH_SM80) == NULL && pd.bgemm[MOE_ARCH_SM90A][0].name[0] == '\0');
    {
        moe_plan_desc_t tp = {0};
        CHECK(plan_of(&tp, "name = 'tr' experts = 8 top_k = 2 hidden = 264 ffn = 136 tokens = 4096 "
                           "training = true\n") == 0);
        static const char *const names[MOE_BGEMM_COUNT] = {"tr_dgrad_down_bf16_m128", "tr_dgrad_up_bf16_m128",
                                                          "tr_wgrad_up_bf16_m128", "tr_wgrad_down_bf16_m128"};
        for (int a = 0; a < MOE_FAMILY_ARCHES; a++)
            for (int i = 0; moe_plan_bgemm(&tp, (moe_arch_t)a) && i < MOE_BGEMM_COUNT; i++) {
                const moe_kernel_desc_t *d = &moe_plan_bgemm(&tp, (moe_arch_t)a)[i];
                const int wgrad = i >= 2;
                CHECKF((int)d->family == MOE_K_BGEMM_FIRST + i && strncmp(d->name, names[i], strlen(names[i])) == 0,
                       "%s", d->name);
                CHECK(d->threads == 32 * d->tile.warps_m * d->tile.warps_n && d->tile.bm == 128 && d->tile.consumers == 0);
                CHECK(d->smem == d->tile.stages * (wgrad ? d->tile.bk * (d->tile.bm + 8) + d->tile.bk * (d->tile.bn + 8)
                                                         : d->tile.bm * (d->tile.bk + 8) + d->tile.bk * (d->tile.bn + 8)) * 2);
            }
        CHECK(moe_plan_bgemm(&tp, MOE_ARCH_SM80) != NULL);
        /* the same kernel serves both arches */
        CHECK_STREQ(moe_plan_bgemm(&tp, MOE_ARCH_SM80)[0].name, moe_plan_bgemm(&tp, MOE_ARCH_SM90A)[0].name);
        const moe_kernel_desc_t *b = moe_plan_bgemm(&tp, MOE_ARCH_SM90A);
        unsigned g[3];
        moe_family_grid(&b[0], &tp.spec, 4096, 77, g); /* dgrad_down: F / bn x the row tiles */
        CHECK(g[0] == 2 && g[1] == 77 && g[2] == 1);
        moe_family_grid(&b[1], &tp.spec, 4096, 77, g); /* dgrad_up: H / bn x the row tiles */
        CHECK(g[0] == 3 && g[1] == 77 && g[2] == 1);
        moe_family_grid(&b[2], &tp.spec, 4096, 0, g); /* wgrad_up: H / bn x 2F / bm x slots */
        CHECK(g[0] == 3 && g[1] == 3 && g[2] == 8);
        moe_family_grid(&b[3], &tp.spec, 4096, 0, g); /* wgrad_down: F / bn x H / bm x slots */
        CHECK(g[0] == 2 && g[1] == 3 && g[2] == 8);
        /* a 64-row block: the dgrads follow it, the wgrads keep their 128 rows */
        CHECK(plan_of(&tp, "name = 'tr' experts = 64 top_k = 2 hidden = 264 ffn = 136 tokens = 512 "
                           "training = true\n") == 0);
        CHECK(tp.align == 64 && moe_plan_bgemm(&tp, MOE_ARCH_SM80)[0].tile.bm == 64 &&
              moe_plan_bgemm(&tp, MOE_ARCH_SM80)[2].tile.bm == 128);
        moe_plan_desc_free(&tp);
    }

    CASE("the workspace: regions in order, 256-byte aligned, the total");
    for (int i = 1; i < MOE_WS_COUNT; i++)
        CHECK(pd.ws[i].offset >= pd.ws[i - 1].offset + pd.ws[i - 1].bytes && pd.ws[i].offset % 256 == 0);
    CHECK(pd.ws_bytes >= pd.ws[MOE_WS_COUNT - 1].offset + pd.ws[MOE_WS_COUNT - 1].bytes && pd.ws_bytes % 256 == 0);

    CASE("one plan: the mesh tables and the EP part are built with the kernels");
    CHECK(pd.mesh.world == 1 && pd.mesh.nheld == 8 && moe_plan_ep_desc(&pd) == NULL);
    CHECK(plan_of(&pd, ep4) == 0);
    {
        const moe_ep_desc_t *ep = moe_plan_ep_desc(&pd);
        CHECK(pd.mesh.world == 4 && ep && ep->ep == 4 && ep->nheld == pd.mesh.nheld && ep->nheld == 16);
        for (int i = 0; ep && i < MOE_EK_COUNT; i++)
            CHECK((int)ep->k[i].family == MOE_K_EP_FIRST + i && ep->k[i].threads > 0);
        CHECK(ep && strstr(ep->k[MOE_EK_SEND_PLAN].name, "p4s16c0"));
        moe_ep_grid(ep, &pd, MOE_EK_ROWS, 1000, 17, g);
        CHECK(g[0] == 3);
    }

    CASE("one plan: an EP part that cannot be built fails the plan, which is left empty");
    {
        moe_spec_t s;
        moe_diag_t sd;
        char err[256];
        moe_plan_desc_free(&pd);
        CHECK(moe_spec_load(&s, "e.moe", ep4, &(moe_override_t){"tokens=1000000"}, 1, &sd) == 0);
        CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) != 0 &&
                   strstr(err, "dispatch.mode"), "%s", err);
        CHECK(pd.mesh.ranks == NULL);
    }
    CASE("one plan: too many experts for the route kernel fails the plan, naming the family's limit");
    {
        moe_spec_t s;
        moe_diag_t sd;
        char err[256];
        moe_plan_desc_free(&pd);
        if (moe_spec_load(&s, "e.moe", "name = 'big' experts = 2048 top_k = 2 hidden = 128 ffn = 64", NULL, 0, &sd) ==
            0)
            CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) != 0 &&
                       strstr(err, "at most 1024 experts"), "%s", err);
    }
    moe_plan_desc_free(&pd);
    return check_report("test_plan");
}
