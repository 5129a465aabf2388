/* moe_plan.c — plan creation (from a spec or a compiled folder), the
 * device and module it loads, destruction, and the plan's queries. */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "cache.h"
#include "cudnn.h"
#include "ep.h"
#include "error.h"
#include "mesh.h"
#include "spec.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Driver, device and arch: the checks that must pass before any compile. */
static moe_status open_device(moe_plan *p, const moe_options *o) {
    char why[512];
    if (moe_cu_load(why, sizeof why))
        return moe_fail(MOE_ERR_NO_DRIVER, "no CUDA driver: %s", why);
    CUresult r = moe_cu.cuInit(0);
    if (r != CUDA_SUCCESS)
        return moe_fail(r == CUDA_ERROR_NO_DEVICE ? MOE_ERR_NO_GPU : MOE_ERR_NO_DRIVER, "no GPU: cuInit failed: %s",
                        moe_cu_error_string(r));
    int count = 0;
    CU_CHECK(moe_cu.cuDeviceGetCount(&count));
    if (count == 0)
        return moe_fail(MOE_ERR_NO_GPU, "no GPU: the driver reports no CUDA device");
    p->device = o ? o->device : 0;
    if (p->device < 0 || p->device >= count)
        return moe_fail(MOE_ERR_INVALID_ARG, "device %d does not exist (%d devices)", p->device, count);
    CUdevice dev;
    CU_CHECK(moe_cu.cuDeviceGet(&dev, p->device));
    int major = 0, minor = 0;
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CU_CHECK(moe_cu.cuDeviceGetAttribute(&p->launcher.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    if (major == 9 && minor == 0)
        p->launcher.arch = MOE_ARCH_SM90A;
    else if (major == 8)
        p->launcher.arch = MOE_ARCH_SM80;
    else
        return moe_fail(MOE_ERR_ARCH, "GPU %d has compute capability %d.%d; moegen builds kernels for sm_80 (8.x) and "
                        "sm_90a (9.0)", p->device, major, minor);
    int listed = 0;
    for (int i = 0; i < p->pd.spec.narch; i++)
        listed |= p->pd.spec.arch[i] == p->launcher.arch;
    if (!listed)
        return moe_fail(MOE_ERR_ARCH, "GPU %d is %s, which the spec's arch list does not name; add \"%s\" to arch",
                        p->device, moe_arch_name(p->launcher.arch), moe_arch_name(p->launcher.arch));
    CU_CHECK(moe_cu.cuDevicePrimaryCtxRetain(&p->ctx, dev));
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    return MOE_OK;
}

/* Kernel k's function in the plan's module, its shared memory limit raised
 * when it needs more than the default 48 KB. */
static moe_status load_kernel(moe_plan *p, const moe_kernel_desc_t *k, CUfunction *fn) {
    CUresult r = moe_cu.cuModuleGetFunction(fn, p->module, k->name);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "kernel '%s' is missing from the module: %s", k->name, moe_cu_error_string(r));
    if (k->smem > 48 * 1024)
        CU_CHECK(moe_cu.cuFuncSetAttribute(*fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->smem));
    return MOE_OK;
}

static moe_status load_module(moe_plan *p, const moe_buf_t *cubin) {
    size_t tbytes = sizeof(int) * (size_t)p->pd.spec.experts;
    CU_CHECK(moe_cu.cuMemAlloc(&p->launcher.slot_table, tbytes));
    CU_CHECK(moe_cu.cuMemcpyHtoD(p->launcher.slot_table, p->slot_host, tbytes));
    CU_CHECK(moe_cu.cuModuleLoadData(&p->module, cubin->data));
    moe_launcher_t *l = &p->launcher;
    l->pd = &p->pd;
    l->kernels = moe_plan_kernels(&p->pd, l->arch);
    l->slots = p->ep->mp->nheld;
    moe_status rc;
    for (int i = 0; i < MOE_K_COUNT; i++)
        if ((rc = load_kernel(p, &l->kernels[i], &l->fn[i])))
            return rc;
    /* the EP dispatch kernels, emitted when the plan has an EP part */
    const moe_ep_desc_t *ed = moe_plan_ep_desc(&p->pd);
    l->ep_kernels = ed ? ed->k : NULL;
    for (int i = 0; ed && i < MOE_EK_COUNT; i++)
        if ((rc = load_kernel(p, &ed->k[i], &l->ep_fn[i])))
            return rc;
    /* the cuDNN path's activation, emitted into every module since the
     * swiglu family; a folder compiled before it has none (the cuDNN up
     * stage then stays on the generated kernel) */
    l->swiglu = &p->pd.swiglu;
    if (moe_cu.cuModuleGetFunction(&l->swiglu_fn, p->module, l->swiglu->name) != CUDA_SUCCESS)
        l->swiglu_fn = NULL;
    return moe_ep_load(p->ep);
}

int moe_slots_identity(const int *slot, int n) {
    for (int i = 0; i < n; i++)
        if (slot[i] != i)
            return 0;
    return 1;
}

/* Spec -> plan tables, refusing what this runtime cannot run yet. The
 * GEMM tiles come from `table` when given, else from the option's table
 * file, else $MOEGEN_TUNING's, else the embedded one. */
static moe_status plan_tables(moe_plan *p, const char *path, const char *text, const moe_options *o,
                              const moe_tuning_t *table) {
    moe_spec_t spec;
    moe_diag_t d;
    if (moe_spec_load(&spec, path, text, NULL, 0, &d))
        return moe_fail(MOE_ERR_SPEC, "%s", d.msg);
    char err[512];
    const char *tpath = table ? NULL : o && o->tuning_path ? o->tuning_path : getenv("MOEGEN_TUNING");
    moe_tuning_t loaded;
    if (tpath && moe_tuning_load(&loaded, tpath, &d)) {
        moe_tuning_free(&loaded);
        return moe_fail(MOE_ERR_INVALID_ARG, "%s (the tuning table of %s)", d.msg,
                        o && o->tuning_path ? "moe_options.tuning_path" : "MOEGEN_TUNING");
    }
    if (!table)
        table = tpath ? &loaded : moe_tuning_default();
    int bad = moe_plan_desc_build(&p->pd, &spec, table, err, sizeof err);
    if (!bad && p->pd.tuned) {
        p->tuned = *p->pd.tuned;
        p->pd.tuned = &p->tuned;
    }
    if (tpath)
        moe_tuning_free(&loaded);
    if (bad)
        return moe_fail(MOE_ERR_SPEC, "%s: error: %s", path, err);
    moe_status rc = moe_ep_create(&p->ep, &p->pd, o ? o->rank : 0, err, sizeof err);
    if (rc)
        return moe_fail(rc, rc == MOE_ERR_SPEC ? "%s: error: %s" : "%s: %s", path, err);
    p->slot_host = malloc(sizeof(int) * (size_t)spec.experts);
    if (!p->slot_host)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    memcpy(p->slot_host, p->pd.mesh.slot, sizeof(int) * (size_t)spec.experts);
    p->launcher.slot_identity = moe_slots_identity(p->slot_host, spec.experts);
    int cudnn_mode; /* checked here, before any device work; decided in moe_cudnn_setup */
    return moe_cudnn_resolve_mode(o, &cudnn_mode, NULL, 0);
}

/* A mesh of several devices needs the caller's communicator and NCCL (or
 * is unconnected: the caller moves the data between the ranks' plans, as
 * the one-GPU tests of several ranks do); checked before any device work. */
static moe_status check_mesh(moe_plan *p, const moe_options *o, int unconnected) {
    if (p->ep->mp->world == 1 && (!o || !o->nccl_comm))
        return MOE_OK; /* a communicator given for a mesh of one is still checked */
    p->ep->unconnected = unconnected;
    if (unconnected)
        return MOE_OK;
    if (!o || !o->nccl_comm)
        return moe_fail(MOE_ERR_INVALID_ARG, "the mesh has %d devices: moe_options.nccl_comm must be the NCCL "
                        "communicator over all of them", p->ep->mp->world);
    char why[512];
    if (moe_nccl_load(why, sizeof why))
        return moe_fail(MOE_ERR_UNSUPPORTED, "the mesh has %d devices and needs NCCL, which did not load: %s",
                        p->ep->mp->world, why);
    return MOE_OK;
}

static moe_status connect_mesh(moe_plan *p, const moe_options *o) {
    if (p->ep->unconnected || !o || !o->nccl_comm)
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
    moe_clear_error();
    return MOE_OK;
}

static moe_status plan_create(moe_plan **out, const char *spec_path, const char *text, const moe_options *o,
                              int unconnected, const moe_tuning_t *table) {
    if (!out)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create: plan is NULL");
    *out = NULL;
    if (!spec_path)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create: spec_path is NULL");
    moe_plan *p = calloc(1, sizeof *p);
    if (!p)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status s = plan_tables(p, spec_path, text, o, table);
    if (s == MOE_OK)
        s = check_mesh(p, o, unconnected);
    if (s == MOE_OK)
        s = open_device(p, o);
    if (s == MOE_OK)
        s = connect_mesh(p, o);
    if (s == MOE_OK) {
        moe_buf_t cubin = {0};
        moe_diag_t d;
        if (moe_cache_cubin(&p->pd, o ? o->templates_dir : NULL, p->launcher.arch, o ? o->cache_dir : NULL, &cubin,
                            &p->cache_hit, &d))
            s = moe_fail(MOE_ERR_COMPILE, "%s", d.msg);
        else
            s = load_module(p, &cubin);
        moe_buf_free(&cubin);
    }
    if (s == MOE_OK)
        s = moe_cudnn_setup(&p->cudnn, &p->launcher, p->ep->mp->world, o);
    return create_common(out, p, s);
}

moe_status moe_plan_create(moe_plan **out, const char *spec_path, const moe_options *o) {
    return plan_create(out, spec_path, NULL, o, 0, NULL);
}

moe_status moe_plan_create_text(moe_plan **out, const char *name, const char *text, const moe_options *o) {
    if (!text)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create_text: text is NULL");
    return plan_create(out, name, text, o, 0, NULL);
}

moe_status moe_plan_create_tuned(moe_plan **out, const char *name, const char *text, const moe_options *o,
                                 const moe_tuning_t *table) {
    return plan_create(out, name, text, o, 0, table);
}

moe_status moe_plan_create_unconnected(moe_plan **out, const char *spec_path, const moe_options *o) {
    return plan_create(out, spec_path, NULL, o, 1, NULL);
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
                return moe_fail(MOE_ERR_IO, "%s: the folder's %s GEMMs are not the ones this runtime plans, %s (the "
                                "tuning table decides their tiles); compile the folder with the same table (moegen "
                                "--tuning FILE or MOEGEN_TUNING) or pass that table as moe_options.tuning_path",
                                mpath, moe_arch_name(s->arch[a]), want);
        }
    return MOE_OK;
}

