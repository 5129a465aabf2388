/* test_nvrtc.c — every kernel of every example spec (and of the test specs listed below,
 * some for sm_90a alone), with training = true where the mesh is one device (the backward
 * GEMMs too), compiles under NVRTC for each arch with no warnings, and each kernel the
 * plan names (and the cuDNN path's swiglu kernel) is in the cubin; and the sm_90a GEMMs on the
 * ping-pong, split-K and gemv grids, for specs and tiles listed below (pingpong_jobs). Compiles run in child processes,
 * a few at a time. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include "compile.h"
#include "gen_fixture.h"

#include <stdint.h>

/* ---- NVRTC: every kernel of every example spec, each arch ------------------- */

typedef struct {
    int rc;               /* 0 compiled */
    size_t cubin, log;    /* bytes */
    char missing[128];    /* a kernel name not found in the cubin */
    char msg[3000];       /* diag or log */
    int variants;         /* the plan's GEMM variants (gen/plan.h), each compiled */
} job_result_t;

/* A spec compiled with its sm_90a GEMMs on the ping-pong grid: a one-entry
 * tuning table for the spec's shape gives them this tile (bm x bn x 64,
 * stages, group_m), both tile shapes a warpgroup holds whole and smaller
 * ones, over bias, clamp, GeGLU, fp16 and N tails (and the U store of a
 * training plan, as every job where the mesh is one device). With splitk
 * S > 0, on the split-K grid instead (bm / 64 consumers, S CTAs per tile:
 * min(S, k tiles) per GEMM), not training (a training plan does not split).
 * With gemv, on the gemv grid (templates/gemm_gemv.lua: bm the row block, bn
 * the weight rows per CTA, stages the unroll), training where it can (the U
 * store), K staged in one pass and in several (K > MOE_GEMV_KC). An fp8
 * spec's job plans an entry of dtype e4m3 (bk 128, bm / 64 consumers, one
 * CTA per tile, or with persist the persistent grid). */
