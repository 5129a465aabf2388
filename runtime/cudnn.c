/* cudnn.c — the optional cuDNN path of the FFN stages: dlopen, the version
 * and speed tables, the MoE grouped matmul graphs, the plan-time self-check
 * and the per-call execution. See cudnn.h. */
#define _GNU_SOURCE
#include "cudnn.h"

#include "compile.h"
#include "emit.h"
#include "plan.h"
#include "ref.h"
#include "util.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__has_include) && !defined(MOE_NO_CUDNN_HEADERS)
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define MOE_HAVE_CUDNN_H 1
#endif
#endif
#ifndef MOE_HAVE_CUDNN_H
#define MOE_HAVE_CUDNN_H 0
#endif

static const char *const stage_names[MOE_STAGE_COUNT] = {"up", "down"};

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
                 have, stage_names[stage], moe_dtype_name(dt), moe_arch_name(arch), from, r->measured);
        return 0;
    }
    snprintf(why, n, "cuDNN %s: the %s stage's MoE grouped matmul was never measured for %s on %s, so the "
             "version table does not list it", have, stage_names[stage], moe_dtype_name(dt), moe_arch_name(arch));
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
    if (s->ffn_bias) {
        snprintf(why, n, "ffn_bias: the cuDNN graph has no bias (a fused pointwise epilogue is not in the "
                 "version table), so the generated kernels run");
        return 0;
    }
    return 1;
}

/* ---- loading ------------------------------------------------------------- */

#if MOE_HAVE_CUDNN_H
#define MOE_DN_FUNCTIONS(X)                 \
    X(cudnnGetVersion)                      \
    X(cudnnGetErrorString)                  \
    X(cudnnGetLastErrorString)              \
    X(cudnnCreate)                          \
    X(cudnnDestroy)                         \
    X(cudnnSetStream)                       \
    X(cudnnBackendCreateDescriptor)         \
    X(cudnnBackendDestroyDescriptor)        \
    X(cudnnBackendSetAttribute)             \
    X(cudnnBackendGetAttribute)             \
    X(cudnnBackendFinalize)                 \
    X(cudnnBackendExecute)

static struct {
#define MOE_DN_FIELD(fn) __typeof__(fn) *fn;
    MOE_DN_FUNCTIONS(MOE_DN_FIELD)
#undef MOE_DN_FIELD
} dn;
#endif

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded_version;
static char loaded_key[1024];   /* the path asked for ("" = the default search) */
static char loaded_from[1200];  /* what was loaded, for messages */

static const char *const engine_libs[] = {"libcudnn_heuristic.so.9", "libcudnn_engines_runtime_compiled.so.9",
                                          "libcudnn_engines_precompiled.so.9"};

int moe_cudnn_load(const char *path, int *version, char *why, size_t n) {
#if !MOE_HAVE_CUDNN_H
    (void)path;
    *version = 0;
    snprintf(why, n, "libmoegen was built without <cudnn_graph.h>, so it has no cuDNN path");
    return -1;
#else
    const char *key = path ? path : "";
    pthread_mutex_lock(&load_lock);
    if (loaded_version) {
        int same = strcmp(key, loaded_key) == 0;
        if (!same)
            snprintf(why, n, "this process already loaded %s (asked for %s); a process holds one cuDNN",
                     loaded_from, path ? path : "the default search");
        *version = same ? loaded_version : 0;
        pthread_mutex_unlock(&load_lock);
        return same ? 0 : -1;
    }
    void *h = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_NOLOAD);
    char from[1200];
    if (h) {
        snprintf(from, sizeof from, "the cuDNN this process had already loaded");
    } else if (path) {
        struct stat sb;
        char dir[1024];
        if (stat(path, &sb) != 0) {
            snprintf(why, n, "cuDNN path %s: no such file or folder", path);
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        snprintf(dir, sizeof dir, "%s", path);
        if (!S_ISDIR(sb.st_mode)) {
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = '\0';
            else
                snprintf(dir, sizeof dir, ".");
        }
        char lib[1200];
        snprintf(lib, sizeof lib, "%s/libcudnn_graph.so.9", dir);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(why, n, "dlopen(%s): %s", lib, dlerror());
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        /* the engines by full path too: later loads by soname then find these */
        for (size_t i = 0; i < sizeof engine_libs / sizeof *engine_libs; i++) {
            char e[1200];
            snprintf(e, sizeof e, "%s/%s", dir, engine_libs[i]);
            if (stat(e, &sb) == 0)
                dlopen(e, RTLD_NOW | RTLD_LOCAL);
        }
        snprintf(from, sizeof from, "%s", lib);
    } else {
        h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            snprintf(why, n, "dlopen(libcudnn.so.9): %s (set MOEGEN_CUDNN_PATH or moe_options.cudnn_path to "
                     "cuDNN's lib folder)", dlerror());
            pthread_mutex_unlock(&load_lock);
            return -1;
        }
        snprintf(from, sizeof from, "libcudnn.so.9 (the default search)");
    }
    why[0] = '\0';
