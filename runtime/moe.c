/* moe.c — plans, kernel loading and the forward pass, on the CUDA driver
 * API loaded with dlopen. */
#define _POSIX_C_SOURCE 200809L
#include "moe.h"
#include "moe_internal.h"

#include "cache.h"
#include "cudnn.h"
#include "driver.h"
#include "ep.h"
#include "mesh.h"
#include "plan.h"
#include "spec.h"
#include "tuning.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct moe_plan {
    moe_plan_desc_t pd;
    moe_arch_t arch;
    int device;
    int cache_hit;
    CUcontext ctx;
    CUmodule module;
    CUfunction fn[MOE_K_COUNT];
    int *slot_host;         /* [E] the routing table's slot of each expert's weights */
    CUdeviceptr slot_dev;   /* the same, on the device, read by permute_plan */
    moe_ep_t *ep;           /* the mesh: this rank, its groups, the dispatch path */
    int slot_identity;      /* the routing table is the identity (expert g's weights at slot g) */
    moe_cudnn_t *cudnn;     /* the cuDNN path's decisions, graphs and kernels (never NULL once created) */
    moe_tuning_entry_t tuned; /* a copy of the tuning entry pd.tuned points at (its table is freed) */
    int sms;                /* the device's multiprocessors: a persistent grid's size */
};

static _Thread_local char last_error[4096];

const char *moe_last_error(void) { return last_error; }

