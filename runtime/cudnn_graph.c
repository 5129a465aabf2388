/* cudnn_graph.c — the cuDNN path's MoE grouped matmul graphs (descriptors,
 * engines, execution plans), their execution, and the SwiGLU kernel the up
 * stage runs after the matmul. See cudnn.h. */
#define _GNU_SOURCE
#include "cudnn_impl.h"

#include "compile.h"
#include "emit.h"
#include "error.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if MOE_HAVE_CUDNN_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* cuDNN's failure of `what` as a sentence in why; returns 0 on failure. */
int moe_dn_ok(cudnnStatus_t s, const char *what, char *why, size_t n) {
    if (s == CUDNN_STATUS_SUCCESS)
        return 1;
    char last[512] = "";
    moe_dn.cudnnGetLastErrorString(last, sizeof last);
    snprintf(why, n, "%s: %s%s%s", what, moe_dn.cudnnGetErrorString(s), last[0] ? " (" : "", last[0] ? last : "");
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
    if (!moe_dn_ok(moe_dn.cudnnBackendCreateDescriptor(ty, &d), what, why, n))
        return NULL;
    if (!keep(t, d)) {
        moe_dn.cudnnBackendDestroyDescriptor(d);
        snprintf(why, n, "%s: too many descriptors", what);
        return NULL;
    }
    return d;
}

#define DN_SET(d, attr, type, count, ptr, what)                                                 \
    moe_dn_ok(moe_dn.cudnnBackendSetAttribute((d), (attr), (type), (count), (ptr)), (what), why, n)

static cudnnBackendDescriptor_t dn_tensor(dn_stage_t *t, int64_t uid, cudnnDataType_t dt, const int64_t dims[3],
                                          const int64_t strides[3], char *why, size_t n) {
    cudnnBackendDescriptor_t d = dn_create(t, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor", why, n);
    int64_t align = 16;
    if (!d || !DN_SET(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 3, dims, "tensor dimensions") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 3, strides, "tensor strides") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id") ||
        !DN_SET(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment") ||
        !moe_dn_ok(moe_dn.cudnnBackendFinalize(d), "finalizing a tensor", why, n))
        return NULL;
    return d;
}

/* Finalize an execution plan for engine config cfg; 1 on success. */
static int dn_try_plan(moe_cudnn_t *c, dn_stage_t *t, cudnnBackendDescriptor_t cfg, char *why, size_t n) {
    cudnnBackendDescriptor_t p = NULL;
    if (!moe_dn_ok(moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p),
                   "execution plan", why, n))
        return 0;
    if (!DN_SET(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->handle, "plan handle") ||
        !DN_SET(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg, "plan config") ||
        !moe_dn_ok(moe_dn.cudnnBackendFinalize(p), "finalizing the execution plan", why, n)) {
        moe_dn.cudnnBackendDestroyDescriptor(p);
        return 0;
    }
    int64_t ws = 0, cnt = 0, idx = -1;
    moe_dn.cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
    cudnnBackendDescriptor_t eng = NULL;
    if (moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
        if (moe_dn.cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt,
                                        &eng) == CUDNN_STATUS_SUCCESS)
            moe_dn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
        moe_dn.cudnnBackendDestroyDescriptor(eng);
    }
    t->exec = p;
    t->ws = (size_t)(ws > 0 ? ws : 0);
    t->engine = idx;
    return 1;
}

/* Build and finalize the mode-NONE MoE grouped matmul of stage for the
 * plan's shape (M rows): heuristics first, then every engine by index.
 * Returns 1, or 0 with the last cuDNN error in why. */