#define MOE_DN_RESOLVE(fn)                                                                     \
    if (!why[0] && !(*(void **)&dn.fn = dlsym(h, #fn)))                                        \
        snprintf(why, n, "%s has no symbol %s (cuDNN 9 is needed)", from, #fn);
    MOE_DN_FUNCTIONS(MOE_DN_RESOLVE)
#undef MOE_DN_RESOLVE
    if (why[0]) {
        memset(&dn, 0, sizeof dn);
        pthread_mutex_unlock(&load_lock);
        return -1;
    }
    loaded_version = (int)dn.cudnnGetVersion();
    snprintf(loaded_key, sizeof loaded_key, "%s", key);
    char v[32];
    moe_cudnn_version_string(loaded_version, v, sizeof v);
    snprintf(loaded_from, sizeof loaded_from, "cuDNN %s from %s", v, from);
    *version = loaded_version;
    pthread_mutex_unlock(&load_lock);
    return 0;
#endif
}

/* ---- the plan's part ------------------------------------------------------ */

#define MOE_DN_KEEP 48

typedef struct {
    int path;
    char why[1024];
    long long engine;
    size_t ws;
#if MOE_HAVE_CUDNN_H
    cudnnBackendDescriptor_t exec;
    cudnnBackendDescriptor_t keep[MOE_DN_KEEP];
    int nkeep;
#endif
} dn_stage_t;

struct moe_cudnn {
    int mode, version;
    char mode_src[96];
    const moe_plan_desc_t *pd;
    moe_arch_t arch;
    long long M;
    dn_stage_t st[MOE_STAGE_COUNT];
#if MOE_HAVE_CUDNN_H
    cudnnHandle_t handle;
#endif
    pthread_mutex_t lock;       /* the handle's stream is per call */
    CUmodule mod;
    CUfunction swiglu, fill;
    size_t u_off, cws_off, extra;
};

void moe_cudnn_destroy(moe_cudnn_t *c) {
    if (!c)
        return;
#if MOE_HAVE_CUDNN_H
    for (int s = 0; s < MOE_STAGE_COUNT; s++) {
        dn_stage_t *t = &c->st[s];
        if (t->exec)
            dn.cudnnBackendDestroyDescriptor(t->exec);
        for (int i = t->nkeep - 1; i >= 0; i--)
            dn.cudnnBackendDestroyDescriptor(t->keep[i]);
    }
    if (c->handle)
        dn.cudnnDestroy(c->handle);
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

#if MOE_HAVE_CUDNN_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* cuDNN's failure of `what` as a sentence in why; returns 0 on failure. */
static int dn_ok(cudnnStatus_t s, const char *what, char *why, size_t n) {
    if (s == CUDNN_STATUS_SUCCESS)
        return 1;
    char last[512] = "";
    dn.cudnnGetLastErrorString(last, sizeof last);
    snprintf(why, n, "%s: %s%s%s", what, dn.cudnnGetErrorString(s), last[0] ? " (" : "", last[0] ? last : "");
    if (last[0])
        strncat(why, ")", n - strlen(why) - 1);
    return 0;
}

static int keep(dn_stage_t *t, cudnnBackendDescriptor_t d) {
    if (t->nkeep >= MOE_DN_KEEP)
        return 0;
    t->keep[t->nkeep++] = d;
    return 1;
}

/* A descriptor of type ty kept by t; NULL on failure (why set). */
static cudnnBackendDescriptor_t dn_create(dn_stage_t *t, cudnnBackendDescriptorType_t ty, const char *what,
                                          char *why, size_t n) {
    cudnnBackendDescriptor_t d = NULL;
    if (!dn_ok(dn.cudnnBackendCreateDescriptor(ty, &d), what, why, n))
        return NULL;
    if (!keep(t, d)) {
        dn.cudnnBackendDestroyDescriptor(d);
        snprintf(why, n, "%s: too many descriptors", what);
        return NULL;
    }
    return d;
}

#define DN_SET(d, attr, type, count, ptr, what)                                                 \
    dn_ok(dn.cudnnBackendSetAttribute((d), (attr), (type), (count), (ptr)), (what), why, n)

static cudnnBackendDescriptor_t dn_tensor(dn_stage_t *t, int64_t uid, cudnnDataType_t dt, const int64_t dims[3],
                                          const int64_t strides[3], char *why, size_t n) {
    cudnnBackendDescriptor_t d = dn_create(t, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor", why, n);
    int64_t align = 16;
    if (!d || !DN_SET(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 3, dims, "tensor dimensions") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, strides, "tensor strides") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment") ||
        !dn_ok(dn.cudnnBackendFinalize(d), "finalizing a tensor", why, n))
        return NULL;
    return d;
}

/* Finalize an execution plan for engine config cfg; 1 on success. */
static int dn_try_plan(moe_cudnn_t *c, dn_stage_t *t, cudnnBackendDescriptor_t cfg, char *why, size_t n) {
    cudnnBackendDescriptor_t p = NULL;
    if (!dn_ok(dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p), "execution plan", why,
               n))
        return 0;
    if (!DN_SET(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->handle, "plan handle") ||
        !DN_SET(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg, "plan config") ||
        !dn_ok(dn.cudnnBackendFinalize(p), "finalizing the execution plan", why, n)) {
        dn.cudnnBackendDestroyDescriptor(p);
        return 0;
    }
    int64_t ws = 0, cnt = 0, idx = -1;
    dn.cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
    cudnnBackendDescriptor_t eng = NULL;
    if (dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
        if (dn.cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt,
                                        &eng) == CUDNN_STATUS_SUCCESS)
            dn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
        dn.cudnnBackendDestroyDescriptor(eng);
    }
    t->exec = p;
    t->ws = (size_t)(ws > 0 ? ws : 0);
    t->engine = idx;
    return 1;
}

/* Build and finalize the mode-NONE MoE grouped matmul of stage for the
 * plan's shape (M rows): heuristics first, then every engine by index.
 * Returns 1, or 0 with the last cuDNN error in why. */
static int dn_build(moe_cudnn_t *c, int stage, char *why, size_t n) {
    const moe_spec_t *s = &c->pd->spec;
    dn_stage_t *t = &c->st[stage];
    const int64_t M = c->M, E = s->experts;
    const int64_t K = stage == MOE_STAGE_UP ? s->hidden : s->ffn;
    const int64_t N = stage == MOE_STAGE_UP ? 2LL * s->ffn : s->hidden;
    cudnnDataType_t dt = s->dtype == MOE_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const int64_t tdims[3] = {1, M, K}, tstr[3] = {M * K, K, 1};
    const int64_t wdims[3] = {E, K, N}, wstr[3] = {K * N, 1, K};
    const int64_t odims[3] = {E, 1, 1}, ostr[3] = {1, 1, 1};
    const int64_t ydims[3] = {1, M, N}, ystr[3] = {M * N, N, 1};
    cudnnBackendDescriptor_t tok = dn_tensor(t, 1, dt, tdims, tstr, why, n);
    cudnnBackendDescriptor_t w = tok ? dn_tensor(t, 2, dt, wdims, wstr, why, n) : NULL;
    cudnnBackendDescriptor_t off = w ? dn_tensor(t, 3, CUDNN_DATA_INT32, odims, ostr, why, n) : NULL;
    cudnnBackendDescriptor_t y = off ? dn_tensor(t, 4, dt, ydims, ystr, why, n) : NULL;
    if (!y)
        return 0;
    cudnnBackendDescriptor_t op =
        dn_create(t, CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR, "creating the MoE grouped matmul "
                  "operation", why, n);
    cudnnMoeGroupedMatmulMode_t mode = CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    if (!op ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, 1, &mode,
                "MoE matmul mode") ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec,
                "MoE matmul math precision") ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tok,
                "MoE matmul tokens") ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w,
                "MoE matmul weights") ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                1, &off, "MoE matmul first_token_offset") ||
        !DN_SET(op, CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
                "MoE matmul output") ||
        !dn_ok(dn.cudnnBackendFinalize(op), "finalizing the MoE grouped matmul operation", why, n))
        return 0;
    cudnnBackendDescriptor_t g = dn_create(t, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph", why, n);
    if (!g || !DN_SET(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->handle, "graph handle") ||
        !DN_SET(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op, "graph operations") ||
        !dn_ok(dn.cudnnBackendFinalize(g), "finalizing the operation graph", why, n))
        return 0;
    /* heuristics */
    char last[1024] = "";
    cudnnBackendDescriptor_t heur = dn_create(t, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics", why, n);
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    int64_t count = 0;
    if (heur && DN_SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g,
                       "heuristics graph") &&
        DN_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm, "heuristics mode") &&
        dn_ok(dn.cudnnBackendFinalize(heur), "engine heuristics", why, n) &&
        dn_ok(dn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, NULL), "heuristics results", why, n)) {
        enum { MAXCFG = 8 };
        cudnnBackendDescriptor_t cfg[MAXCFG];
        int64_t want = count < MAXCFG ? count : MAXCFG, got = 0;
        int made = 0;
        for (; made < want; made++)
            if (dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) !=
                CUDNN_STATUS_SUCCESS)
                break;
        int used = -1;
        if (made > 0 && dn_ok(dn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got, cfg),
                              "heuristics results", why, n)) {
            for (int64_t i = 0; i < got && used < 0; i++) {
                if (dn_try_plan(c, t, cfg[i], why, n))
                    used = (int)i;
                else
                    snprintf(last, sizeof last, "%s", why);
            }
        }
        for (int i = 0; i < made; i++)
            if (i != used || !keep(t, cfg[i]))
                dn.cudnnBackendDestroyDescriptor(cfg[i]);
        if (t->exec)
            return 1;
        if (!last[0])
            snprintf(last, sizeof last, "the heuristics offered %lld engine configurations", (long long)count);
    } else {
        snprintf(last, sizeof last, "%s", why);
    }
    /* every engine by global index */
    int64_t engines = 0, cnt = 0;
    dn.cudnnBackendGetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &cnt,
                                &engines);
    for (int64_t i = 0; i < engines && !t->exec; i++) {
        cudnnBackendDescriptor_t e = NULL, cf = NULL;
        if (dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e) != CUDNN_STATUS_SUCCESS)
            break;
        int ok = dn.cudnnBackendSetAttribute(e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &g) == CUDNN_STATUS_SUCCESS &&
                 dn.cudnnBackendSetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &i) ==
                     CUDNN_STATUS_SUCCESS &&
                 dn.cudnnBackendFinalize(e) == CUDNN_STATUS_SUCCESS &&
                 dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cf) == CUDNN_STATUS_SUCCESS &&
                 dn.cudnnBackendSetAttribute(cf, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e) ==
                     CUDNN_STATUS_SUCCESS &&
                 dn.cudnnBackendFinalize(cf) == CUDNN_STATUS_SUCCESS;
        if (ok && dn_try_plan(c, t, cf, why, n) && keep(t, e) && keep(t, cf))
            break;
        if (cf)
            dn.cudnnBackendDestroyDescriptor(cf);
        dn.cudnnBackendDestroyDescriptor(e);
    }
    if (t->exec)
        return 1;
    snprintf(why, n, "no engine finalized (heuristics: %s; %lld engines tried by index)", last,
             (long long)engines);
    return 0;
}