moe_status moe_fail(moe_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

/* Record the detailed message and return s. */
static moe_status fail(moe_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *moe_status_string(moe_status s) {
    switch (s) {
    case MOE_OK: return "ok";
    case MOE_ERR_INVALID_ARG: return "invalid argument";
    case MOE_ERR_SPEC: return "bad spec";
    case MOE_ERR_NO_DRIVER: return "no CUDA driver";
    case MOE_ERR_NO_GPU: return "no GPU";
    case MOE_ERR_ARCH: return "unsupported GPU architecture";
    case MOE_ERR_COMPILE: return "kernel generation or compilation failed";
    case MOE_ERR_CUDA: return "CUDA driver error";
    case MOE_ERR_CAPACITY: return "more tokens than the plan's capacity";
    case MOE_ERR_IO: return "I/O error";
    case MOE_ERR_NO_MEMORY: return "out of memory";
    case MOE_ERR_UNSUPPORTED: return "unsupported";
    case MOE_ERR_NCCL: return "NCCL error";
    case MOE_ERR_OVERFLOW: return "dispatch capacity exceeded";
    }
    return "unknown status";
}

/* A driver call's failure as a status, with the call and its message. */
#define CU_CHECK(call)                                                                          \
    do {                                                                                       \
        CUresult cu_rc_ = (call);                                                              \
        if (cu_rc_ != CUDA_SUCCESS)                                                            \
            return fail(MOE_ERR_CUDA, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,       \
                        moe_cu_error_string(cu_rc_));                                          \
    } while (0)

/* Driver, device and arch: the checks that must pass before any compile. */
static moe_status open_device(moe_plan *p, const moe_options *o) {
    char why[512];
    if (moe_cu_load(why, sizeof why))
        return fail(MOE_ERR_NO_DRIVER, "no CUDA driver: %s", why);
    CUresult r = moe_cu.cuInit(0);
    if (r != CUDA_SUCCESS)
        return fail(r == CUDA_ERROR_NO_DEVICE ? MOE_ERR_NO_GPU : MOE_ERR_NO_DRIVER, "no GPU: cuInit failed: %s",
                    moe_cu_error_string(r));
    int count = 0;
    CU_CHECK(moe_cu.cuDeviceGetCount(&count));
    if (count == 0)
        return fail(MOE_ERR_NO_GPU, "no GPU: the driver reports no CUDA device");
    p->device = o ? o->device : 0;
    if (p->device < 0 || p->device >= count)
        return fail(MOE_ERR_INVALID_ARG, "device %d does not exist (%d devices)", p->device, count);
    CUdevice dev;
    CU_CHECK(moe_cu.cuDeviceGet(&dev, p->device));
    int major = 0, minor = 0;
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&p->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    if (major == 9 && minor == 0)
        p->arch = MOE_ARCH_SM90A;
    else if (major == 8)
        p->arch = MOE_ARCH_SM80;
    else
        return fail(MOE_ERR_ARCH, "GPU %d has compute capability %d.%d; moegen builds kernels for sm_80 (8.x) and "
                    "sm_90a (9.0)", p->device, major, minor);
    int listed = 0;
    for (int i = 0; i < p->pd.spec.narch; i++)
        listed |= p->pd.spec.arch[i] == p->arch;
    if (!listed)
        return fail(MOE_ERR_ARCH, "GPU %d is %s, which the spec's arch list does not name; add \"%s\" to arch",
                    p->device, moe_arch_name(p->arch), moe_arch_name(p->arch));
    CU_CHECK(moe_cu.cuDevicePrimaryCtxRetain(&p->ctx, dev));
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    return MOE_OK;
}

static moe_status load_module(moe_plan *p, const moe_buf_t *cubin) {
    size_t tbytes = sizeof(int) * (size_t)p->pd.spec.experts;
    CU_CHECK(moe_cu.cuMemAlloc(&p->slot_dev, tbytes));
    CU_CHECK(moe_cu.cuMemcpyHtoD(p->slot_dev, p->slot_host, tbytes));
    CU_CHECK(moe_cu.cuModuleLoadData(&p->module, cubin->data));
    for (int i = 0; i < MOE_K_COUNT; i++) {
        const moe_kernel_desc_t *k = &moe_plan_kernels(&p->pd, p->arch)[i];
        CUresult r = moe_cu.cuModuleGetFunction(&p->fn[i], p->module, k->name);
        if (r != CUDA_SUCCESS)
            return fail(MOE_ERR_CUDA, "kernel '%s' is missing from the module: %s", k->name, moe_cu_error_string(r));
        if (k->smem > 48 * 1024)
            CU_CHECK(moe_cu.cuFuncSetAttribute(p->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->smem));
    }
    return moe_ep_load(p->ep, p->module);
}

static int is_identity(const int *slot, int n) {
    for (int i = 0; i < n; i++)
        if (slot[i] != i)
            return 0;
    return 1;
}

/* Spec -> plan tables, refusing what this runtime cannot run yet. */
static moe_status plan_tables(moe_plan *p, const char *path, const char *text, const moe_options *o) {
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, path, text, NULL, 0, &d))
        return fail(MOE_ERR_SPEC, "%s", d.msg);
    char err[512];
    /* the option, else a table the process installed (moegen --tuning, the
     * tuner's candidates), else $MOEGEN_TUNING, else the embedded one */
    const char *tpath = o && o->tuning_path ? o->tuning_path : moe_tuning_explicit() ? NULL : getenv("MOEGEN_TUNING");
    moe_tuning_t table;
    if (tpath && moe_tuning_load(&table, tpath, &d)) {
        moe_tuning_free(&table);
        return fail(MOE_ERR_INVALID_ARG, "%s (the tuning table of %s)", d.msg,
                    o && o->tuning_path ? "moe_options.tuning_path" : "MOEGEN_TUNING");
    }
    int bad = moe_plan_desc_build_with(&p->pd, &spec, tpath ? &table : moe_tuning_active(), err, sizeof err);
    if (!bad && p->pd.tuned) {
        p->tuned = *p->pd.tuned;
        p->pd.tuned = &p->tuned;
    }
    if (tpath)
        moe_tuning_free(&table);
    if (bad)
        return fail(MOE_ERR_SPEC, "%s: error: %s", path, err);
    moe_status rc = moe_ep_create(&p->ep, &p->pd, o ? o->rank : 0, err, sizeof err);
    if (rc)
        return fail(rc, rc == MOE_ERR_SPEC ? "%s: error: %s" : "%s: %s", path, err);
    p->slot_host = malloc(sizeof(int) * (size_t)spec.experts);
    if (!p->slot_host)
        return fail(MOE_ERR_NO_MEMORY, "out of memory");
    memcpy(p->slot_host, p->ep->mp.slot, sizeof(int) * (size_t)spec.experts);
    p->slot_identity = is_identity(p->slot_host, spec.experts);
    int cudnn_mode; /* checked here, before any device work; decided in moe_cudnn_setup */
    return moe_cudnn_resolve_mode(o, &cudnn_mode, NULL, 0);
}