typedef struct {
    const char *path, *set; /* set: a spec override, or NULL */
    int bm, bn, stages, group_m;
    int splitk, gemv;
    int persist;            /* an fp8 job: the persistent grid instead of one CTA per tile */
    const char *table;      /* a tuning table to plan under instead (its backward entries: tests/tune/bwd*.tune) */
} pingpong_job_t;
static const pingpong_job_t pingpong_jobs[] = {
    {"examples/specs/mixtral-8x7b.moe", NULL, 64, 256, 4, 8, 0, 0, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", NULL, 128, 128, 4, 16, 0, 0, 0, NULL},
    {"examples/specs/deepseek-v3-ep8.moe", NULL, 64, 256, 4, 8, 0, 0, 0, NULL},
    {"examples/specs/gpt-oss-120b.moe", NULL, 128, 128, 4, 8, 0, 0, 0, NULL},  /* biases, clamped SwiGLU, N tails */
    {"tests/specs/apply_input_k2.moe", NULL, 64, 256, 3, 4, 0, 0, 0, NULL},    /* biases, N tails of both GEMMs */
    {"tests/specs/geglu.moe", NULL, 128, 64, 6, 8, 0, 0, 0, NULL},
    {SMALL, "dtype=fp16", 64, 128, 6, 8, 0, 0, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", NULL, 64, 128, 6, 8, 16, 0, 0, NULL},
    {"examples/specs/mixtral-8x7b.moe", NULL, 64, 256, 4, 8, 8, 0, 0, NULL},
    {"examples/specs/gpt-oss-120b.moe", NULL, 128, 128, 4, 8, 5, 0, 0, NULL}, /* biases, clamped SwiGLU, N tails */
    {"tests/specs/apply_input_k2.moe", NULL, 64, 256, 3, 4, 3, 0, 0, NULL},   /* biases, N tails; 5 and 3 k tiles */
    {"tests/specs/geglu.moe", NULL, 128, 64, 6, 8, 2, 0, 0, NULL},
    {SMALL, "dtype=fp16", 64, 128, 6, 8, 4, 0, 0, NULL},
    {"examples/specs/qwen3-30b-a3b.moe", NULL, 64, 32, 2, 1, 0, 1, 0, NULL},
    {"examples/specs/mixtral-8x7b.moe", NULL, 64, 64, 2, 1, 0, 1, 0, NULL},      /* down: K 14336 in 4 staged passes */
    {"examples/specs/deepseek-v3-ep8.moe", NULL, 64, 128, 4, 1, 0, 1, 0, NULL},  /* up: K 7168 in 2 */
    {"examples/specs/gpt-oss-120b.moe", NULL, 128, 64, 1, 1, 0, 1, 0, NULL},     /* biases, clamped SwiGLU, N tails */
    {"tests/specs/apply_input_k2.moe", NULL, 64, 256, 4, 1, 0, 1, 0, NULL},      /* biases, N tails of both GEMMs */
    {"tests/specs/geglu.moe", NULL, 64, 32, 1, 1, 0, 1, 0, NULL},
    {SMALL, "dtype=fp16", 128, 64, 2, 1, 0, 1, 0, NULL},
    /* fp8 specs under an entry of dtype e4m3: two consumer warpgroups of 64 rows (bm 128), bk 128, bn 256 */
    {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe", NULL, 128, 256, 4, 8, 0, 0, 0, NULL},   /* block scales */
    {"examples/specs/fp8/mixtral-8x7b-fp8.moe", NULL, 128, 256, 3, 8, 0, 0, 0, NULL},    /* channel scales */
    /* and on the persistent grid: one consumer, two */
    {"examples/specs/fp8/mixtral-8x7b-fp8.moe", NULL, 64, 256, 4, 8, 0, 0, 1, NULL},
    {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe", NULL, 128, 256, 4, 8, 0, 0, 1, NULL},
    /* and on the gemv grid (its fp8 device code): the up GEMM's clusters of 8, 4 and 1 CTAs */
    {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe", NULL, 64, 32, 2, 1, 0, 1, 0, NULL},     /* block scales */
    {"examples/specs/fp8/mixtral-8x7b-fp8.moe", NULL, 64, 64, 4, 1, 0, 1, 0, NULL},      /* channel; down K in 2 passes */
    {"examples/specs/fp8/deepseek-v3-ep8-fp8.moe", NULL, 128, 256, 1, 1, 0, 1, 0, NULL}, /* bn 256: no cluster */
    /* the backward GEMMs on the tuning tables' backward entries (test_bwd_gpu runs them) */
    {"tests/specs/train_softmax.moe", NULL, 0, 0, 0, 0, 0, 0, 0, "tests/tune/bwd.tune"},
    {"tests/specs/train_softmax_hgrad.moe", NULL, 0, 0, 0, 0, 0, 0, 0, "tests/tune/bwd2.tune"},
    {"tests/specs/train_gptoss.moe", NULL, 0, 0, 0, 0, 0, 0, 0, "tests/tune/bwd.tune"},
};
#define NPINGPONG ((int)(sizeof pingpong_jobs / sizeof *pingpong_jobs))

/* Plan spec with overrides o[0..no) (for a ping-pong job pp, its GEMMs on
 * its tile). Returns 0, or 1 with the reason in msg. */
static int job_plan(const char *spec, const pingpong_job_t *pp, const moe_override_t *o, int no,
                    moe_plan_desc_t *pd, char *msg, size_t n) {
    if (!pp) {
        if (load_plan(spec, o, no, pd))
            return snprintf(msg, n, "%s does not load%s", spec, no ? " with training = true" : ""), 1;
        return 0;
    }
    moe_spec_t s;
    moe_diag_t d;
    if (moe_spec_load(&s, spec, NULL, o, no, &d))
        return snprintf(msg, n, "%s", d.msg), 1;
    if (pp->table) { /* the table's backward entries: every backward GEMM on its entry's tile */
        static moe_tuning_t tab; /* the plan keeps pointers into it (one job per child process) */
        if (moe_tuning_load(&tab, pp->table, &d))
            return snprintf(msg, n, "%s", d.msg), 1;
        if (moe_plan_desc_build(pd, &s, &tab, msg, n))
            return 1;
        const moe_tuning_entry_t *cap = moe_tuning_find(&tab, &s, MOE_ARCH_SM90A);
        for (int i = 0; i < MOE_BGEMM_COUNT; i++) {
            const moe_tuning_entry_t *b = moe_tuning_find_bgemm(&tab, cap, MOE_K_BGEMM_FIRST + i);
            const moe_tile_cfg_t *t = &moe_plan_bgemm(pd, MOE_ARCH_SM90A)[i].tile;
            if (!b || t->bm != b->bm || t->bn != b->bn || t->stages != b->stages || t->consumers != b->consumers)
                return snprintf(msg, n, "%s: backward GEMM %d is not on %s's entry", spec, i, pp->table), 1;
        }
        return 0;
    }
    static moe_tuning_entry_t e; /* the plan keeps a pointer (one job per child process) */
    static moe_tuning_t one;
    const int fp8 = moe_spec_fp8(&s); /* an e4m3 entry: bm / 64 consumers on one tile, one CTA per tile */
    e = (moe_tuning_entry_t){.experts = s.experts, .top_k = s.top_k, .hidden = s.hidden, .ffn = s.ffn,
                             .dtype = s.dtype, .arch = MOE_ARCH_SM90A, .tokens = 1, .bm = pp->bm, .bn = pp->bn,
                             .bk = fp8 && !pp->gemv ? 128 : 64, .stages = pp->stages,
                             .consumers = pp->gemv ? 1 : pp->splitk || fp8 ? pp->bm / 64 : 2, .group_m = pp->group_m,
                             .persistent = fp8 ? pp->persist : !pp->splitk && !pp->gemv,
                             .pingpong = !pp->splitk && !pp->gemv && !fp8, .splitk = pp->splitk, .gemv = pp->gemv,
                             .fp8 = fp8};
    const moe_tile_cfg_t t = {.bm = e.bm, .bn = e.bn, .bk = e.bk, .stages = e.stages, .consumers = e.consumers,
                              .group_m = e.group_m, .persistent = e.persistent, .pingpong = e.pingpong,
                              .splitk = e.splitk, .gemv = e.gemv};
    if (fp8 ? moe_gemm_sm90_fp8_tile_check(&t, msg, n) : moe_gemm_sm90_tile_check(&t, msg, n))
        return 1;
    one = (moe_tuning_t){.file = "(pingpong job)", .e = &e, .n = 1};
    if (moe_plan_desc_build(pd, &s, &one, msg, n))
        return 1;
    char c2[32];
    snprintf(c2, sizeof c2, "k128s%dc%d", pp->stages, pp->bm / 64);
    const char *want = pp->gemv ? "_sm90a_gemv_" : fp8 ? c2 : pp->splitk ? "_sm90a_tma_splitk" : "_sm90a_tma_pingpong_";
    for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++)
        if (!strstr(moe_plan_kernels(pd, MOE_ARCH_SM90A)[k].name, want))
            return snprintf(msg, n, "%s is not a %s kernel", moe_plan_kernels(pd, MOE_ARCH_SM90A)[k].name,
                            pp->gemv ? "gemv" : fp8 ? c2 : pp->splitk ? "split-K" : "ping-pong"), 1;
    return 0;
}

static void compile_job(const char *spec, const pingpong_job_t *pp, moe_arch_t arch, job_result_t *r) {
    memset(r, 0, sizeof *r);
    /* with training = true where the spec allows it (one device, not fp8,
     * not sparsemixer's inference-only routing, zero experts, given weights, fp32 router weights nor a router
     * wider than the experts), so the
     * same compile also covers the backward GEMMs (the forward's kernels are
     * the same either way) */
    moe_plan_desc_t pd;
    moe_override_t o[2] = {{pp && pp->set ? pp->set : "training=true"}, {"training=true"}};
    const int nset = pp && pp->set ? 1 : 0;
    if (job_plan(spec, pp, o, nset, &pd, r->msg, sizeof r->msg)) {
        r->rc = 1;
        return;
    }
    if (!pd.spec.training && moe_spec_world(&pd.spec) == 1 && !moe_spec_fp8(&pd.spec) && !(pp && pp->splitk) &&
        pd.spec.router.score != MOE_SCORE_SPARSEMIXER && !pd.spec.zero_experts &&
        pd.spec.router.score != MOE_SCORE_GIVEN && pd.spec.router.weight_dtype != MOE_ROUTER_WEIGHT_FP32 &&
        moe_spec_router_hidden(&pd.spec) == pd.spec.hidden) {
        moe_plan_desc_free(&pd);
        if (job_plan(spec, pp, o, nset + 1, &pd, r->msg, sizeof r->msg)) {
            r->rc = 1;
            return;
        }
    }
    moe_buf_t src = {0}, cubin = {0}, log = {0};
    moe_diag_t d;
    if (moe_emit_source(&pd, NULL, &src, &d)) {
        r->rc = 1;
        snprintf(r->msg, sizeof r->msg, "%s", d.msg);
        moe_buf_free(&src);
        moe_plan_desc_free(&pd);
        return;
    }
    char name[128];
    snprintf(name, sizeof name, "%s.cu", pd.spec.name);
    r->rc = moe_nvrtc_compile(src.data, name, arch, &cubin, NULL, &log, &d);
    r->cubin = cubin.len;
    r->log = log.len;
    if (r->rc)
        snprintf(r->msg, sizeof r->msg, "%s", d.msg);
    else if (log.len)
        snprintf(r->msg, sizeof r->msg, "%s", log.data);
    for (int k = 0; !r->rc && k < MOE_K_COUNT; k++) {
        const char *kname = moe_plan_kernels(&pd, arch)[k].name;
        if (!find_bytes(cubin.data, cubin.len, kname)) {
            snprintf(r->missing, sizeof r->missing, "%s", kname);
            break;
        }
    }
    /* and every GEMM variant's (gen/plan.h: a tuned spec has one per bucket) */
    for (int v = 0; !r->rc && !r->missing[0] && v < pd.nvariants; v++)
        for (int k = 0; k < MOE_K_COUNT; k++)
            if (!find_bytes(cubin.data, cubin.len, pd.variants[v].kernels[arch][k].name)) {
                snprintf(r->missing, sizeof r->missing, "%s", pd.variants[v].kernels[arch][k].name);
                break;
            }
    r->variants = pd.nvariants;
    /* and the cuDNN path's standalone activation, which every source carries */
    moe_kernel_desc_t act;
    const moe_family_ctx_t ctx = {.spec = &pd.spec, .arch = arch, .align = pd.align, .tuned = pd.tuned};
    char e[256];
    if (!r->rc && !r->missing[0]) {
        if (moe_family_build(&act, MOE_K_SWIGLU, &ctx, e, sizeof e))
            snprintf(r->missing, sizeof r->missing, "swiglu (%s)", e);
        else if (!find_bytes(cubin.data, cubin.len, act.name))
            snprintf(r->missing, sizeof r->missing, "%s", act.name);
    }
    /* and the device-side weight pack, which every source carries too */
    if (!r->rc && !r->missing[0] && !find_bytes(cubin.data, cubin.len, pd.pack.name))
        snprintf(r->missing, sizeof r->missing, "%s", pd.pack.name);
    /* and an expert-parallel plan's dispatch kernels */
    const moe_ep_desc_t *ed = moe_plan_ep_desc(&pd);
    for (int i = 0; ed && i < MOE_EK_COUNT && !r->rc && !r->missing[0]; i++)
        if (!find_bytes(cubin.data, cubin.len, ed->k[i].name))
            snprintf(r->missing, sizeof r->missing, "%s", ed->k[i].name);
    /* and a training spec's backward kernels */
    for (int i = 0; pd.has_bwd && i < MOE_BK_COUNT && !r->rc && !r->missing[0]; i++)
        if (!find_bytes(cubin.data, cubin.len, pd.bwd[i].name))
            snprintf(r->missing, sizeof r->missing, "%s", pd.bwd[i].name);
    /* and the backward GEMMs of a training spec */
    const moe_kernel_desc_t *bg = moe_plan_bgemm(&pd, arch);
    for (int i = 0; bg && !r->rc && !r->missing[0] && i < MOE_BGEMM_COUNT; i++)
        if (!find_bytes(cubin.data, cubin.len, bg[i].name))
            snprintf(r->missing, sizeof r->missing, "%s", bg[i].name);
    moe_buf_free(&src);
    moe_buf_free(&cubin);
    moe_buf_free(&log);
    moe_plan_desc_free(&pd);
}

static void test_nvrtc_all(void) {
    CASE("NVRTC: every example spec, each arch");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: the kernel templates are not all written yet", missing_template);
        return;
    }
    static char names[64][256];
    int n = list_dir("examples/specs", names, 64);
    /* the jobs: (spec, arch) pairs; every example spec on both arches */
    static const moe_arch_t arches[] = {MOE_ARCH_SM90A, MOE_ARCH_SM80};
    enum { MAXTEST = 40, MAXJOBS = 2 * (64 + MAXTEST) + NPINGPONG };
    static char specs[64 + MAXTEST + NPINGPONG][300];
    int job_spec[MAXJOBS], job_arch[MAXJOBS], job_pp[MAXJOBS]; /* job_pp: a pingpong_jobs index, or -1 */
    for (int i = 0; i < MAXJOBS; i++)
        job_pp[i] = -1;
    int ns = 0, njobs = 0, multi = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l > 4 && strcmp(names[i] + l - 4, ".moe") == 0) {
            snprintf(specs[ns], sizeof specs[0], "examples/specs/%s", names[i]);
            for (int a = 0; a < 2; a++)
                job_spec[njobs] = ns, job_arch[njobs++] = a;
            ns++;
        }
    }
    CHECK(ns >= 5);
    /* and the test specs that stand for a feature no example spec has (test_gpu
     * runs each); those whose feature lives only in the arch-independent
     * kernels (route, permute, combine: one template for both arches) compile
     * for sm_90a alone */
    static const struct {
        const char *path;
        int both_arches;
    } test_specs[] = {
        {SMALL, 1},
        {"tests/specs/geglu.moe", 1},          /* activation.kind = "geglu" (the GEMM epilogues) */
        {"tests/specs/group_top1.moe", 0},     /* router.group_topk = 1, general group layout */
        {"tests/specs/group_nondiv.moe", 0},   /* topk_groups does not divide top_k, lane-segment groups */
        {"tests/specs/group_slots.moe", 0},    /* group_topk = 1, whole-slot groups, top_k not a multiple */
        {"tests/specs/group_12e.moe", 0},      /* 12 experts, top-3, 4 groups keeping 2 */
        {"tests/specs/apply_input.moe", 0},    /* router.apply = "input", Llama 4's top-1 sigmoid */
        {"tests/specs/apply_input_k2.moe", 0}, /* router.apply = "input", top-2, biases, clamped SwiGLU */
        {"examples/specs/fp8/deepseek-v3-ep8-fp8.moe", 0}, /* fp8 GEMMs (sm_90a only), block scales */
        {"examples/specs/fp8/mixtral-8x7b-fp8.moe", 0},    /* fp8 GEMMs, channel scales */
        {"examples/specs/fp8/deepseek-v3-ep8-mesh-fp8.moe", 0}, /* fp8 over EP8: the quantizing EP scatter */
        {"tests/specs/fp8_ep_input.moe", 0},   /* fp8 over EP4, capacity, router.apply = "input", biases */
        {"tests/specs/train_softmax.moe", 1},  /* training: the backward's kernels and GEMMs */
        {"tests/specs/train_gptoss.moe", 1},   /* training, fp16, logit_bias, ffn_bias, clamped SwiGLU */
        {"tests/specs/train_softmax_hgrad.moe", 1}, /* training, the weight gradients in bf16 */
        {"tests/specs/train_gptoss_hgrad.moe", 0},  /* training, the weight gradients in fp16, biases */
        {"tests/specs/train_sigmoid_groups.moe", 0}, /* training, sigmoid, groups, scale */
        {"tests/specs/sqrtsoftplus.moe", 1},   /* training, sqrt(softplus) scores, bias, clamp, shared */
        {"tests/specs/softcap.moe", 1},        /* training, the logit cap (route and the router's backward) */
        {"tests/specs/sparsemixer.moe", 0},    /* Phi-3.5-MoE's routing weights */
        {"tests/specs/zero_experts.moe", 0},   /* LongCat-Flash's zero experts: E + Z scored, x rows for them */
        {"tests/specs/train_input.moe", 0},    /* training, router.apply = "input", biases, clamp */
        {"tests/specs/train_shared.moe", 0},   /* training, a sigmoid-gated shared expert, fp16 */
        {"tests/specs/train_ep.moe", 1},       /* training on an EP rank: the dispatch and backward kernels */
        {"tests/specs/given_ids.moe", 0},      /* the caller's expert ids (DeepSeek-V4's hash layers) */
        {"tests/specs/given_weights.moe", 1},  /* the caller's ids and weights: a route without logits, fp16 */
        {"tests/specs/train_given.moe", 0},    /* training with the caller's ids: the router's backward skips drops */
        {"tests/specs/router_own_input.moe", 0}, /* Gemma 4's router: its own input, per-expert scales; GeGLU */
        {"tests/specs/router_latent.moe", 0}, /* a latent MoE: the router 1024 wide (router.hidden), x 256 */
        {"tests/specs/train_own_input.moe", 0},  /* its training: d router_x from dx's kernel, escale's sums */
        {"tests/specs/router_fp32.moe", 1},      /* fp32 router weights: the route splits them into three parts */
        {"tests/specs/train_clamp_after.moe", 0}, /* the gate's clamp after its unit, the shared expert's own limit */
        {"tests/specs/shared_unclamped.moe", 0},  /* HY-V4: clamped routed experts, an unclamped shared expert */
        {"tests/specs/train_relu2.moe", 0},       /* NemotronH's relu2 experts, training (the example: both arches) */
    };
    _Static_assert(sizeof test_specs / sizeof *test_specs <= MAXTEST, "specs[] has room for MAXTEST test specs");
    for (size_t i = 0; i < sizeof test_specs / sizeof *test_specs; i++) {
        snprintf(specs[ns], sizeof specs[0], "%s", test_specs[i].path);
        for (int a = 0; a < (test_specs[i].both_arches ? 2 : 1); a++)
            job_spec[njobs] = ns, job_arch[njobs++] = a;
        ns++;
    }
    /* and the ping-pong GEMMs, sm_90a alone */
    for (int i = 0; i < NPINGPONG; i++) {
        snprintf(specs[ns], sizeof specs[0], "%s", pingpong_jobs[i].path);
        job_pp[njobs] = i, job_spec[njobs] = ns++, job_arch[njobs++] = 0;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    double t0 = now();

    /* one child per compile, `workers` at a time; results come back in pipes */
    pid_t pid[MAXJOBS];
    int fd[MAXJOBS];
    int next = 0, running = 0, done = 0;
    job_result_t res;
    while (done < njobs) {
        while (running < workers && next < njobs) {
            int p[2];
            if (pipe(p)) {
                CHECKF(0, "pipe: %s", strerror(errno));
                return;
            }
            fflush(NULL);
            pid_t c = fork();
            if (c == 0) {
                close(p[0]);
                compile_job(specs[job_spec[next]], job_pp[next] < 0 ? NULL : &pingpong_jobs[job_pp[next]],
                            arches[job_arch[next]], &res);
                ssize_t w = write(p[1], &res, sizeof res);
                _exit(w == (ssize_t)sizeof res ? 0 : 3);
            }
            close(p[1]);
            pid[next] = c;
            fd[next] = p[0];
            next++;
            running++;
        }
        /* collect the oldest running job (results are read in job order) */
        int j = done;
        job_result_t r;
        memset(&r, 0, sizeof r);
        size_t got = 0;
        while (got < sizeof r) {
            ssize_t k = read(fd[j], (char *)&r + got, sizeof r - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        close(fd[j]);
        int st = 0;
        waitpid(pid[j], &st, 0);
        running--;
        done++;
        char label[400];
        if (job_pp[j] < 0) {
            snprintf(label, sizeof label, "NVRTC %s %s", specs[job_spec[j]], moe_arch_name(arches[job_arch[j]]));
        } else if (pingpong_jobs[job_pp[j]].table) {
            const pingpong_job_t *pp = &pingpong_jobs[job_pp[j]];
            snprintf(label, sizeof label, "NVRTC %s sm_90a under %s (its backward entries)", pp->path, pp->table);
        } else {
            const pingpong_job_t *pp = &pingpong_jobs[job_pp[j]];
            char grid[16] = "pingpong";
            const int fp8 = strstr(pp->path, "fp8") != NULL; /* examples/specs/fp8/: an e4m3 entry (job_plan) */
            if (pp->splitk)
                snprintf(grid, sizeof grid, "splitk%d", pp->splitk);
            else if (pp->gemv)
                snprintf(grid, sizeof grid, "gemv");
            else if (fp8)
                snprintf(grid, sizeof grid, "%s", pp->persist ? "persist" : "tile");
            snprintf(label, sizeof label, "NVRTC %s%s%s sm_90a, GEMMs %s m%dn%dk%ds%dg%d", pp->path,
                     pp->set ? " " : "", pp->set ? pp->set : "", grid, pp->bm, pp->bn, fp8 && !pp->gemv ? 128 : 64, pp->stages,
                     pp->group_m);
        }
        CASE(label);
        CHECKF(got == sizeof r && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the compile process failed (status %d)",
               st);
        if (got != sizeof r)
            continue;
        CHECKF(r.rc == 0, "\n%s", r.msg);
        CHECKF(r.log == 0, "NVRTC warnings:\n%s", r.msg);
        CHECK(r.cubin > 0);
        CHECKF(r.missing[0] == 0, "kernel %s is not in the cubin", r.missing);
        multi += r.variants > 1;
    }
    CASE("NVRTC: the tuned example specs' GEMM variants compiled");
    CHECKF(multi >= 8, "only %d compiles had several GEMM variants", multi); /* 4 tuned one-device specs x 2 arches */
    fprintf(stderr, "test_nvrtc: %d of them with several GEMM variants\n", multi);
    fprintf(stderr, "test_nvrtc: NVRTC: %d compiles (%d specs, each arch or sm_90a alone; pingpong, split-K and gemv GEMMs) on %d "
                    "workers in %.1f s\n",
            njobs, ns, workers, now() - t0);
}


/* ---- MOEGEN_LINEINFO: line tables, the same code ------------------------------ */

/* The sections of an ELF64 image (a cubin): name -> (offset, size) of the
 * i-th one; 0 when i is past them or the image is not one. */
static int elf_section(const moe_buf_t *b, int i, const char **name, size_t *off, size_t *size) {
    const unsigned char *p = (const unsigned char *)b->data;
    if (b->len < 64 || memcmp(p, "\177ELF", 4) || p[4] != 2)
        return 0;
    uint64_t shoff;
    uint16_t shentsize, shnum, shstrndx;
    memcpy(&shoff, p + 0x28, 8), memcpy(&shentsize, p + 0x3a, 2), memcpy(&shnum, p + 0x3c, 2), memcpy(&shstrndx, p + 0x3e, 2);
    if (i >= shnum || shstrndx >= shnum || shentsize < 64 || shoff + (uint64_t)shnum * shentsize > b->len)
        return 0;
    uint32_t nm, type;
    uint64_t o, sz, stro;
    memcpy(&nm, p + shoff + (uint64_t)i * shentsize, 4), memcpy(&type, p + shoff + (uint64_t)i * shentsize + 4, 4);
    memcpy(&o, p + shoff + (uint64_t)i * shentsize + 0x18, 8), memcpy(&sz, p + shoff + (uint64_t)i * shentsize + 0x20, 8);
    memcpy(&stro, p + shoff + (uint64_t)shstrndx * shentsize + 0x18, 8);
    if (stro + nm >= b->len || (type != 8 && o + sz > b->len)) /* 8: SHT_NOBITS, no bytes in the file */
        return 0;
    *name = (const char *)p + stro + nm, *off = (size_t)o, *size = type == 8 ? 0 : (size_t)sz;
    return 1;
}

static int elf_find(const moe_buf_t *b, const char *want, size_t *off, size_t *size) {
    const char *name;
    for (int i = 0; elf_section(b, i, &name, off, size); i++)
        if (strcmp(name, want) == 0)
            return 1;
    return 0;
}

/* MOEGEN_LINEINFO=on compiles with line tables (the profiler's source
 * view through the #line directives) and the same code: every kernel's
 * .text section is the same bytes as without; unset and "off" add none;
 * any other value is refused, naming the variable. */
static void test_lineinfo(void) {
    CASE("NVRTC: MOEGEN_LINEINFO=on adds line tables and changes no kernel's code; other values refused");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent", missing_template);
        return;
    }
    moe_plan_desc_t pd;
    if (load_plan("tests/specs/minimal.moe", NULL, 0, &pd)) {
        CHECKF(0, "tests/specs/minimal.moe does not plan");
        return;
    }
    moe_buf_t src = {0}, cubin[2] = {{0}}, log = {0};
    moe_diag_t d;
    int ok = !moe_emit_source(&pd, NULL, &src, &d);
    CHECKF(ok, "%s", d.msg);
    const char *saved = getenv("MOEGEN_LINEINFO");
    char keep[64] = "";
    if (saved)
        snprintf(keep, sizeof keep, "%s", saved);
    for (int on = 0; ok && on < 2; on++) {
        setenv("MOEGEN_LINEINFO", on ? "on" : "off", 1);
        CHECKF(moe_nvrtc_compile(src.data, "minimal.cu", MOE_ARCH_SM90A, &cubin[on], NULL, &log, &d) == 0, "%s", d.msg);
        CHECKF((strstr(moe_nvrtc_options(), "-lineinfo") != NULL) == on, "options \"%s\" with MOEGEN_LINEINFO=%s",
               moe_nvrtc_options(), on ? "on" : "off");
        size_t o, n;
        CHECKF(elf_find(&cubin[on], ".debug_line", &o, &n) == on && elf_find(&cubin[on], ".nv_debug_line_sass", &o, &n) == on,
               "line tables %s with MOEGEN_LINEINFO=%s", on ? "missing" : "present", on ? "on" : "off");
    }
    int texts = 0;
    const char *name;
    size_t o0, n0, o1, n1;
    for (int i = 0; ok && elf_section(&cubin[0], i, &name, &o0, &n0); i++) {
        if (strncmp(name, ".text.", 6))
            continue;
        texts++;
        CHECKF(elf_find(&cubin[1], name, &o1, &n1) && n1 == n0 && memcmp(cubin[0].data + o0, cubin[1].data + o1, n0) == 0,
               "%s differs with MOEGEN_LINEINFO=on", name);
    }
    CHECKF(!ok || texts >= 5, "only %d kernel sections found in the cubin", texts);
    setenv("MOEGEN_LINEINFO", "yes", 1);
    moe_buf_t none = {0};
    CHECKF(moe_nvrtc_compile(src.data, "minimal.cu", MOE_ARCH_SM90A, &none, NULL, &log, &d) != 0 && none.len == 0 &&
               strstr(d.msg, "minimal.cu:1: error: MOEGEN_LINEINFO=yes: expected on or off"),
           "MOEGEN_LINEINFO=yes: %s", d.msg);
    if (saved)
        setenv("MOEGEN_LINEINFO", keep, 1);
    else
        unsetenv("MOEGEN_LINEINFO");
    /* moegen compile: bad input, exit 2, nothing written */
    char cmd[1200], out[2048], dir[600];
    snprintf(dir, sizeof dir, "%s/lineinfo_out", tmp_root);
    snprintf(cmd, sizeof cmd, "MOEGEN_LINEINFO=maybe %s/moegen compile tests/specs/minimal.moe -o '%s' 2>&1", MOEGEN_BUILD,
             dir);
    FILE *f = popen(cmd, "r");
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = 0;
    const int st = f ? pclose(f) : -1;
    struct stat sb;
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 2 && strstr(out, "moegen: error: MOEGEN_LINEINFO=maybe: expected on or off") &&
               stat(dir, &sb) != 0,
           "%s: status %d, output:\n%s", cmd, st, out);
    moe_buf_free(&none);
    moe_buf_free(&cubin[0]);
    moe_buf_free(&cubin[1]);
    moe_buf_free(&log);
    moe_buf_free(&src);
    moe_plan_desc_free(&pd);
}

int main(void) {
    if (gen_fixture_setup("test_nvrtc"))
        return 1;
    test_lineinfo();
    test_nvrtc_all();
    rm_rf(tmp_root);
    return check_report("test_nvrtc");
}