/* Enqueue stage's execution plan on st with these pointers. */
static moe_status dn_exec(const moe_cudnn_t *c, int stage, CUdeviceptr tok, const void *w, CUdeviceptr off,
                          CUdeviceptr y, CUdeviceptr ws, CUstream st) {
    char why[768];
    const size_t n = sizeof why;
    int64_t uids[4] = {1, 2, 3, 4};
    void *ptrs[4] = {(void *)(uintptr_t)tok, (void *)w, (void *)(uintptr_t)off, (void *)(uintptr_t)y};
    void *wsp = (void *)(uintptr_t)ws;
    cudnnBackendDescriptor_t vp = NULL;
    if (!dn_ok(dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), "variant pack", why, n))
        return moe_fail(MOE_ERR_CUDA, "cuDNN %s stage: %s", stage_names[stage], why);
    int ok = DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4, uids, "variant pack ids") &&
             DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 4, ptrs, "variant pack data") &&
             DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp, "variant pack workspace") &&
             dn_ok(dn.cudnnBackendFinalize(vp), "finalizing the variant pack", why, n);
    if (ok) {
        pthread_mutex_lock((pthread_mutex_t *)&c->lock);
        ok = dn_ok(dn.cudnnSetStream(c->handle, (cudaStream_t)st), "cudnnSetStream", why, n) &&
             dn_ok(dn.cudnnBackendExecute(c->handle, c->st[stage].exec, vp), "cudnnBackendExecute", why, n);
        pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    }
    dn.cudnnBackendDestroyDescriptor(vp);
    return ok ? MOE_OK : moe_fail(MOE_ERR_CUDA, "cuDNN %s stage: %s", stage_names[stage], why);
}