/* A mesh of several devices needs the caller's communicator and NCCL (or
 * is a test's simulated rank); checked before any device work. */
static moe_status check_mesh(moe_plan *p, const moe_options *o, int sim) {
    if (p->ep->mp.world == 1 && (!o || !o->nccl_comm))
        return MOE_OK; /* a communicator given for a mesh of one is still checked */
    p->ep->sim = sim;
    if (sim)
        return MOE_OK;
    if (!o || !o->nccl_comm)
        return fail(MOE_ERR_INVALID_ARG, "the mesh has %d devices: moe_options.nccl_comm must be the NCCL "
                    "communicator over all of them", p->ep->mp.world);
    char why[512];
    if (moe_nccl_load(why, sizeof why))
        return fail(MOE_ERR_UNSUPPORTED, "the mesh has %d devices and needs NCCL, which did not load: %s",
                    p->ep->mp.world, why);
    return MOE_OK;
}

static moe_status connect_mesh(moe_plan *p, const moe_options *o) {
    if (p->ep->sim || !o || !o->nccl_comm)
        return MOE_OK;
    return moe_ep_connect(p->ep, o->nccl_comm, p->device);
}

static moe_status create_common(moe_plan **out, moe_plan *p, moe_status s) {
    if (s != MOE_OK) {
        moe_plan_destroy(p);
        *out = NULL;
        return s;
    }
    *out = p;
    last_error[0] = '\0';
    return MOE_OK;
}

static moe_status plan_create(moe_plan **out, const char *spec_path, const char *text, const moe_options *o,
                              int sim) {
    if (!out)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_create: plan is NULL");
    *out = NULL;
    if (!spec_path)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_create: spec_path is NULL");
    moe_plan *p = calloc(1, sizeof *p);
    if (!p)
        return fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status s = plan_tables(p, spec_path, text, o);
    if (s == MOE_OK)
        s = check_mesh(p, o, sim);
    if (s == MOE_OK)
        s = open_device(p, o);
    if (s == MOE_OK)
        s = connect_mesh(p, o);
    if (s == MOE_OK) {
        moe_buf_t cubin = {0};
        moe_diag_t d;
        if (moe_cache_cubin(&p->pd, o ? o->templates_dir : NULL, p->arch, o ? o->cache_dir : NULL, &cubin,
                            &p->cache_hit, &d))
            s = fail(MOE_ERR_COMPILE, "%s", d.msg);
        else
            s = load_module(p, &cubin);
        moe_buf_free(&cubin);
    }
    if (s == MOE_OK)
        s = moe_cudnn_setup(&p->cudnn, p, p->arch, p->ep->mp.world, o);
    return create_common(out, p, s);
}

moe_status moe_plan_create(moe_plan **out, const char *spec_path, const moe_options *o) {
    return plan_create(out, spec_path, NULL, o, 0);
}

moe_status moe_plan_create_text(moe_plan **out, const char *name, const char *text, const moe_options *o) {
    if (!text)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_create_text: text is NULL");
    return plan_create(out, name, text, o, 0);
}

moe_status moe_plan_create_sim(moe_plan **out, const char *spec_path, const moe_options *o) {
    return plan_create(out, spec_path, NULL, o, 1);
}

/* A compiled folder's GEMMs are the ones this runtime plans: the tuning
 * table chooses their tiles, and a folder compiled under another table
 * would otherwise fail later as a kernel missing from the module. */
static moe_status same_gemms(const moe_plan *p, const char *manifest, const char *mpath) {
    const moe_spec_t *s = &p->pd.spec;
    for (int a = 0; a < s->narch; a++)
        for (int k = MOE_K_GEMM_UP; k <= MOE_K_GEMM_DOWN; k++) {
            const char *want = moe_plan_kernels(&p->pd, s->arch[a])[k].name;
            char quoted[160];
            snprintf(quoted, sizeof quoted, "\"name\": \"%s\"", want);
            if (!strstr(manifest, quoted))
                return fail(MOE_ERR_IO, "%s: the folder's %s GEMMs are not the ones this runtime plans, %s (the "
                            "tuning table decides their tiles); compile the folder with the same table (moegen "
                            "--tuning FILE or MOEGEN_TUNING) or pass that table as moe_options.tuning_path",
                            mpath, moe_arch_name(s->arch[a]), want);
        }
    return MOE_OK;
}

