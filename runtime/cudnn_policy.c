/* cudnn_policy.c — whether each FFN stage takes cuDNN: the modes, the
 * version and speed tables, the spec's fit, and the plan-time decision;
 * the plan part's queries. See cudnn.h. */
#define _GNU_SOURCE
#include "cudnn_impl.h"

#include "error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const moe_cudnn_stage_names[MOE_STAGE_COUNT] = {"up", "down"};

/* ---- the tables ------------------------------------------------------------
 *
 * Which graph works from which version. One row per (stage, arch, dtype):
 * the first cuDNN version in which the mode-NONE MoE grouped matmul of that
 * stage was measured to finalize and give right results, and what was
 * measured. A version below `from`, or a combination with no row, is not
 * used: "known to work" means measured. Later versions are trusted to keep
 * working only because the self-check runs on every plan.
 *
 * Measured on an H200 (sm_90a), bf16 in and out, fp32 math:
 *   cuDNN 9.14.0  cudnnBackendCreateDescriptor of the MoE grouped matmul
 *                 operation fails (CUDNN_STATUS_NOT_SUPPORTED...): no graph.
 *   cuDNN 9.19.0  mode NONE with K-major weights ([E, K, N], strides
 *                 [K·N, 1, K]) finalizes (engine 7, runtime-compiled) and is
 *                 correct, empty experts and unaligned offsets included.
 * Never built here, whatever the version (9.19.0, issue #5's probe):
 *   row-major weights: no engine. SCATTER: no engine. GATHER: finalizes, then
 *   faults (illegal address). SwiGLU as two MoE matmuls joined by SWISH·MUL:
 *   no engine. MoE matmul -> SWISH -> MUL by a tensor, and MoE matmul -> MUL
 *   by a scalar: build, run, and give wrong results (most experts, thousands
 *   of outputs never written). cuDNN documents SwiGLU fusion on this
 *   operation only from 9.21. So the SwiGLU runs in our own kernel and
 *   ffn_bias specs stay on the generated kernels. */
typedef struct {
    int stage;
    moe_arch_t arch;
    moe_dtype_t dtype;
    int from;
    const char *measured;
} graph_row_t;

static const graph_row_t graph_table[] = {
    {MOE_STAGE_UP, MOE_ARCH_SM90A, MOE_DTYPE_BF16, 91900,
     "H200: 9.19.0 finalizes and is correct; 9.14.0 cannot create the descriptor"},
    {MOE_STAGE_DOWN, MOE_ARCH_SM90A, MOE_DTYPE_BF16, 91900,
     "H200: 9.19.0 finalizes and is correct; 9.14.0 cannot create the descriptor"},
};

/* Where cuDNN is known slower than the generated kernel (auto skips it).
 * H200, cuDNN 9.19.0, `moe_bench SPEC --cudnn both` (docs/PERF.md, "cuDNN
 * against the generated kernels", 2026-12-03): at 16384 tokens the cuDNN
 * up stage (MoE matmul + the SwiGLU kernel) ran at 241 / 88 / 315 TFLOP/s
 * for Mixtral / Qwen3-30B-A3B / a DeepSeek-V3 EP8 rank against the
 * generated 612 / 610 / 645, the down stage at 390 / 38 / 167 against 694 /
 * 570 / 608; at 128 and 4096 tokens cuDNN is 10-100x slower, since its
 * graph is built for the plan's whole row capacity. */
typedef struct {
    int stage;
    moe_arch_t arch;
    const char *measured;
} slower_row_t;

static const slower_row_t slower_table[] = {
    {MOE_STAGE_UP, MOE_ARCH_SM90A,
     "H200, cuDNN 9.19.0: 88-315 TFLOP/s (MoE matmul + SwiGLU kernel) against 610-645 for the generated wgmma "
     "up+SwiGLU at 16384 tokens, 10-100x slower at 128-4096 tokens (docs/PERF.md)"},
    {MOE_STAGE_DOWN, MOE_ARCH_SM90A,
     "H200, cuDNN 9.19.0: 38-390 TFLOP/s against 570-694 for the generated wgmma down GEMM at 16384 tokens, "
     "10-100x slower at 128-4096 tokens (docs/PERF.md)"},
};

int moe_cudnn_parse_mode(const char *s) {
    if (!s)
        return -1;
    if (strcmp(s, "auto") == 0)
        return MOE_CUDNN_AUTO;
    if (strcmp(s, "on") == 0)
        return MOE_CUDNN_ON;
    if (strcmp(s, "off") == 0)
        return MOE_CUDNN_OFF;
    return -1;
}