#pragma GCC diagnostic pop

#endif /* MOE_HAVE_CUDNN_H */

/* ---- the SwiGLU and fill kernels (NVRTC) ---------------------------------- */

static const char swiglu_body[] =
    "typedef unsigned short u16;\n"
    "static __device__ __forceinline__ float h2f(u16 x) {\n"
    "#if MOE_BF16\n"
    "    return __uint_as_float((unsigned)x << 16);\n"
    "#else\n"
    "    float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(x)); return f;\n"
    "#endif\n"
    "}\n"
    "static __device__ __forceinline__ u16 f2h(float f) {\n"
    "    u16 r;\n"
    "#if MOE_BF16\n"
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(f));\n"
    "#else\n"
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(f));\n"
    "#endif\n"
    "    return r;\n"
    "}\n"
    "static __device__ __forceinline__ float act(float gate, float up) {\n"
    "#if MOE_HAS_LIMIT\n"
    "    gate = fminf(gate, MOE_LIMIT);\n"
    "    up = fminf(fmaxf(up, -MOE_LIMIT), MOE_LIMIT);\n"
    "#endif\n"
    "    return (up + MOE_UP_OFFSET) * gate * (1.0f / (1.0f + __expf(-(MOE_ALPHA * gate))));\n"
    "}\n"
    "/* h [rows, F] = SwiGLU of u [rows, 2F] (gate/up granules of 8 paired), rows = min(offsets[E], cap). */\n"
    "extern \"C\" __global__ void moe_cudnn_swiglu(const uint4 *__restrict__ u, uint4 *__restrict__ h,\n"
    "                                             const int *__restrict__ offsets, long long cap) {\n"
    "    long long rows = offsets[MOE_E];\n"
    "    rows = rows < cap ? rows : cap;\n"
    "    const long long total = rows * MOE_G;\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;\n"
    "         i += (long long)gridDim.x * blockDim.x) {\n"
    "        const long long r = i / MOE_G;\n"
    "        const long long j = i - r * MOE_G;\n"
    "        const uint4 g4 = u[r * 2 * MOE_G + 2 * j], u4 = u[r * 2 * MOE_G + 2 * j + 1];\n"
    "        const u16 *gp = (const u16 *)&g4, *upp = (const u16 *)&u4;\n"
    "        uint4 o4;\n"
    "        u16 *op = (u16 *)&o4;\n"
    "#pragma unroll\n"
    "        for (int k = 0; k < 8; k++) op[k] = f2h(act(h2f(gp[k]), h2f(upp[k])));\n"
    "        h[i] = o4;\n"
    "    }\n"
    "}\n"
    "/* p[i] = uniform(-scale, scale) from a hash of (i, seed). */\n"
    "extern \"C\" __global__ void moe_cudnn_fill(u16 *p, unsigned long long n, unsigned long long seed,\n"
    "                                           float scale) {\n"
    "    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n"
    "         i += (unsigned long long)gridDim.x * blockDim.x) {\n"
    "        unsigned long long z = (i ^ (seed << 40)) + seed * 0x9e3779b97f4a7c15ull;\n"
    "        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;\n"
    "        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;\n"
    "        z ^= z >> 31;\n"
    "        p[i] = f2h(((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);\n"
    "    }\n"
    "}\n";