moe_status moe_plan_create_from_dir(moe_plan **out, const char *dir, const moe_options *o) {
    if (!out)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: plan is NULL");
    *out = NULL;
    if (!dir)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: dir is NULL");
    /* the folder's one NAME.moe names everything else */
    char mpath[4200], err[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    char *manifest = moe_read_file(mpath, 64u << 20, NULL, err, sizeof err);
    if (!manifest)
        return fail(MOE_ERR_IO, "%s", err);
    const char *key = strstr(manifest, "\"name\": \"");
    char name[MOE_NAME_MAX] = "";
    if (key)
        sscanf(key + 9, "%63[A-Za-z0-9_]", name);
    if (!name[0]) {
        free(manifest);
        return fail(MOE_ERR_IO, "%s: no \"name\" in the manifest", mpath);
    }
    moe_plan *p = calloc(1, sizeof *p);
    if (!p) {
        free(manifest);
        return fail(MOE_ERR_NO_MEMORY, "out of memory");
    }
    char spath[4200];
    snprintf(spath, sizeof spath, "%s/%s.moe", dir, name);
    moe_status s = plan_tables(p, spath, NULL, o);
    if (s == MOE_OK)
        s = same_gemms(p, manifest, mpath);
    free(manifest);
    if (s == MOE_OK)
        s = check_mesh(p, o, 0);
    if (s == MOE_OK)
        s = open_device(p, o);
    if (s == MOE_OK)
        s = connect_mesh(p, o);
    if (s == MOE_OK) {
        char cpath[4200];
        snprintf(cpath, sizeof cpath, "%s/%s.%s.cubin", dir, name, moe_arch_name(p->arch));
        size_t len;
        char *data = moe_read_file(cpath, 1u << 30, &len, err, sizeof err);
        if (!data) {
            s = fail(MOE_ERR_IO, "%s (compile the spec with arch %s to run on this GPU)", err,
                     moe_arch_name(p->arch));
        } else {
            moe_buf_t cubin = {data, len, len + 1, 0};
            s = load_module(p, &cubin);
            free(data);
        }
    }
    if (s == MOE_OK)
        s = moe_cudnn_setup(&p->cudnn, p, p->arch, p->ep->mp.world, o);
    return create_common(out, p, s);
}

void moe_plan_destroy(moe_plan *p) {
    if (!p)
        return;
    if (p->ctx) /* the module and the table belong to the plan's context */
        moe_cu.cuCtxSetCurrent(p->ctx);
    moe_cudnn_destroy(p->cudnn);
    if (p->module)
        moe_cu.cuModuleUnload(p->module);
    if (p->slot_dev)
        moe_cu.cuMemFree(p->slot_dev);
    moe_ep_destroy(p->ep);
    free(p->slot_host);
    if (p->ctx) {
        CUdevice dev;
        if (moe_cu.cuDeviceGet(&dev, p->device) == CUDA_SUCCESS)
            moe_cu.cuDevicePrimaryCtxRelease(dev);
    }
    free(p);
}

size_t moe_plan_workspace_size(const moe_plan *p, int tokens) {
    if (!p || tokens < 1 || tokens > p->pd.spec.tokens)
        return 0;
    /* the layout is fixed at the spec's capacity, so any tokens fits */
    return p->ep->dispatch ? p->ep->ed.ws_bytes : p->pd.ws_bytes + moe_cudnn_workspace(p->cudnn);
}

moe_status moe_plan_workspace_region(const moe_plan *p, const char *name, size_t *offset, size_t *bytes) {
    if (!p || !name)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_workspace_region: NULL argument");
    const moe_ws_region_t *ws = p->ep->dispatch ? p->ep->ed.ws : p->pd.ws;
    int n = p->ep->dispatch ? MOE_EW_COUNT : MOE_WS_COUNT;
    for (int i = 0; i < n; i++)
        if (strcmp(ws[i].name, name) == 0) {
            if (offset)
                *offset = ws[i].offset;
            if (bytes)
                *bytes = ws[i].bytes;
            return MOE_OK;
        }
    return fail(MOE_ERR_INVALID_ARG, "no workspace region '%s'", name);
}

moe_status moe_plan_pack_w1(const moe_plan *p, const uint16_t *w1, uint16_t *w1p) {
    if (!p || !w1 || !w1p)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_w1: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    long long F2 = 2LL * s->ffn, H = s->hidden;
    for (long long e = 0; e < s->experts; e++)
        for (long long r = 0; r < F2; r++)
            memcpy(w1p + (e * F2 + moe_plan_packed_row(&p->pd, r)) * H, w1 + (e * F2 + r) * H, (size_t)H * 2);
    return MOE_OK;
}

moe_status moe_plan_pack_b1(const moe_plan *p, const uint16_t *b1, uint16_t *b1p) {
    if (!p || !b1 || !b1p)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_b1: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    long long F2 = 2LL * s->ffn;
    for (long long e = 0; e < s->experts; e++)
        for (long long r = 0; r < F2; r++)
            b1p[e * F2 + moe_plan_packed_row(&p->pd, r)] = b1[e * F2 + r];
    return MOE_OK;
}

/* The TMA tensor maps of sm_90a GEMM k (templates/gemm_sm90.lua): A over
 * [tiles * align, K] at a (every row a tile grid of `tiles` M tiles
 * reaches), B over [slots * N, K] at b; boxes of 64 halves x bm (A) or bn
 * (B) rows in the 128-byte swizzle. Out-of-bounds box parts read as zeros. */
static moe_status gemm_maps(const moe_plan *p, int k, long long tiles, CUdeviceptr a, CUdeviceptr b,
                            CUtensorMap *ma, CUtensorMap *mb) {
    const moe_spec_t *s = &p->pd.spec;
    const moe_kernel_desc_t *d = &moe_plan_kernels(&p->pd, p->arch)[k];
    long long K = k == MOE_K_GEMM_UP ? s->hidden : s->ffn, N = k == MOE_K_GEMM_UP ? 2LL * s->ffn : s->hidden;
    const long long rows[2] = {tiles * p->pd.align, (long long)p->ep->mp.nheld * N};
    const unsigned box_rows[2] = {(unsigned)d->tile.bm, (unsigned)d->tile.bn};
    CUtensorMap *m[2] = {ma, mb};
    void *base[2] = {(void *)(uintptr_t)a, (void *)(uintptr_t)b};
    for (int i = 0; i < 2; i++) {
        const cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)rows[i]}, stride[1] = {(cuuint64_t)K * 2};
        const cuuint32_t box[2] = {64, box_rows[i]}, estride[2] = {1, 1};
        CUresult r = moe_cu.cuTensorMapEncodeTiled(m[i], CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, base[i], dim, stride, box,
                                                   estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS)
            return fail(MOE_ERR_CUDA, "cuTensorMapEncodeTiled (%s %s, %lld x %lld at %p; 16-byte aligned?): %s",
                        d->name, i ? "B" : "A", rows[i], K, base[i], moe_cu_error_string(r));
    }
    return MOE_OK;
}