const char *moe_cudnn_mode_name(int mode) {
    switch (mode) {
    case MOE_CUDNN_AUTO: return "auto";
    case MOE_CUDNN_ON: return "on";
    case MOE_CUDNN_OFF: return "off";
    }
    return "?";
}

void moe_cudnn_version_string(int v, char *out, size_t n) {
    snprintf(out, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

int moe_cudnn_graph_known(int stage, moe_arch_t arch, moe_dtype_t dt, int version, char *why, size_t n) {
    char have[32];
    moe_cudnn_version_string(version, have, sizeof have);
    for (size_t i = 0; i < sizeof graph_table / sizeof *graph_table; i++) {
        const graph_row_t *r = &graph_table[i];
        if (r->stage != stage || r->arch != arch || r->dtype != dt)
            continue;
        if (version >= r->from)
            return 1;
        char from[32];
        moe_cudnn_version_string(r->from, from, sizeof from);
        snprintf(why, n, "cuDNN %s: the %s stage's MoE grouped matmul (%s, %s) is known to work from %s (%s)",
                 have, moe_cudnn_stage_names[stage], moe_dtype_name(dt), moe_arch_name(arch), from, r->measured);
        return 0;
    }
    snprintf(why, n, "cuDNN %s: the %s stage's MoE grouped matmul was never measured for %s on %s, so the "
             "version table does not list it", have, moe_cudnn_stage_names[stage], moe_dtype_name(dt),
             moe_arch_name(arch));
    return 0;
}

int moe_cudnn_known_slower(int stage, moe_arch_t arch, char *why, size_t n) {
    for (size_t i = 0; i < sizeof slower_table / sizeof *slower_table; i++)
        if (slower_table[i].stage == stage && slower_table[i].arch == arch) {
            snprintf(why, n, "%s", slower_table[i].measured);
            return 1;
        }
    return 0;
}

int moe_cudnn_spec_fits(const moe_spec_t *s, int world, int stage, char *why, size_t n) {
    (void)stage;
    if (world > 1) {
        snprintf(why, n, "a mesh of %d devices: the expert-parallel FFN runs on received rows in slot order, "
                 "which the cuDNN path does not take", world);
        return 0;
    }
    if (s->shared.ffn) {
        snprintf(why, n, "shared.ffn: the shared expert's slots are not in the cuDNN graphs (built over the routed "
                 "experts), so the generated kernels run");
        return 0;
    }
    if (s->zero_experts) {
        snprintf(why, n, "zero_experts: the zero experts' x rows sit in the down output after the routed rows, "
                 "where the cuDNN graphs (built for the capacity's rows) may write, so the generated kernels run");
        return 0;
    }
    if (moe_spec_fp8(s)) {
        snprintf(why, n, "quant.weights = \"fp8_e4m3\": the cuDNN graphs here are bf16/fp16 grouped matmuls, so the "
                 "generated fp8 kernels run");
        return 0;
    }
    if (s->ffn_bias) {
        snprintf(why, n, "ffn_bias: the cuDNN graph has no bias (a fused pointwise epilogue is not in the "
                 "version table), so the generated kernels run");
        return 0;
    }
    return 1;
}

/* ---- the plan's part ------------------------------------------------------ */

void moe_cudnn_destroy(moe_cudnn_t *c) {
    if (!c)
        return;
#if MOE_HAVE_CUDNN_H
    for (int s = 0; s < MOE_STAGE_COUNT; s++) {
        dn_stage_t *t = &c->st[s];
        if (t->exec)
            moe_dn.cudnnBackendDestroyDescriptor(t->exec);
        for (int i = t->nkeep - 1; i >= 0; i--)
            moe_dn.cudnnBackendDestroyDescriptor(t->keep[i]);
    }
    if (c->handle)
        moe_dn.cudnnDestroy(c->handle);
#endif
    if (c->mod)
        moe_cu.cuModuleUnload(c->mod);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

size_t moe_cudnn_workspace(const moe_cudnn_t *c) { return c ? c->extra : 0; }
int moe_cudnn_version(const moe_cudnn_t *c) { return c ? c->version : 0; }

int moe_cudnn_stage_path(const moe_cudnn_t *c, int stage, const char **why) {
    if (!c || stage < 0 || stage >= MOE_STAGE_COUNT) {
        if (why)
            *why = "no cuDNN decision was made (no plan part)";
        return MOE_PATH_GENERATED;
    }
    if (why)
        *why = c->st[stage].why;
    return c->st[stage].path;
}

int moe_cudnn_applies(const moe_cudnn_t *c, int stage, const moe_ffn_args_t *f) {
    if (!c || c->st[stage].path != MOE_PATH_CUDNN || !f->scratch)
        return 0;
    const void *w = stage == MOE_STAGE_UP ? f->w1p : f->w2;
    return ((uintptr_t)w % 16) == 0;
}

/* ---- the decision ----------------------------------------------------------- */

moe_status moe_cudnn_resolve_mode(const moe_options *o, int *mode, char *src, size_t n) {
    char scratch[96];
    if (!src) {
        src = scratch;
        n = sizeof scratch;
    }
    int m = o ? o->cudnn : MOE_CUDNN_DEFAULT;
    if (m == MOE_CUDNN_AUTO || m == MOE_CUDNN_ON || m == MOE_CUDNN_OFF) {
        snprintf(src, n, "moe_options.cudnn = %s", moe_cudnn_mode_name(m));
    } else if (m != MOE_CUDNN_DEFAULT) {
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_options.cudnn = %d: expected MOE_CUDNN_DEFAULT, MOE_CUDNN_AUTO, "
                        "MOE_CUDNN_ON or MOE_CUDNN_OFF", m);
    } else {
        const char *e = getenv("MOEGEN_CUDNN");
        if (!e || !*e) {
            m = MOE_CUDNN_AUTO;
            snprintf(src, n, "MOEGEN_CUDNN unset: auto");
        } else if ((m = moe_cudnn_parse_mode(e)) < 0) {
            return moe_fail(MOE_ERR_INVALID_ARG, "MOEGEN_CUDNN=%s: expected auto, on or off", e);
        } else {
            snprintf(src, n, "MOEGEN_CUDNN=%s", e);
        }
    }
    *mode = m;
    return MOE_OK;
}

/* Stage s stays on the generated kernel for `reason`; in on mode that fails
 * the plan. */
static moe_status reject(moe_cudnn_t *c, int s, int *cand, const char *reason) {
    cand[s] = 0;
    c->st[s].path = MOE_PATH_GENERATED;
    snprintf(c->st[s].why, sizeof c->st[s].why, "%s", reason);
    if (c->mode == MOE_CUDNN_ON)
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the %s stage cannot take cuDNN: %s", c->mode_src,
                        moe_cudnn_stage_names[s], reason);
    return MOE_OK;
}

static moe_status decide(moe_cudnn_t *c, int world, const moe_options *o) {
    const moe_spec_t *s = &c->pd->spec;
    moe_status rc = moe_cudnn_resolve_mode(o, &c->mode, c->mode_src, sizeof c->mode_src);
    if (rc)
        return rc;
    int cand[MOE_STAGE_COUNT] = {1, 1};
    char r[1024], r2[900];
    if (c->mode == MOE_CUDNN_OFF) {
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            snprintf(c->st[i].why, sizeof c->st[i].why, "cuDNN is off (%s): not loaded", c->mode_src);
        return MOE_OK;
    }
    int any = 0;
    for (int i = 0; i < MOE_STAGE_COUNT; i++) {
        if (!moe_cudnn_spec_fits(s, world, i, r, sizeof r) && (rc = reject(c, i, cand, r)))
            return rc;
        if (i == MOE_STAGE_UP && cand[i] && !c->l->swiglu_fn &&
            (rc = reject(c, i, cand, "the plan's module has no swiglu kernel for the activation after the cuDNN "
                         "matmul (a folder compiled before moegen emitted it: compile it again)")))
            return rc;
        any |= cand[i];
    }
    if (!any)
        return MOE_OK;
    const char *path = o && o->cudnn_path ? o->cudnn_path : getenv("MOEGEN_CUDNN_PATH");
    if (path && !*path)
        path = NULL;
    if (moe_cudnn_load(path, &c->version, r2, sizeof r2)) {
        snprintf(r, sizeof r, "cuDNN did not load: %s", r2);
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            if (cand[i] && (rc = reject(c, i, cand, r)))
                return rc;
        return MOE_OK;
    }
    char v[32];
    moe_cudnn_version_string(c->version, v, sizeof v);
    for (int i = 0; i < MOE_STAGE_COUNT; i++)
        if (cand[i] && !moe_cudnn_graph_known(i, c->arch, s->dtype, c->version, r, sizeof r) &&
            (rc = reject(c, i, cand, r)))
            return rc;
    if (c->mode == MOE_CUDNN_AUTO)
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            if (cand[i] && moe_cudnn_known_slower(i, c->arch, r2, sizeof r2)) {
                snprintf(r, sizeof r, "cuDNN %s is known slower for the %s stage on %s (auto): %s", v,
                         moe_cudnn_stage_names[i], moe_arch_name(c->arch), r2);
                reject(c, i, cand, r);
            }
    if (!cand[0] && !cand[1])
        return MOE_OK;
#if !MOE_HAVE_CUDNN_H
    return MOE_OK;
#else
    if (!moe_dn_ok(moe_dn.cudnnCreate(&c->handle), "cudnnCreate", r2, sizeof r2)) {
        c->handle = NULL;
        snprintf(r, sizeof r, "cuDNN %s: %s", v, r2);
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            if (cand[i] && (rc = reject(c, i, cand, r)))
                return rc;
        return MOE_OK;
    }
    if ((rc = moe_cudnn_load_kernels(c)))
        return rc;
    for (int i = 0; i < MOE_STAGE_COUNT; i++)
        if (cand[i] && !moe_dn_build(c, i, r2, sizeof r2)) {
            snprintf(r, sizeof r, "cuDNN %s built no execution plan for the %s stage's MoE grouped matmul: %s", v,
                     moe_cudnn_stage_names[i], r2);
            if ((rc = reject(c, i, cand, r)))
                return rc;
        }
    if (!cand[0] && !cand[1])
        return MOE_OK;
    int ok[MOE_STAGE_COUNT] = {0, 0};
    char res[MOE_STAGE_COUNT][1024] = {"", ""};
    if ((rc = moe_cudnn_self_check(c, cand, ok, res))) {
        if (rc == MOE_ERR_CUDA) /* a fault may have broken the context: never fall back silently on that */
            return rc;
        snprintf(r, sizeof r, "cuDNN %s: %s", v, moe_last_error());
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            if (cand[i] && (rc = reject(c, i, cand, r)))
                return rc;
        return MOE_OK;
    }
    for (int i = 0; i < MOE_STAGE_COUNT; i++) {
        if (!cand[i])
            continue;
        if (!ok[i]) {
            snprintf(r, sizeof r, "cuDNN %s, engine %lld: %s", v, c->st[i].engine, res[i]);
            if ((rc = reject(c, i, cand, r)))
                return rc;
            continue;
        }
        c->st[i].path = MOE_PATH_CUDNN;
        snprintf(c->st[i].why, sizeof c->st[i].why, "cuDNN %s (%s), engine %lld, %s; %s", v, c->mode_src,
                 c->st[i].engine, res[i],
                 i == MOE_STAGE_UP ? "the SwiGLU runs in a separate kernel" : "computes all rows of the buffer");
    }
    /* the extra workspace: u (up stage) and cuDNN's own */
    size_t off = 0;
    if (c->st[MOE_STAGE_UP].path == MOE_PATH_CUDNN) {
        c->u_off = off;
        off += up256((size_t)c->M * 2 * (size_t)s->ffn * 2);
    }
    size_t cws = 0;
    for (int i = 0; i < MOE_STAGE_COUNT; i++)
        if (c->st[i].path == MOE_PATH_CUDNN && c->st[i].ws > cws)
            cws = c->st[i].ws;
    c->cws_off = off;
    off += up256(cws);
    c->extra = c->st[0].path == MOE_PATH_CUDNN || c->st[1].path == MOE_PATH_CUDNN ? off : 0;
    return MOE_OK;
#endif
}

moe_cudnn_t *moe_cudnn_new(const moe_plan_desc_t *pd, moe_arch_t arch, const moe_launcher_t *l) {
    moe_cudnn_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->pd = pd;
    c->arch = arch;
    c->l = l;
    c->M = c->pd->max_rows;
    return c;
}

moe_status moe_cudnn_setup(moe_cudnn_t **out, const moe_launcher_t *l, int world, const moe_options *o) {
    *out = NULL;
    moe_cudnn_t *c = moe_cudnn_new(l->pd, l->arch, l);
    if (!c)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status rc = decide(c, world, o);
    if (rc) {
        moe_cudnn_destroy(c);
        return rc;
    }
    *out = c;
    return MOE_OK;
}