int moe_dn_build(moe_cudnn_t *c, int stage, char *why, size_t n) {
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
        !moe_dn_ok(moe_dn.cudnnBackendFinalize(op), "finalizing the MoE grouped matmul operation", why, n))
        return 0;
    cudnnBackendDescriptor_t g = dn_create(t, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph", why, n);
    if (!g || !DN_SET(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->handle, "graph handle") ||
        !DN_SET(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op, "graph operations") ||
        !moe_dn_ok(moe_dn.cudnnBackendFinalize(g), "finalizing the operation graph", why, n))
        return 0;
    /* heuristics */
    char last[1024] = "";
    cudnnBackendDescriptor_t heur = dn_create(t, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics", why, n);
    cudnnBackendHeurMode_t hm = CUDNN_HEUR_MODE_A;
    int64_t count = 0;
    if (heur && DN_SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g,
                       "heuristics graph") &&
        DN_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hm, "heuristics mode") &&
        moe_dn_ok(moe_dn.cudnnBackendFinalize(heur), "engine heuristics", why, n) &&
        moe_dn_ok(moe_dn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, NULL), "heuristics results", why, n)) {
        enum { MAXCFG = 8 };
        cudnnBackendDescriptor_t cfg[MAXCFG];
        int64_t want = count < MAXCFG ? count : MAXCFG, got = 0;
        int made = 0;
        for (; made < want; made++)
            if (moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfg[made]) !=
                CUDNN_STATUS_SUCCESS)
                break;
        int used = -1;
        if (made > 0 && moe_dn_ok(moe_dn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
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
                moe_dn.cudnnBackendDestroyDescriptor(cfg[i]);
        if (t->exec)
            return 1;
        if (!last[0])
            snprintf(last, sizeof last, "the heuristics offered %lld engine configurations", (long long)count);
    } else {
        snprintf(last, sizeof last, "%s", why);
    }
    /* every engine by global index */
    int64_t engines = 0, cnt = 0;
    moe_dn.cudnnBackendGetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &cnt,
                                &engines);
    for (int64_t i = 0; i < engines && !t->exec; i++) {
        cudnnBackendDescriptor_t e = NULL, cf = NULL;
        if (moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &e) != CUDNN_STATUS_SUCCESS)
            break;
        int ok = moe_dn.cudnnBackendSetAttribute(e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &g) == CUDNN_STATUS_SUCCESS &&
                 moe_dn.cudnnBackendSetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &i) ==
                     CUDNN_STATUS_SUCCESS &&
                 moe_dn.cudnnBackendFinalize(e) == CUDNN_STATUS_SUCCESS &&
                 moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cf) == CUDNN_STATUS_SUCCESS &&
                 moe_dn.cudnnBackendSetAttribute(cf, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e) ==
                     CUDNN_STATUS_SUCCESS &&
                 moe_dn.cudnnBackendFinalize(cf) == CUDNN_STATUS_SUCCESS;
        if (ok && dn_try_plan(c, t, cf, why, n) && keep(t, e) && keep(t, cf))
            break;
        if (cf)
            moe_dn.cudnnBackendDestroyDescriptor(cf);
        moe_dn.cudnnBackendDestroyDescriptor(e);
    }
    if (t->exec)
        return 1;
    snprintf(why, n, "no engine finalized (heuristics: %s; %lld engines tried by index)", last,
             (long long)engines);
    return 0;
}

/* Enqueue stage's execution plan on st with these pointers. */
moe_status moe_dn_exec(const moe_cudnn_t *c, int stage, CUdeviceptr tok, const void *w, CUdeviceptr off,
                          CUdeviceptr y, CUdeviceptr ws, CUstream st) {
    char why[768];
    const size_t n = sizeof why;
    int64_t uids[4] = {1, 2, 3, 4};
    void *ptrs[4] = {(void *)(uintptr_t)tok, (void *)w, (void *)(uintptr_t)off, (void *)(uintptr_t)y};
    void *wsp = (void *)(uintptr_t)ws;
    cudnnBackendDescriptor_t vp = NULL;
    if (!moe_dn_ok(moe_dn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), "variant pack",
                   why, n))
        return moe_fail(MOE_ERR_CUDA, "cuDNN %s stage: %s", moe_cudnn_stage_names[stage], why);
    int ok = DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4, uids, "variant pack ids") &&
             DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 4, ptrs, "variant pack data") &&
             DN_SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp, "variant pack workspace") &&
             moe_dn_ok(moe_dn.cudnnBackendFinalize(vp), "finalizing the variant pack", why, n);
    if (ok) {
        pthread_mutex_lock((pthread_mutex_t *)&c->lock);
        ok = moe_dn_ok(moe_dn.cudnnSetStream(c->handle, (cudaStream_t)st), "cudnnSetStream", why, n) &&
             moe_dn_ok(moe_dn.cudnnBackendExecute(c->handle, c->st[stage].exec, vp), "cudnnBackendExecute", why, n);
        pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    }
    moe_dn.cudnnBackendDestroyDescriptor(vp);
    return ok ? MOE_OK : moe_fail(MOE_ERR_CUDA, "cuDNN %s stage: %s", moe_cudnn_stage_names[stage], why);
}