/* Launch kernel k of the plan; rows_y > 0 replaces the GEMMs' tile grid
 * (the expert-parallel path sizes it from the receive side). GEMM args are
 * always (A, B, bias, tiles, num_tiles, out) with A and B device pointers;
 * the sm_90a GEMMs get A and B as TMA tensor maps instead, made here, and
 * run on a 1D grid over that tile space: one CTA per tile, or at most one
 * CTA per SM when the tile is persistent. */
static moe_status launch_grid(const moe_plan *p, int k, int tokens, long long rows_y, CUstream st, void **args,
                              CUevent *ev) {
    if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
        return fail(MOE_ERR_CUDA, "cuEventRecord failed");
    unsigned g[3];
    moe_plan_grid(&p->pd, p->arch, k, tokens, g);
    if (rows_y > 0)
        g[1] = (unsigned)rows_y;
    const moe_kernel_desc_t *d = &moe_plan_kernels(&p->pd, p->arch)[k];
    CUtensorMap ma, mb;
    void *targs[6];
    if (d->tile.consumers > 0) {
        moe_status rc = gemm_maps(p, k, g[1], *(const CUdeviceptr *)args[0], *(const CUdeviceptr *)args[1], &ma, &mb);
        if (rc)
            return rc;
        memcpy(targs, args, sizeof targs);
        targs[0] = &ma;
        targs[1] = &mb;
        args = targs;
        unsigned long long total = (unsigned long long)g[0] * g[1];
        if (d->tile.persistent && p->sms > 0 && total > (unsigned long long)p->sms)
            total = (unsigned long long)p->sms;
        g[0] = (unsigned)total;
        g[1] = 1;
    }
    CUresult r = moe_cu.cuLaunchKernel(p->fn[k], g[0], g[1], g[2], (unsigned)d->threads, 1, 1, (unsigned)d->smem, st,
                                       args, NULL);
    if (r != CUDA_SUCCESS)
        return fail(MOE_ERR_CUDA, "launching %s (grid %u x %u): %s", d->name, g[0], g[1], moe_cu_error_string(r));
    return MOE_OK;
}