static moe_status load_kernels(moe_cudnn_t *c) {
    const moe_spec_t *s = &c->pd->spec;
    moe_buf_t src = {0};
    moe_buf_printf(&src,
                   "/* moegen %s: the cuDNN path's SwiGLU (spec %s) */\n#define MOE_E %d\n#define MOE_G %d\n"
                   "#define MOE_BF16 %d\n#define MOE_ALPHA ((float)(%.17g))\n#define MOE_HAS_LIMIT %d\n"
                   "#define MOE_LIMIT ((float)(%.17g))\n#define MOE_UP_OFFSET ((float)(%.17g))\n",
                   MOEGEN_VERSION, s->hash, s->experts, s->ffn / 8, s->dtype == MOE_DTYPE_BF16,
                   s->activation.alpha, s->activation.limit > 0, s->activation.limit, s->activation.up_offset);
    moe_buf_append(&src, swiglu_body, sizeof swiglu_body - 1);
    if (src.failed) {
        moe_buf_free(&src);
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    }
    moe_buf_t cubin = {0};
    moe_diag_t d;
    int rc = moe_nvrtc_compile(src.data, "cudnn_swiglu.cu", c->arch, &cubin, NULL, NULL, &d);
    moe_buf_free(&src);
    if (rc)
        return moe_fail(MOE_ERR_COMPILE, "%s", d.msg);
    CUresult r = moe_cu.cuModuleLoadData(&c->mod, cubin.data);
    moe_buf_free(&cubin);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuModuleGetFunction(&c->swiglu, c->mod, "moe_cudnn_swiglu");
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuModuleGetFunction(&c->fill, c->mod, "moe_cudnn_fill");
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "loading the cuDNN path's SwiGLU kernel: %s", moe_cu_error_string(r));
    return MOE_OK;
}

static moe_status launch_swiglu(const moe_cudnn_t *c, CUdeviceptr u, CUdeviceptr h, CUdeviceptr offsets,
                                long long cap, CUstream st) {
    long long total = cap * (c->pd->spec.ffn / 8);
    long long blocks = (total + 255) / 256;
    if (blocks > 132 * 32)
        blocks = 132 * 32;
    if (blocks < 1)
        blocks = 1;
    void *args[] = {&u, &h, &offsets, &cap};
    CUresult r = moe_cu.cuLaunchKernel(c->swiglu, (unsigned)blocks, 1, 1, 256, 1, 1, 0, st, args, NULL);
    return r == CUDA_SUCCESS ? MOE_OK
                             : moe_fail(MOE_ERR_CUDA, "launching the cuDNN path's SwiGLU: %s", moe_cu_error_string(r));
}

static int fill(const moe_cudnn_t *c, CUdeviceptr p, unsigned long long n, unsigned long long seed, float scale) {
    void *args[] = {&p, &n, &seed, &scale};
    return moe_cu.cuLaunchKernel(c->fill, 132 * 16, 1, 1, 256, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS;
}

moe_status moe_cudnn_run(const moe_cudnn_t *c, int stage, const moe_ffn_args_t *f, CUstream st) {
#if !MOE_HAVE_CUDNN_H
    (void)c; (void)stage; (void)f; (void)st;
    return moe_fail(MOE_ERR_UNSUPPORTED, "no cuDNN path in this build");
#else
    CUdeviceptr ws = f->scratch + c->cws_off;
    if (stage == MOE_STAGE_DOWN)
        return dn_exec(c, stage, f->hbuf, f->w2, f->offsets, f->out, ws, st);
    CUdeviceptr u = f->scratch + c->u_off;
    moe_status rc = dn_exec(c, stage, f->xs, f->w1p, f->offsets, u, ws, st);
    if (rc)
        return rc;
    return launch_swiglu(c, u, f->hbuf, f->offsets, moe_plan_max_rows(c->pd, f->tokens), st);
#endif
}

/* ---- the self-check ------------------------------------------------------- */

#if MOE_HAVE_CUDNN_H

static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The self-check's rows: a few experts get rows (one crossing an M tile,
 * one a single row), the rest none — an empty expert between non-empty
 * ones and runs of empty ones, so offsets repeat; the padded total fits M. */