moe_status moe_plan_create_from_dir(moe_plan **out, const char *dir, const moe_options *o) {
    if (!out)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: plan is NULL");
    *out = NULL;
    if (!dir)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: dir is NULL");
    /* the folder's one NAME.moe names everything else */
    char mpath[4200], err[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    char *manifest = moe_read_file(mpath, 64u << 20, NULL, err, sizeof err);
    if (!manifest)
        return moe_fail(MOE_ERR_IO, "%s", err);
    const char *key = strstr(manifest, "\"name\": \"");
    char name[MOE_NAME_MAX] = "";
    if (key)
        sscanf(key + 9, "%63[A-Za-z0-9_]", name);
    if (!name[0]) {
        free(manifest);
        return moe_fail(MOE_ERR_IO, "%s: no \"name\" in the manifest", mpath);
    }
    moe_plan *p = calloc(1, sizeof *p);
    if (!p) {
        free(manifest);
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    }
    char spath[4200];
    snprintf(spath, sizeof spath, "%s/%s.moe", dir, name);
    moe_status s = plan_tables(p, spath, NULL, o, NULL);
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
        snprintf(cpath, sizeof cpath, "%s/%s.%s.cubin", dir, name, moe_arch_name(p->launcher.arch));
        size_t len;
        char *data = moe_read_file(cpath, 1u << 30, &len, err, sizeof err);
        if (!data) {
            s = moe_fail(MOE_ERR_IO, "%s (compile the spec with arch %s to run on this GPU)", err,
                         moe_arch_name(p->launcher.arch));
        } else {
            moe_buf_t cubin = {data, len, len + 1, 0};
            s = load_module(p, &cubin);
            free(data);
        }
    }
    if (s == MOE_OK)
        s = moe_cudnn_setup(&p->cudnn, &p->launcher, p->ep->mp->world, o);
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
    if (p->launcher.slot_table)
        moe_cu.cuMemFree(p->launcher.slot_table);
    moe_ep_destroy(p->ep);
    moe_plan_desc_free(&p->pd);
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
    return p->ep->dispatch ? p->ep->ed->ws_bytes : p->pd.ws_bytes + moe_cudnn_workspace(p->cudnn);
}