static moe_status launch(const moe_plan *p, int k, int tokens, CUstream st, void **args, CUevent *ev) {
    return launch_grid(p, k, tokens, 0, st, args, ev);
}

moe_status moe_launch_family(const moe_plan *p, int k, int tokens, CUstream st, void **args) {
    return launch_grid(p, k, tokens, 0, st, args, NULL);
}

struct moe_ep *moe_plan_ep(const moe_plan *p) { return p->ep; }
CUdeviceptr moe_plan_slot_table(const moe_plan *p) { return p->slot_dev; }

/* Whether stage takes cuDNN in this call: the plan decided so, and the
 * weights sit at their experts' own slots (cuDNN reads first_token_offset
 * in expert order, where the generated kernels read slots from the tiles). */
static int use_cudnn(const moe_plan *p, int stage, const moe_ffn_args_t *f) {
    return p->slot_identity && moe_cudnn_applies(p->cudnn, stage, f);
}

moe_status moe_run_ffn(const moe_plan *p, const moe_ffn_args_t *f, CUstream st, CUevent *ev) {
    moe_status rc;
    CUdeviceptr xs = f->xs, tiles = f->tiles, nt = f->num_tiles, hbuf = f->hbuf, out = f->out;
    static const int kernel_of[MOE_STAGE_COUNT] = {MOE_K_GEMM_UP, MOE_K_GEMM_DOWN};
    for (int stage = 0; stage < MOE_STAGE_COUNT; stage++) {
        const int k = kernel_of[stage];
        if (use_cudnn(p, stage, f)) {
            if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
                return fail(MOE_ERR_CUDA, "cuEventRecord failed");
            if ((rc = moe_cudnn_run(p->cudnn, stage, f, st)))
                return rc;
            continue;
        }
        void *up[] = {&xs, (void *)&f->w1p, (void *)&f->b1p, &tiles, &nt, &hbuf};
        void *down[] = {&hbuf, (void *)&f->w2, (void *)&f->b2, &tiles, &nt, &out};
        if ((rc = launch_grid(p, k, f->tokens, f->grid_tiles, st, stage == MOE_STAGE_UP ? up : down, ev)))
            return rc;
    }
    return MOE_OK;
}

moe_status moe_plan_stage_path(const moe_plan *p, int stage, int *path, const char **why) {
    if (!p || stage < 0 || stage >= MOE_STAGE_COUNT)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_stage_path: %s", p ? "no such stage" : "plan is NULL");
    const char *w;
    int at = moe_cudnn_stage_path(p->cudnn, stage, &w);
    if (at == MOE_PATH_CUDNN && !p->slot_identity) {
        at = MOE_PATH_GENERATED;
        w = "the routing table is not the identity (weights in a permuted slot order), which the cuDNN graph "
            "cannot read";
    }
    if (path)
        *path = at;
    if (why)
        *why = w;
    return MOE_OK;
}

const moe_plan_desc_t *moe_plan_desc(const moe_plan *p) { return p ? &p->pd : NULL; }

moe_status moe_forward(const moe_plan *p, const moe_forward_args *a, void *stream) {
    return moe_forward_timed(p, a, stream, NULL);
}