static int check_layout(const moe_cudnn_t *c, int *counts, int *offsets) {
    const int E = c->pd->spec.experts, A = c->pd->align;
    const int want[5][2] = {{0, A + 3}, {2, 1}, {E / 2, 17}, {E - 1, 5}, {E / 3, 2 * A - 1}};
    memset(counts, 0, sizeof(int) * (size_t)E);
    for (int i = 0; i < 5; i++)
        if (want[i][0] != 1 && want[i][0] < E && !counts[want[i][0]])
            counts[want[i][0]] = want[i][1];
    for (;;) {
        long long total = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = (int)total;
            total += (counts[e] + A - 1) / A * A;
        }
        offsets[E] = (int)total;
        if (total <= c->M)
            break;
        int big = 0; /* shrink the largest until it fits */
        for (int e = 1; e < E; e++)
            if (counts[e] > counts[big])
                big = e;
        if (counts[big] <= 1)
            return 0;
        counts[big] /= 2;
    }
    int rows = 0;
    for (int e = 0; e < E; e++)
        rows += counts[e];
    return rows;
}

/* Normalized L2 of a vs b over the routed rows, width W; NaN when any
 * value is not finite (poison left, or a wrong result). */
static double compare_rows(const moe_cudnn_t *c, CUdeviceptr a, CUdeviceptr b, long long W, const int *counts,
                           const int *offsets, double *maxabs) {
    const moe_spec_t *s = &c->pd->spec;
    double num = 0, den = 0;
    *maxabs = 0;
    int bad = 0;
    for (int e = 0; e < s->experts && !bad; e++) {
        if (!counts[e])
            continue;
        size_t n = (size_t)counts[e] * (size_t)W;
        uint16_t *ha = malloc(n * 2), *hb = malloc(n * 2);
        size_t off = (size_t)offsets[e] * (size_t)W * 2;
        if (!ha || !hb || moe_cu.cuMemcpyDtoH(ha, a + off, n * 2) != CUDA_SUCCESS ||
            moe_cu.cuMemcpyDtoH(hb, b + off, n * 2) != CUDA_SUCCESS) {
            bad = 1;
        } else {
            for (size_t i = 0; i < n; i++) {
                float x = moe_half_to_float(ha[i], s->dtype), y = moe_half_to_float(hb[i], s->dtype);
                if (!isfinite(x) || !isfinite(y)) {
                    bad = 1;
                    break;
                }
                num += (double)(x - y) * (x - y);
                den += (double)y * y;
                if (fabs(x - y) > *maxabs)
                    *maxabs = fabs(x - y);
            }
        }
        free(ha);
        free(hb);
    }
    if (bad)
        return NAN;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Run both candidate stages through cuDNN and the generated kernels on one
 * ragged case; ok[s] = 1 when stage s agrees, with the figures in why[s]. */
static moe_status self_check(moe_cudnn_t *c, const moe_plan *plan, const int cand[MOE_STAGE_COUNT],
                             int ok[MOE_STAGE_COUNT], char why[MOE_STAGE_COUNT][1024]) {
    const moe_spec_t *s = &c->pd->spec;
    const long long E = s->experts, H = s->hidden, F = s->ffn, M = c->M;
    const double tol = s->dtype == MOE_DTYPE_BF16 ? MOE_CUDNN_CHECK_TOL_BF16 : MOE_CUDNN_CHECK_TOL_FP16;
    int *counts = calloc((size_t)E, sizeof(int)), *offsets = calloc((size_t)E + 1, sizeof(int));
    int *tiles = calloc((size_t)(M / c->pd->align + E + 1) * 4, sizeof(int));
    moe_status rc = MOE_OK;
    enum { XS, W, U, HC, HG, OC, OG, OFF, TILES, NT, CWS, NBUF };
    CUdeviceptr b[NBUF] = {0};
    if (!counts || !offsets || !tiles) {
        rc = moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    int rows = check_layout(c, counts, offsets);
    if (rows == 0) {
        rc = moe_fail(MOE_ERR_UNSUPPORTED, "the cuDNN self-check found no ragged case that fits %lld rows", M);
        goto done;
    }
    int ntiles = 0, empty = 0, A = c->pd->align;
    for (int e = 0; e < E; e++) {
        empty += counts[e] == 0;
        for (int r = 0; r < counts[e]; r += A, ntiles++) {
            tiles[4 * ntiles] = e;
            tiles[4 * ntiles + 1] = offsets[e] + r;
            tiles[4 * ntiles + 2] = counts[e] - r < A ? counts[e] - r : A;
            tiles[4 * ntiles + 3] = 0;
        }
    }
    size_t cws = c->st[0].ws > c->st[1].ws ? c->st[0].ws : c->st[1].ws;
    const int up = cand[MOE_STAGE_UP], down = cand[MOE_STAGE_DOWN];
    const size_t bytes[NBUF] = {(size_t)(M * H * 2), (size_t)(E * 2 * F * H * 2), up ? (size_t)(M * 2 * F * 2) : 16,
                                up ? (size_t)(M * F * 2) : 16, (size_t)(M * F * 2), down ? (size_t)(M * H * 2) : 16,
                                down ? (size_t)(M * H * 2) : 16,
                                (size_t)(E + 1) * 4, (size_t)ntiles * 16 + 16, 4, cws ? cws : 16};
    size_t total = 0;
    for (int i = 0; i < NBUF; i++) {
        total += up256(bytes[i]);
        CUresult r = moe_cu.cuMemAlloc(&b[i], bytes[i]);
        if (r != CUDA_SUCCESS) {
            rc = moe_fail(MOE_ERR_NO_MEMORY, "the cuDNN self-check could not allocate %zu bytes of device memory "
                          "(%zu in all: a weight set and the stage buffers at %lld rows): %s", bytes[i], total, M,
                          moe_cu_error_string(r));
            goto done;
        }
    }
    CUresult r = moe_cu.cuMemcpyHtoD(b[OFF], offsets, bytes[OFF]);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyHtoD(b[TILES], tiles, (size_t)ntiles * 16 + 16);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyHtoD(b[NT], &ntiles, 4);
    if (r != CUDA_SUCCESS || !fill(c, b[XS], (unsigned long long)(M * H), 1, 1.0f) ||
        !fill(c, b[W], (unsigned long long)(E * 2 * F * H), 2, 2.0f / sqrtf((float)H))) {
        rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check's inputs: %s", moe_cu_error_string(r));
        goto done;
    }
    /* up: the generated kernel, and cuDNN + SwiGLU into poisoned buffers */
    {
        CUdeviceptr nul = 0;
        void *args[] = {&b[XS], &b[W], &nul, &b[TILES], &b[NT], &b[HG]};
        if ((rc = moe_launch_family(plan, MOE_K_GEMM_UP, s->tokens, NULL, args)))
            goto done;
    }
    if (cand[MOE_STAGE_UP]) {
        moe_cu.cuMemsetD8(b[U], 0xff, bytes[U]);
        moe_cu.cuMemsetD8(b[HC], 0xff, bytes[HC]);
        if ((rc = dn_exec(c, MOE_STAGE_UP, b[XS], (void *)(uintptr_t)b[W], b[OFF], b[U], b[CWS], NULL)) ||
            (rc = launch_swiglu(c, b[U], b[HC], b[OFF], M, NULL)))
            goto done;
    }
    if ((r = moe_cu.cuCtxSynchronize()) != CUDA_SUCCESS) {
        rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check (up stage) faulted: %s", moe_cu_error_string(r));
        goto done;
    }
    double err, maxabs;
    if (cand[MOE_STAGE_UP]) {
        err = compare_rows(c, b[HC], b[HG], F, counts, offsets, &maxabs);
        ok[MOE_STAGE_UP] = err <= tol;
        snprintf(why[MOE_STAGE_UP], 1024, "self-check %s: error %.2e (max abs %.3g) %s %.0e on %d routed rows, "
                 "%d of %lld experts empty", ok[MOE_STAGE_UP] ? "passed" : "FAILED", err, maxabs,
                 ok[MOE_STAGE_UP] ? "<=" : "not <=", tol, rows, empty, E);
    }
    if (cand[MOE_STAGE_DOWN]) {
        /* down: both from the generated up output, weights refilled as [E, H, F] */
        CUdeviceptr nul = 0;
        void *args[] = {&b[HG], &b[W], &nul, &b[TILES], &b[NT], &b[OG]};
        moe_cu.cuMemsetD8(b[OC], 0xff, bytes[OC]);
        if (!fill(c, b[W], (unsigned long long)(E * H * F), 3, 2.0f / sqrtf((float)F))) {
            rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check's down weights");
            goto done;
        }
        if ((rc = moe_launch_family(plan, MOE_K_GEMM_DOWN, s->tokens, NULL, args)) ||
            (rc = dn_exec(c, MOE_STAGE_DOWN, b[HG], (void *)(uintptr_t)b[W], b[OFF], b[OC], b[CWS], NULL)))
            goto done;
        if ((r = moe_cu.cuCtxSynchronize()) != CUDA_SUCCESS) {
            rc = moe_fail(MOE_ERR_CUDA, "the cuDNN self-check (down stage) faulted: %s", moe_cu_error_string(r));
            goto done;
        }
        err = compare_rows(c, b[OC], b[OG], H, counts, offsets, &maxabs);
        ok[MOE_STAGE_DOWN] = err <= tol;
        snprintf(why[MOE_STAGE_DOWN], 1024, "self-check %s: error %.2e (max abs %.3g) %s %.0e on %d routed rows, "
                 "%d of %lld experts empty", ok[MOE_STAGE_DOWN] ? "passed" : "FAILED", err, maxabs,
                 ok[MOE_STAGE_DOWN] ? "<=" : "not <=", tol, rows, empty, E);
    }
done:
    for (int i = 0; i < NBUF; i++)
        if (b[i])
            moe_cu.cuMemFree(b[i]);
    free(counts);
    free(offsets);
    free(tiles);
    return rc;
}

#endif /* MOE_HAVE_CUDNN_H */

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
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the %s stage cannot take cuDNN: %s", c->mode_src, stage_names[s],
                        reason);
    return MOE_OK;
}