moe_status moe_plan_workspace_region(const moe_plan *p, const char *name, size_t *offset, size_t *bytes) {
    if (!p || !name)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_workspace_region: NULL argument");
    const moe_ws_region_t *ws = p->ep->dispatch ? p->ep->ed->ws : p->pd.ws;
    int n = p->ep->dispatch ? MOE_EW_COUNT : MOE_WS_COUNT;
    for (int i = 0; i < n; i++)
        if (strcmp(ws[i].name, name) == 0) {
            if (offset)
                *offset = ws[i].offset;
            if (bytes)
                *bytes = ws[i].bytes;
            return MOE_OK;
        }
    return moe_fail(MOE_ERR_INVALID_ARG, "no workspace region '%s'", name);
}

moe_status moe_plan_pack_w1(const moe_plan *p, const uint16_t *w1, uint16_t *w1p) {
    if (!p || !w1 || !w1p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_w1: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    long long F2 = 2LL * s->ffn, H = s->hidden;
    for (long long e = 0; e < s->experts; e++)
        for (long long r = 0; r < F2; r++)
            memcpy(w1p + (e * F2 + moe_plan_packed_row(&p->pd, r)) * H, w1 + (e * F2 + r) * H, (size_t)H * 2);
    return MOE_OK;
}

moe_status moe_plan_pack_b1(const moe_plan *p, const uint16_t *b1, uint16_t *b1p) {
    if (!p || !b1 || !b1p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_pack_b1: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    long long F2 = 2LL * s->ffn;
    for (long long e = 0; e < s->experts; e++)
        for (long long r = 0; r < F2; r++)
            b1p[e * F2 + moe_plan_packed_row(&p->pd, r)] = b1[e * F2 + r];
    return MOE_OK;
}

moe_status moe_plan_stage_path(const moe_plan *p, int stage, int *path, const char **why) {
    if (!p || stage < 0 || stage >= MOE_STAGE_COUNT)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_stage_path: %s", p ? "no such stage" : "plan is NULL");
    const char *w;
    int at = moe_cudnn_stage_path(p->cudnn, stage, &w);
    if (at == MOE_PATH_CUDNN && !p->launcher.slot_identity) {
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

moe_status moe_plan_set_slot_table(moe_plan *p, const int *slot_of) {
    if (!p || !slot_of)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_set_slot_table: NULL argument");
    int E = p->pd.spec.experts;
    char *seen = calloc((size_t)E, 1);
    if (!seen)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    for (int e = 0; e < E; e++) {
        if (slot_of[e] < 0 || slot_of[e] >= E || seen[slot_of[e]]) {
            free(seen);
            return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_set_slot_table: slot_of[%d] = %d: not a permutation of 0..%d",
                            e, slot_of[e], E - 1);
        }
        seen[slot_of[e]] = 1;
    }
    free(seen);
    memcpy(p->slot_host, slot_of, sizeof(int) * (size_t)E);
    p->launcher.slot_identity = moe_slots_identity(slot_of, E);
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    CU_CHECK(moe_cu.cuMemcpyHtoD(p->launcher.slot_table, slot_of, sizeof(int) * (size_t)E));
    return MOE_OK;
}

moe_status moe_plan_get_info(const moe_plan *p, moe_plan_info *info) {
    if (!p || !info)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_get_info: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    *info = (moe_plan_info){.name = s->name, .hash = s->hash, .arch = moe_arch_name(p->launcher.arch),
                            .experts = s->experts, .top_k = s->top_k, .hidden = s->hidden, .ffn = s->ffn,
                            .tokens = s->tokens, .dtype_bytes = 2, .align = p->pd.align, .cache_hit = p->cache_hit,
                            .world = p->ep->mp->world, .rank = p->ep->rank, .ep = p->ep->mp->size[MOE_AXIS_EP],
                            .ep_rank = p->ep->me->ep_rank, .fsdp = p->ep->mp->size[MOE_AXIS_FSDP],
                            .fsdp_rank = p->ep->me->fsdp_rank, .stored = p->ep->mp->nstored,
                            .held = p->ep->mp->nheld, .dispatch_capacity = p->ep->ed->capacity,
                            .cudnn_version = moe_cudnn_version(p->cudnn)};
    for (int i = 0; i < MOE_K_COUNT; i++)
        info->kernels[i] = p->launcher.kernels[i].name;
    return MOE_OK;
}