moe_status moe_forward_timed(const moe_plan *p, const moe_forward_args *a, void *stream, CUevent ev[7]) {
    if (!p || !a)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    if (a->tokens < 1)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: tokens = %d; at least 1 is needed", a->tokens);
    if (a->tokens > s->tokens)
        return fail(MOE_ERR_CAPACITY, "moe_forward: %d tokens exceed the plan's capacity of %d (spec key tokens)",
                    a->tokens, s->tokens);
    if (!a->x || !a->router_w || !a->w1p || !a->w2 || !a->y || !a->workspace)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: x, router_w, w1p, w2, y and workspace are required");
    if (s->router.bias && !a->router_bias)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: the spec has router.bias; router_bias is required");
    if (s->router.logit_bias && !a->router_logit_bias)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: the spec has router.logit_bias; router_logit_bias is required");
    if (s->ffn_bias && (!a->b1p || !a->b2))
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: the spec has ffn_bias; b1p and b2 are required");
    if ((uintptr_t)a->workspace % 256)
        return fail(MOE_ERR_INVALID_ARG, "moe_forward: workspace must be 256-byte aligned");
    CUstream st = (CUstream)stream;
    CUresult r = moe_cu.cuCtxSetCurrent(p->ctx);
    if (r != CUDA_SUCCESS)
        return fail(MOE_ERR_CUDA, "cuCtxSetCurrent: %s", moe_cu_error_string(r));
    if (p->ep->dispatch) {
        if (ev)
            return fail(MOE_ERR_UNSUPPORTED, "per-kernel timing is for single-rank plans");
        return moe_ep_forward(p, a, st);
    }
    CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace;
    CUdeviceptr reg[MOE_WS_COUNT];
    for (int i = 0; i < MOE_WS_COUNT; i++)
        reg[i] = ws + p->pd.ws[i].offset;
    r = moe_cu.cuMemsetD32Async(reg[MOE_WS_COUNTS], 0, (size_t)s->experts, st);
    if (r != CUDA_SUCCESS)
        return fail(MOE_ERR_CUDA, "cuMemsetD32Async: %s", moe_cu_error_string(r));
    int T = a->tokens;
    moe_status rc;
    {
        void *args[] = {(void *)&a->x, (void *)&a->router_w, (void *)&a->router_bias, (void *)&a->router_logit_bias,
                        &T, &reg[MOE_WS_TOPK_IDX], &reg[MOE_WS_TOPK_W], &reg[MOE_WS_COUNTS]};
        if ((rc = launch(p, MOE_K_ROUTE, T, st, args, ev)))
            return rc;
    }
    {
        CUdeviceptr slot = p->slot_dev;
        void *args[] = {&reg[MOE_WS_COUNTS], &slot, &reg[MOE_WS_OFFSETS], &reg[MOE_WS_CURSOR], &reg[MOE_WS_TILES],
                        &reg[MOE_WS_NUM_TILES]};
        if ((rc = launch(p, MOE_K_PERMUTE_PLAN, T, st, args, ev)))
            return rc;
    }
    {
        void *args[] = {(void *)&a->x, &reg[MOE_WS_TOPK_IDX], &reg[MOE_WS_OFFSETS], &reg[MOE_WS_CURSOR], &T,
                        &reg[MOE_WS_XS], &reg[MOE_WS_ROW_OF]};
        if ((rc = launch(p, MOE_K_PERMUTE_SCATTER, T, st, args, ev)))
            return rc;
    }
    {
        moe_ffn_args_t f = {.tokens = T, .xs = reg[MOE_WS_XS], .tiles = reg[MOE_WS_TILES],
                            .num_tiles = reg[MOE_WS_NUM_TILES], .offsets = reg[MOE_WS_OFFSETS],
                            .hbuf = reg[MOE_WS_HBUF], .out = reg[MOE_WS_XS], .w1p = a->w1p, .b1p = a->b1p,
                            .w2 = a->w2, .b2 = a->b2,
                            .scratch = moe_cudnn_workspace(p->cudnn) ? ws + p->pd.ws_bytes : 0};
        if ((rc = moe_run_ffn(p, &f, st, ev)))
            return rc;
    }
    {
        void *args[] = {&reg[MOE_WS_XS], &reg[MOE_WS_ROW_OF], &reg[MOE_WS_TOPK_W], &T, (void *)&a->y};
        if ((rc = launch(p, MOE_K_COMBINE, T, st, args, ev)))
            return rc;
    }
    if (ev && moe_cu.cuEventRecord(ev[MOE_K_COUNT], st) != CUDA_SUCCESS)
        return fail(MOE_ERR_CUDA, "cuEventRecord failed");
    return MOE_OK;
}