static moe_status decide(moe_cudnn_t *c, const moe_plan *plan, int world, const moe_options *o) {
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
                         stage_names[i], moe_arch_name(c->arch), r2);
                reject(c, i, cand, r);
            }
    if (!cand[0] && !cand[1])
        return MOE_OK;
#if !MOE_HAVE_CUDNN_H
    (void)plan;
    return MOE_OK;
#else
    if (!dn_ok(dn.cudnnCreate(&c->handle), "cudnnCreate", r2, sizeof r2)) {
        c->handle = NULL;
        snprintf(r, sizeof r, "cuDNN %s: %s", v, r2);
        for (int i = 0; i < MOE_STAGE_COUNT; i++)
            if (cand[i] && (rc = reject(c, i, cand, r)))
                return rc;
        return MOE_OK;
    }
    if ((rc = load_kernels(c)))
        return rc;
    for (int i = 0; i < MOE_STAGE_COUNT; i++)
        if (cand[i] && !dn_build(c, i, r2, sizeof r2)) {
            snprintf(r, sizeof r, "cuDNN %s built no execution plan for the %s stage's MoE grouped matmul: %s", v,
                     stage_names[i], r2);
            if ((rc = reject(c, i, cand, r)))
                return rc;
        }
    if (!cand[0] && !cand[1])
        return MOE_OK;
    int ok[MOE_STAGE_COUNT] = {0, 0};
    char res[MOE_STAGE_COUNT][1024] = {"", ""};
    if ((rc = self_check(c, plan, cand, ok, res))) {
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

/* A plan part for plan's shape on arch, nothing decided yet; NULL when out of memory. */
static moe_cudnn_t *cudnn_new(const moe_plan *plan, moe_arch_t arch) {
    moe_cudnn_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->pd = moe_plan_desc(plan);
    c->arch = arch;
    c->M = c->pd->max_rows;
    return c;
}

moe_status moe_cudnn_setup(moe_cudnn_t **out, const moe_plan *plan, moe_arch_t arch, int world,
                           const moe_options *o) {
    *out = NULL;
    moe_cudnn_t *c = cudnn_new(plan, arch);
    if (!c)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status rc = decide(c, plan, world, o);
    if (rc) {
        moe_cudnn_destroy(c);
        return rc;
    }
    *out = c;
    return MOE_OK;
}

int moe_cudnn_probe(const moe_plan *plan, int stage, const char *path, char *report, size_t n) {
    int version = 0;
    char why[900];
    if (moe_cudnn_load(path, &version, why, sizeof why)) {
        snprintf(report, n, "not loaded: %s", why);
        return -1;
    }
#if !MOE_HAVE_CUDNN_H
    (void)plan; (void)stage;
    return -1;
#else
    moe_cudnn_t *c = cudnn_new(plan, MOE_ARCH_SM90A);
    if (!c) {
        snprintf(report, n, "out of memory");
        return -1;
    }
    char v[32];
    moe_cudnn_version_string(version, v, sizeof v);
    int rc = -1;
    if (!dn_ok(dn.cudnnCreate(&c->handle), "cudnnCreate", why, sizeof why)) {
        c->handle = NULL;
        snprintf(report, n, "cuDNN %s: %s", v, why);
    } else if (!dn_build(c, stage, why, sizeof why)) {
        snprintf(report, n, "cuDNN %s, %s stage (%s, M %lld): %s", v, stage_names[stage],
                 moe_dtype_name(c->pd->spec.dtype), c->M, why);
    } else {
        snprintf(report, n, "cuDNN %s, %s stage (%s, M %lld): finalized, engine %lld, workspace %zu bytes", v,
                 stage_names[stage], moe_dtype_name(c->pd->spec.dtype), c->M, c->st[stage].engine, c->st[stage].ws);
        rc = 0;
    }
    moe_cudnn_destroy(c);
    return rc;
#endif
}