#pragma GCC diagnostic pop

#endif /* MOE_HAVE_CUDNN_H */

/* ---- the activation and the self-check's fill ----------------------------- */

/* The fill kernel's source (NVRTC): the self-check's random inputs, made on
 * the device (a weight set can be gigabytes). */
static const char fill_body[] =
    "typedef unsigned short u16;\n"
    "static __device__ __forceinline__ u16 f2h(float f) {\n"
    "    u16 r;\n"
    "#if MOE_BF16\n"
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(f));\n"
    "#else\n"
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(f));\n"
    "#endif\n"
    "    return r;\n"
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

moe_status moe_cudnn_load_kernels(moe_cudnn_t *c) {
    const moe_spec_t *s = &c->pd->spec;
    moe_buf_t src = {0};
    moe_buf_printf(&src, "/* moegen %s: the cuDNN self-check's fill (spec %s) */\n#define MOE_BF16 %d\n",
                   MOEGEN_VERSION, s->hash, s->dtype == MOE_DTYPE_BF16);
    moe_buf_append(&src, fill_body, sizeof fill_body - 1);
    if (src.failed) {
        moe_buf_free(&src);
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    }
    moe_buf_t cubin = {0};
    moe_diag_t d;
    int rc = moe_nvrtc_compile(src.data, "cudnn_fill.cu", c->arch, &cubin, NULL, NULL, &d);
    moe_buf_free(&src);
    if (rc)
        return moe_fail(MOE_ERR_COMPILE, "%s", d.msg);
    CUresult r = moe_cu.cuModuleLoadData(&c->mod, cubin.data);
    moe_buf_free(&cubin);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuModuleGetFunction(&c->fill, c->mod, "moe_cudnn_fill");
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "loading the cuDNN self-check's fill kernel: %s", moe_cu_error_string(r));
    return MOE_OK;
}

moe_status moe_cudnn_launch_swiglu(const moe_cudnn_t *c, CUdeviceptr u, CUdeviceptr h, CUdeviceptr offsets,
                                   long long cap, CUstream st) {
    void *args[] = {&u, &h, &offsets, &cap};
    return moe_launch_kernel(c->l, MOE_K_SWIGLU, 0, cap, st, args, NULL); /* cap rows, one thread per 8 columns */
}

int moe_cudnn_fill(const moe_cudnn_t *c, CUdeviceptr p, unsigned long long n, unsigned long long seed, float scale) {
    void *args[] = {&p, &n, &seed, &scale};
    const unsigned blocks = (unsigned)(c->l->sms > 0 ? c->l->sms * 16 : 1); /* a grid-stride loop */
    return moe_cu.cuLaunchKernel(c->fill, blocks, 1, 1, 256, 1, 1, 0, NULL, args, NULL) == CUDA_SUCCESS;
}

moe_status moe_cudnn_run(const moe_cudnn_t *c, int stage, const moe_ffn_args_t *f, CUstream st) {
#if !MOE_HAVE_CUDNN_H
    (void)c; (void)stage; (void)f; (void)st;
    return moe_fail(MOE_ERR_UNSUPPORTED, "no cuDNN path in this build");
#else
    CUdeviceptr ws = f->scratch + c->cws_off;
    if (stage == MOE_STAGE_DOWN)
        return moe_dn_exec(c, stage, f->hbuf, f->w2, f->offsets, f->out, ws, st);
    CUdeviceptr u = f->scratch + c->u_off;
    moe_status rc = moe_dn_exec(c, stage, f->xs, f->w1p, f->offsets, u, ws, st);
    if (rc)
        return rc;
    return moe_cudnn_launch_swiglu(c, u, f->hbuf, f->offsets, moe_plan_max_rows(c->pd, f->tokens), st);
#endif
}