moe_status moe_plan_set_slot_table(moe_plan *p, const int *slot_of) {
    if (!p || !slot_of)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_set_slot_table: NULL argument");
    int E = p->pd.spec.experts;
    char *seen = calloc((size_t)E, 1);
    if (!seen)
        return fail(MOE_ERR_NO_MEMORY, "out of memory");
    for (int e = 0; e < E; e++) {
        if (slot_of[e] < 0 || slot_of[e] >= E || seen[slot_of[e]]) {
            free(seen);
            return fail(MOE_ERR_INVALID_ARG, "moe_plan_set_slot_table: slot_of[%d] = %d: not a permutation of 0..%d",
                        e, slot_of[e], E - 1);
        }
        seen[slot_of[e]] = 1;
    }
    free(seen);
    memcpy(p->slot_host, slot_of, sizeof(int) * (size_t)E);
    p->slot_identity = is_identity(slot_of, E);
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    CU_CHECK(moe_cu.cuMemcpyHtoD(p->slot_dev, slot_of, sizeof(int) * (size_t)E));
    return MOE_OK;
}

moe_status moe_plan_get_info(const moe_plan *p, moe_plan_info *info) {
    if (!p || !info)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_get_info: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    *info = (moe_plan_info){.name = s->name, .hash = s->hash, .arch = moe_arch_name(p->arch),
                            .experts = s->experts, .top_k = s->top_k, .hidden = s->hidden, .ffn = s->ffn,
                            .tokens = s->tokens, .dtype_bytes = 2, .align = p->pd.align, .cache_hit = p->cache_hit,
                            .world = p->ep->mp.world, .rank = p->ep->rank, .ep = p->ep->mp.size[MOE_AXIS_EP],
                            .ep_rank = p->ep->me->ep_rank, .fsdp = p->ep->mp.size[MOE_AXIS_FSDP],
                            .fsdp_rank = p->ep->me->fsdp_rank, .stored = p->ep->mp.nstored,
                            .held = p->ep->mp.nheld, .dispatch_capacity = p->ep->ed.capacity,
                            .cudnn_version = moe_cudnn_version(p->cudnn)};
    for (int i = 0; i < MOE_K_COUNT; i++)
        info->kernels[i] = moe_plan_kernels(&p->pd, p->arch)[i].name;
    return MOE_OK;
}

moe_status moe_gather_weights(const moe_plan *p, const moe_gather_args *g, void *stream) {
    if (!p || !g)
        return fail(MOE_ERR_INVALID_ARG, "moe_gather_weights: NULL argument");
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    if (p->ep->mp.world == 1 || !p->ep->fsdp_shards) { /* nothing to gather: the local copy only */
        moe_ep_call_t c;
        c.nx = 0;
        return moe_gather_prepare(p, g, (CUstream)stream, &c);
    }
    return moe_ep_gather(p, g, (CUstream)stream);
}

moe_status moe_plan_overflow(const moe_plan *p, const void *workspace, void *stream, long long *rows) {
    if (rows)
        *rows = 0;
    if (!p || !workspace)
        return fail(MOE_ERR_INVALID_ARG, "moe_plan_overflow: NULL argument");
    if (!p->ep->dispatch || !p->ep->ed.capacity)
        return MOE_OK;
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    CU_CHECK(moe_cu.cuStreamSynchronize((CUstream)stream));
    int n = 0;
    CU_CHECK(moe_cu.cuMemcpyDtoH(&n, (CUdeviceptr)(uintptr_t)workspace + p->ep->ed.ws[MOE_EW_OVERFLOW].offset,
                                 sizeof n));
    if (rows)
        *rows = n;
    if (n > 0)
        return fail(MOE_ERR_OVERFLOW, "dispatch capacity exceeded: %d rows did not fit dispatch.capacity = %d rows "
                    "per peer (raise it, or use dispatch.mode = \"exact\"); this forward's output is wrong", n,
                    p->ep->ed.capacity);
    return MOE_OK;
}
