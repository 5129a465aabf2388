/* moe_plan.c — plan creation (from a spec or a compiled folder), the
 * device and module it loads, destruction, and the plan's queries. */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "cache.h"
#include "compile.h"
#include "cudnn.h"
#include "emit.h"
#include "ep.h"
#include "error.h"
#include "launch_geom.h"
#include "mesh.h"
#include "spec.h"
#include "util.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Driver, device and arch: the checks that must pass before any compile. */
static int variant_pdl(const moe_plan *p, int v);

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
    /* MOEGEN_ARCH=sm_80: the sm_80 kernels on a 9.0 GPU too (mma.sync and cp.async run there), compiled to
     * compute_80 PTX that the driver compiles for the device, so the sm_80 path runs and is checked where no
     * 8.x GPU is at hand; MOEGEN_ARCH=sm_90a: the default on a 9.0 GPU */
    const char *force = getenv("MOEGEN_ARCH");
    if (force && *force) {
        if (strcmp(force, "sm_80") == 0)
            p->launcher.arch = MOE_ARCH_SM80, p->ptx_jit = major != 8;
        else if (strcmp(force, "sm_90a") != 0)
            return moe_fail(MOE_ERR_INVALID_ARG, "MOEGEN_ARCH=%s: expected sm_80 or sm_90a", force);
        else if (p->launcher.arch != MOE_ARCH_SM90A)
            return moe_fail(MOE_ERR_ARCH, "MOEGEN_ARCH=sm_90a: GPU %d has compute capability %d.%d; sm_90a needs 9.0",
                            p->device, major, minor);
    }
    int listed = 0;
    for (int i = 0; i < p->pd.spec.narch; i++)
        listed |= p->pd.spec.arch[i] == p->launcher.arch;
    if (!listed)
        return moe_fail(MOE_ERR_ARCH, "GPU %d is %s, which the spec's arch list does not name; add \"%s\" to arch",
                        p->device, moe_arch_name(p->launcher.arch), moe_arch_name(p->launcher.arch));
    if (p->launcher.arch != MOE_ARCH_SM90A) /* griddepcontrol is sm_90's; the sm_80 kernels' moe_pdl_begin is empty */
        p->pdl = 0;
    p->launcher.pdl = variant_pdl(p, p->pd.nvariants - 1);
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
    if (k->tile.cluster) { /* CTA pairs (its __cluster_dims__): as many as can be resident size its grid */
        const CUlaunchConfig cfg = {.gridDimX = 2 * (unsigned)(p->launcher.sms > 0 ? p->launcher.sms : 2),
                                    .gridDimY = 1, .gridDimZ = 1, .blockDimX = (unsigned)k->threads, .blockDimY = 1,
                                    .blockDimZ = 1, .sharedMemBytes = (unsigned)k->smem};
        int n = 0;
        CU_CHECK(moe_cu.cuOccupancyMaxActiveClusters(&n, *fn, &cfg));
        if (n < 1)
            return moe_fail(MOE_ERR_CUDA, "kernel '%s': no pair of its CTAs fits on the device", k->name);
        if (p->launcher.clusters == 0 || n < p->launcher.clusters)
            p->launcher.clusters = n;
    }
    return MOE_OK;
}

static moe_status load_module(moe_plan *p, const moe_buf_t *cubin) {
    size_t tbytes = sizeof(int) * (size_t)moe_spec_slots(&p->pd.spec);
    CU_CHECK(moe_cu.cuMemAlloc(&p->launcher.slot_table, tbytes));
    CU_CHECK(moe_cu.cuMemcpyHtoD(p->launcher.slot_table, p->slot_host, tbytes));
    CU_CHECK(moe_cu.cuModuleLoadData(&p->module, cubin->data));
    moe_launcher_t *l = &p->launcher;
    l->pd = &p->pd;
    l->kernels = moe_plan_kernels(&p->pd, l->arch);
    l->align = p->pd.align;
    l->slots = p->ep->mp->nheld + moe_spec_shared_slots(&p->pd.spec); /* the shared expert's slots after them */
    moe_status rc;
    for (int i = 0; i < MOE_K_COUNT; i++)
        if ((rc = load_kernel(p, &l->kernels[i], &l->fn[i])))
            return rc;
    /* each variant's kernels (gen/plan.h), those of the capacity's already loaded */
    for (int v = 0; v < p->pd.nvariants; v++)
        for (int i = 0; i < MOE_K_COUNT; i++) {
            const moe_kernel_desc_t *k = &p->pd.variants[v].kernels[l->arch][i];
            if (strcmp(k->name, l->kernels[i].name) == 0)
                p->vfn[v][i] = l->fn[i];
            else if ((rc = load_kernel(p, k, &p->vfn[v][i])))
                return rc;
        }
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
    /* the device-side weight pack, likewise (moe_plan_pack_async refuses without it) */
    l->pack = &p->pd.pack;
    if (moe_cu.cuModuleGetFunction(&l->pack_fn, p->module, l->pack->name) != CUDA_SUCCESS)
        l->pack_fn = NULL;
    if (moe_spec_fp8(&p->pd.spec)) { /* the fp8 packs beside it */
        static const char *const suffix[3] = {"_e4m3", "_scales", "_quantize"};
        CUfunction *fns[3] = {&l->pack8_fn, &l->scales_fn, &l->quantize_fn};
        for (int i = 0; i < 3; i++) {
            char name[300];
            snprintf(name, sizeof name, "%s%s", l->pack->name, suffix[i]);
            if (moe_cu.cuModuleGetFunction(fns[i], p->module, name) != CUDA_SUCCESS)
                *fns[i] = NULL;
        }
    }
    /* the backward's own kernels, planned and emitted only for a training spec */
    l->bwd = p->pd.has_bwd ? p->pd.bwd : NULL;
    for (int i = 0; l->bwd && i < MOE_BK_COUNT; i++) {
        if ((i == MOE_K_BWD_SLOT_ROWS - MOE_K_BWD_FIRST || i == MOE_K_BWD_ESCALE - MOE_K_BWD_FIRST) &&
            /* a folder compiled before it: the EP backward, or a backward with expert scales, refuses */
            moe_cu.cuModuleGetFunction(&l->bwd_fn[i], p->module, l->bwd[i].name) != CUDA_SUCCESS) {
            l->bwd_fn[i] = NULL;
            continue;
        }
        if ((rc = load_kernel(p, &l->bwd[i], &l->bwd_fn[i])))
            return rc;
    }
    /* the backward GEMMs with training = true, likewise (moe_bgemm_launch refuses without them) */
    l->bgemm = moe_plan_bgemm(&p->pd, l->arch);
    for (int i = 0; l->bgemm && i < MOE_BGEMM_COUNT; i++) {
        if (moe_cu.cuModuleGetFunction(&l->bgemm_fn[i], p->module, l->bgemm[i].name) != CUDA_SUCCESS)
            l->bgemm_fn[i] = NULL;
        else if (l->bgemm[i].smem > 48 * 1024)
            CU_CHECK(moe_cu.cuFuncSetAttribute(l->bgemm_fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                               l->bgemm[i].smem));
    }
    return moe_ep_load(p->ep);
}

/* MOEGEN_ARCH=sm_80 on a newer GPU: the plan's source compiled here for
 * sm_80 (no disk cache: the PTX is made and loaded in this process), its
 * compute_80 PTX loaded, which the driver compiles for the device. */
static moe_status load_ptx(moe_plan *p, const char *templates_dir) {
    moe_buf_t src = {0}, cubin = {0}, ptx = {0};
    moe_diag_t d;
    char name[128];
    snprintf(name, sizeof name, "%s.cu", p->pd.spec.name);
    moe_status s = MOE_OK;
    if (moe_emit_source(&p->pd, templates_dir, &src, &d) ||
        moe_nvrtc_compile(src.data, name, MOE_ARCH_SM80, &cubin, &ptx, NULL, &d))
        s = moe_fail(MOE_ERR_COMPILE, "%s", d.msg);
    else /* moe_buf_t keeps its text NUL-terminated, as the driver reads PTX */
        s = !ptx.len || ptx.failed ? moe_fail(MOE_ERR_COMPILE, "MOEGEN_ARCH=sm_80: NVRTC gave no PTX for %s", name)
                                   : load_module(p, &ptx);
    moe_buf_free(&src);
    moe_buf_free(&cubin);
    moe_buf_free(&ptx);
    return s;
}

/* Whether variant v's calls launch as programmatic dependents: MOEGEN_PDL's on / off, else (auto) the variant's
 * tuning entry's +pdl. */
static int variant_pdl(const moe_plan *p, int v) {
    return p->pdl == 1 || (p->pdl == 2 && p->pd.variants[v].pdl);
}

/* The variant a forward (train: a training forward) of `tokens` runs. */
static int variant_run(const moe_plan *p, int tokens, int train) {
    const int v = moe_plan_pick_variant(&p->pd, tokens), last = p->pd.nvariants - 1;
    if (p->ep->dispatch || moe_cudnn_workspace(p->cudnn) > 0 || (train && p->pd.variants[v].align != p->pd.align))
        return last;
    return v;
}

void moe_plan_launcher_for(const moe_plan *p, int tokens, int train, moe_launcher_t *l) {
    *l = p->launcher;
    const int v = variant_run(p, tokens, train);
    if (v == p->pd.nvariants - 1)
        return;
    l->kernels = p->pd.variants[v].kernels[l->arch];
    l->align = p->pd.variants[v].align;
    l->pdl = variant_pdl(p, v);
    memcpy(l->fn, p->vfn[v], sizeof l->fn);
}

int moe_slots_identity(const int *slot, int n) {
    for (int i = 0; i < n; i++)
        if (slot[i] != i)
            return 0;
    return 1;
}

/* An on/off switch from the environment (empty or unset: dflt) into *on;
 * anything else fails the plan, naming the variable. */
static moe_status env_switch(const char *var, int dflt, int *on) {
    const char *v = getenv(var);
    if (v && *v && strcmp(v, "on") && strcmp(v, "off"))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s=%s: expected on or off", var, v);
    *on = v && *v ? !strcmp(v, "on") : dflt;
    return MOE_OK;
}

/* An off / on / auto switch from the environment into *mode: 0 off, 1 on, 2 auto (also empty or unset);
 * anything else fails the plan, naming the variable. */
static moe_status env_mode(const char *var, int *mode) {
    const char *v = getenv(var);
    if (v && *v && strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto"))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s=%s: expected on, off or auto", var, v);
    *mode = !v || !*v || !strcmp(v, "auto") ? 2 : !strcmp(v, "on");
    return MOE_OK;
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
    const char *env = getenv("MOEGEN_TUNING"); /* empty is unset, as for moegen */
    const char *tpath = table ? NULL : o && o->tuning_path ? o->tuning_path : env && *env ? env : NULL;
    moe_tuning_t loaded;
    if (tpath && moe_tuning_load(&loaded, tpath, &d)) {
        moe_tuning_free(&loaded);
        return moe_fail(MOE_ERR_INVALID_ARG, "%s (the tuning table of %s)", d.msg,
                        o && o->tuning_path ? "moe_options.tuning_path" : "MOEGEN_TUNING");
    }
    if (!table)
        table = tpath ? &loaded : moe_tuning_default();
    int bad = moe_plan_desc_build(&p->pd, &spec, table, err, sizeof err);
    for (int v = 0; !bad && v < p->pd.nvariants; v++)
        if (p->pd.variants[v].tuned) {
            p->vtuned[v] = *p->pd.variants[v].tuned;
            p->pd.variants[v].tuned = &p->vtuned[v];
        }
    if (!bad) /* the capacity's entry is the last variant's */
        p->pd.tuned = p->pd.variants[p->pd.nvariants - 1].tuned;
    if (tpath)
        moe_tuning_free(&loaded);
    if (bad) {
        char msg[1200];
        moe_spec_error_at(&spec, path, err, msg, sizeof msg);
        return moe_fail(MOE_ERR_SPEC, "%s", msg);
    }
    moe_status rc = moe_ep_create(&p->ep, &p->pd, o ? o->rank : 0, err, sizeof err);
    if (rc)
        return moe_fail(rc, rc == MOE_ERR_SPEC ? "%s: error: %s" : "%s: %s", path, err);
    /* the routing table, then the shared expert's slots at their own index
     * (slots E .. E+m-1; the spec check keeps a shared expert on one device) */
    p->slot_host = malloc(sizeof(int) * (size_t)moe_spec_slots(&spec));
    if (!p->slot_host)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    memcpy(p->slot_host, p->pd.mesh.slot, sizeof(int) * (size_t)spec.experts);
    for (int e = spec.experts; e < moe_spec_slots(&spec); e++)
        p->slot_host[e] = e;
    p->launcher.slot_identity = moe_slots_identity(p->slot_host, spec.experts);
    /* the fused route (moe_plan_route_fuse): on unless MOEGEN_ROUTE_FUSE=off; the combine folded into a gemv
     * down GEMM: off unless MOEGEN_COMBINE_FUSE=on (slower on the H200 at every size timed: docs/PERF.md);
     * neither with a dispatch between ranks */
    /* launch overlap (docs/DESIGN.md, "Launch overlap"): MOEGEN_PDL, auto the variants' tuning entries, sm_90a
     * only (open_device); the gathered up GEMM (runtime/moe_forward.c): MOEGEN_GATHER */
    if ((rc = env_switch("MOEGEN_ROUTE_FUSE", 1, &p->route_fuse)) ||
        (rc = env_switch("MOEGEN_COMBINE_FUSE", 0, &p->combine_fuse)) || (rc = env_mode("MOEGEN_PDL", &p->pdl)) ||
        (rc = env_mode("MOEGEN_GATHER", &p->gather)))
        return rc;
    p->route_fuse &= !p->ep->dispatch;
    /* nor with zero experts: a call whose entries all chose one has no tile, and the folded combine runs in
     * the CTAs of the tiles (docs/DESIGN.md, "Zero experts") */
    p->combine_fuse &= !p->ep->dispatch && !spec.zero_experts;
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

/* A JIT plan compiles with NVRTC (and its cache key holds NVRTC's
 * version), loaded here on first use: checked before any device work. */
static moe_status need_nvrtc(void) {
    char why[600];
    if (moe_nvrtc_load(why, sizeof why))
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s; moe_plan_create compiles the kernels with NVRTC (the CUDA "
                        "toolkit's libnvrtc): install it, or load a folder written by moegen compile with "
                        "moe_plan_create_from_dir, which needs no NVRTC", why);
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
    moe_options opts; /* the caller's, whatever moe.h it was built with */
    if (o) {
        moe_status rs = moe_struct_in(&opts, sizeof opts, MOE_OPTIONS_V1_SIZE, o, "moe_options");
        if (rs)
            return rs;
        o = &opts;
    }
    moe_plan *p = calloc(1, sizeof *p);
    if (!p)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status s = plan_tables(p, spec_path, text, o, table);
    if (s == MOE_OK)
        s = check_mesh(p, o, unconnected);
    if (s == MOE_OK)
        s = need_nvrtc();
    if (s == MOE_OK)
        s = open_device(p, o);
    if (s == MOE_OK)
        s = connect_mesh(p, o);
    if (s == MOE_OK && p->ptx_jit)
        s = load_ptx(p, o ? o->templates_dir : NULL);
    else if (s == MOE_OK) {
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

/* The manifest (manifest.json, written by gen/emit.c) parsed with jansson:
 * any valid JSON object with the keys the loader needs reads the same,
 * however it is spaced or ordered; malformed JSON, duplicate keys and a
 * non-object are refused naming the file, line and column. On MOE_OK *root
 * holds a reference the caller drops with json_decref. */
static moe_status manifest_load(const char *text, size_t len, const char *mpath, json_t **root) {
    json_error_t je;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!*root)
        return moe_fail(MOE_ERR_IO, "%s:%d:%d: error: the manifest is not valid JSON: %s; compile the spec again "
                        "into the folder (moegen compile)", mpath, je.line, je.column, je.text);
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return moe_fail(MOE_ERR_IO, "%s: error: the manifest is not a JSON object", mpath);
    }
    return MOE_OK;
}

/* The string value of obj's `key` when it is a name, hash or file name the
 * loader may use in a path (letters, digits, '_', '.', '-'; not empty,
 * shorter than n) copied into out; 0, or -1 when absent or not such a
 * string. */
static int manifest_name(const json_t *obj, const char *key, char *out, size_t n) {
    const char *v = json_string_value(json_object_get(obj, key));
    size_t len = v ? json_string_length(json_object_get(obj, key)) : 0;
    if (!v || len == 0 || len >= n)
        return -1;
    for (size_t i = 0; i < len; i++)
        if (!(isalnum((unsigned char)v[i]) || v[i] == '_' || v[i] == '.' || v[i] == '-'))
            return -1;
    memcpy(out, v, len + 1);
    return 0;
}

/* Whether array `arr` lists kernel `name`: an element that is the string,
 * or an object whose "name" is. */
static int manifest_lists(const json_t *arr, const char *name) {
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v) {
        const char *n = json_is_object(v) ? json_string_value(json_object_get(v, "name")) : json_string_value(v);
        if (n && strcmp(n, name) == 0)
            return 1;
    }
    return 0;
}

/* A compiled folder is the spec that NAME.moe holds, planned again: the
 * manifest must record that spec's hash (NAME.moe edited, or emitted by
 * another run, is refused) and every kernel this runtime plans for each
 * arch, the forward's (under "kernels": {ARCH: [{"name": ...}]}) and the EP
 * dispatch's (under "dispatch": {"kernels": [...]}); the tuning table
 * decides the GEMM tiles, which the names spell. */
static moe_status same_plan(const moe_plan *p, const json_t *manifest, const char *mpath, const char *spath) {
    const moe_spec_t *s = &p->pd.spec;
    char hash[64];
    if (manifest_name(manifest, "hash", hash, sizeof hash))
        return moe_fail(MOE_ERR_IO, "%s: no spec \"hash\" in the manifest", mpath);
    if (strcmp(hash, s->hash) != 0)
        return moe_fail(MOE_ERR_IO, "%s: the spec (hash %s) is not the one the manifest %s records (hash %s): the "
                        "folder was edited or written by several runs; compile the spec again into it (moegen "
                        "compile)", spath, s->hash, mpath, hash);
    const moe_ep_desc_t *ed = moe_plan_ep_desc(&p->pd);
    const json_t *kernels = json_object_get(manifest, "kernels");
    const json_t *ep_kernels = json_object_get(json_object_get(manifest, "dispatch"), "kernels");
    for (int a = 0; a < s->narch; a++) {
        const moe_kernel_desc_t *ks = moe_plan_kernels(&p->pd, s->arch[a]);
        const json_t *listed = json_object_get(kernels, moe_arch_name(s->arch[a]));
        int n = MOE_K_COUNT + (ed ? MOE_EK_COUNT : 0);
        for (int i = 0; i < n; i++) {
            const char *want = i < MOE_K_COUNT ? ks[i].name : ed->k[i - MOE_K_COUNT].name;
            if (manifest_lists(i < MOE_K_COUNT ? listed : ep_kernels, want))
                continue;
            int gemm = i == MOE_K_GEMM_UP || i == MOE_K_GEMM_DOWN;
            return moe_fail(MOE_ERR_IO, "%s: the folder's %s kernels are not the ones this runtime plans, %s%s",
                            mpath, moe_arch_name(s->arch[a]), want,
                            gemm ? " (the tuning table decides their tiles); compile the folder with the same table "
                                   "(moegen --tuning FILE or MOEGEN_TUNING) or pass that table as "
                                   "moe_options.tuning_path"
                                 : "; compile the spec again into it (moegen compile)");
        }
        for (int v = 0; v < p->pd.nvariants; v++) /* every GEMM variant's kernels (gen/plan.h) */
            for (int i = 0; i < MOE_K_COUNT; i++) {
                const char *want = p->pd.variants[v].kernels[s->arch[a]][i].name;
                if (!manifest_lists(listed, want))
                    return moe_fail(MOE_ERR_IO, "%s: the folder's %s kernels are not the ones this runtime plans, %s "
                                    "(a GEMM variant for calls of %d tokens and more; the tuning table decides "
                                    "them); compile the folder with the same table (moegen --tuning FILE or "
                                    "MOEGEN_TUNING) or pass that table as moe_options.tuning_path", mpath,
                                    moe_arch_name(s->arch[a]), want, p->pd.variants[v].bucket);
            }
    }
    return MOE_OK;
}

/* Every arch's cubin, read and checked against the size and XXH3-128 the
 * manifest records ("cubins": {ARCH: {"bytes": N, "xxh3": "..."}}) before
 * the driver sees any of it: a truncated or edited cubin, or a folder that
 * moegen emit wrote (no cubins listed), is refused naming the file. On
 * MOE_OK, cubins[a] holds arch a's bytes. */
static moe_status read_cubins(const moe_plan *p, const json_t *manifest, const char *dir, const char *mpath,
                              moe_buf_t cubins[MOE_ARCH_MAX]) {
    const moe_spec_t *s = &p->pd.spec;
    const json_t *obj = json_object_get(manifest, "cubins");
    if (!json_is_object(obj))
        return moe_fail(MOE_ERR_IO, "%s: no \"cubins\" in the manifest: the folder was not written by this "
                        "moegen's compile; compile the spec into it (moegen compile)", mpath);
    for (int a = 0; a < s->narch; a++) {
        const char *arch = moe_arch_name(s->arch[a]);
        char cpath[4200], err[512], want[64];
        snprintf(cpath, sizeof cpath, "%s/%s.%s.cubin", dir, s->name, arch);
        const json_t *e = json_object_get(obj, arch);
        if (!json_is_object(e))
            return moe_fail(MOE_ERR_IO, "%s: the manifest lists no compiled cubin for %s (moegen emit writes none, "
                            "and leaves older cubins unlisted); compile the spec into the folder (moegen compile)",
                            mpath, arch);
        const json_t *bv = json_object_get(e, "bytes");
        if (!json_is_integer(bv) || json_integer_value(bv) < 0 || manifest_name(e, "xxh3", want, sizeof want))
            return moe_fail(MOE_ERR_IO, "%s: the cubin entry for %s has no \"bytes\" or \"xxh3\"", mpath, arch);
        long long bytes = json_integer_value(bv);
        size_t len;
        char *data = moe_read_file(cpath, 1u << 30, &len, err, sizeof err);
        if (!data)
            return moe_fail(MOE_ERR_IO, "%s", err);
        char got[33];
        moe_hash_hex(data, len, got);
        if (strcmp(got, want) != 0 || (unsigned long long)bytes != len) {
            free(data);
            return moe_fail(MOE_ERR_IO, "%s: the cubin is not the one the manifest records (%zu bytes, XXH3 %s; the "
                            "manifest says %lld bytes, %s): truncated or edited; compile the spec again into the "
                            "folder (moegen compile)", cpath, len, got, bytes, want);
        }
        /* the spec compiled into it (emit.c's NAME_moegen_spec) */
        char mark[64];
        size_t mlen = (size_t)snprintf(mark, sizeof mark, MOE_SPEC_MARK "%s", s->hash), at = 0;
        while (at + mlen <= len && memcmp(data + at, mark, mlen) != 0)
            at++;
        if (at + mlen > len) {
            free(data);
            return moe_fail(MOE_ERR_IO, "%s: the cubin was not compiled from this spec (hash %s, which it does not "
                            "hold); compile the spec again into the folder (moegen compile)", cpath, s->hash);
        }
        cubins[a] = (moe_buf_t){data, len, len + 1, 0};
    }
    return MOE_OK;
}

moe_status moe_plan_create_from_dir(moe_plan **out, const char *dir, const moe_options *o) {
    if (!out)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: plan is NULL");
    *out = NULL;
    if (!dir)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_create_from_dir: dir is NULL");
    moe_options opts; /* the caller's, whatever moe.h it was built with */
    if (o) {
        moe_status rs = moe_struct_in(&opts, sizeof opts, MOE_OPTIONS_V1_SIZE, o, "moe_options");
        if (rs)
            return rs;
        o = &opts;
    }
    /* the folder's one NAME.moe names everything else */
    char mpath[4200], err[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    size_t mlen;
    char *text = moe_read_file(mpath, 64u << 20, &mlen, err, sizeof err);
    if (!text)
        return moe_fail(MOE_ERR_IO, "%s", err);
    json_t *manifest;
    moe_status ms = manifest_load(text, mlen, mpath, &manifest);
    free(text);
    if (ms)
        return ms;
    char name[MOE_NAME_MAX] = "";
    if (manifest_name(manifest, "name", name, sizeof name)) {
        json_decref(manifest);
        return moe_fail(MOE_ERR_IO, "%s: no \"name\" in the manifest (a name of letters, digits, '_', '.', '-')",
                        mpath);
    }
    moe_plan *p = calloc(1, sizeof *p);
    if (!p) {
        json_decref(manifest);
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    }
    char spath[4200];
    snprintf(spath, sizeof spath, "%s/%s.moe", dir, name);
    moe_buf_t cubins[MOE_ARCH_MAX] = {{0}};
    moe_status s = plan_tables(p, spath, NULL, o, NULL);
    if (s == MOE_OK)
        s = same_plan(p, manifest, mpath, spath);
    if (s == MOE_OK)
        s = read_cubins(p, manifest, dir, mpath, cubins);
    json_decref(manifest);
    if (s == MOE_OK)
        s = check_mesh(p, o, 0);
    if (s == MOE_OK)
        s = open_device(p, o);
    if (s == MOE_OK)
        s = connect_mesh(p, o);
    if (s == MOE_OK && p->ptx_jit)
        s = moe_fail(MOE_ERR_ARCH, "%s: MOEGEN_ARCH=sm_80 on a GPU newer than 8.x compiles the sm_80 kernels from "
                     "the spec (moe_plan_create); a compiled folder's sm_80 cubin does not run there", dir);
    for (int a = 0; a < p->pd.spec.narch && s == MOE_OK; a++)
        if (p->pd.spec.arch[a] == p->launcher.arch) /* open_device refused an arch the spec does not list */
            s = load_module(p, &cubins[a]);
    for (int a = 0; a < MOE_ARCH_MAX; a++)
        moe_buf_free(&cubins[a]);
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

/* The workspace of a call of `tokens` tokens into r (MOE_EW_COUNT regions
 * or MOE_WS_COUNT); returns its bytes (the cuDNN path's extra after the
 * regions) and sets *n to the region count. */
static size_t ws_layout(const moe_plan *p, int tokens, moe_ws_region_t *r, int *n) {
    if (p->ep->dispatch) {
        *n = MOE_EW_COUNT;
        return moe_ep_ws_layout(p->ep->ed, &p->pd, tokens, r);
    }
    *n = MOE_WS_COUNT;
    size_t extra = moe_cudnn_workspace(p->cudnn); /* the cuDNN graphs span the capacity's rows */
    return moe_fwd_ws_layout(&p->pd, tokens, extra > 0, r) + extra;
}

size_t moe_plan_workspace_size(const moe_plan *p, int tokens) {
    if (!p || tokens < 0 || tokens > p->pd.spec.tokens)
        return 0;
    moe_ws_region_t r[(int)MOE_EW_COUNT > (int)MOE_WS_COUNT ? (int)MOE_EW_COUNT : (int)MOE_WS_COUNT];
    int n;
    return ws_layout(p, tokens, r, &n);
}

moe_status moe_plan_workspace_region_at(const moe_plan *p, int tokens, const char *name, size_t *offset,
                                        size_t *bytes) {
    if (!p || !name)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_workspace_region: NULL argument");
    if (tokens < 0 || tokens > p->pd.spec.tokens)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_workspace_region: tokens = %d is outside 0..%d", tokens,
                        p->pd.spec.tokens);
    moe_ws_region_t r[(int)MOE_EW_COUNT > (int)MOE_WS_COUNT ? (int)MOE_EW_COUNT : (int)MOE_WS_COUNT];
    int n;
    ws_layout(p, tokens, r, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(r[i].name, name) == 0) {
            if (offset)
                *offset = r[i].offset;
            if (bytes)
                *bytes = r[i].bytes;
            return MOE_OK;
        }
    return moe_fail(MOE_ERR_INVALID_ARG, "no workspace region '%s'", name);
}

moe_status moe_plan_workspace_region(const moe_plan *p, const char *name, size_t *offset, size_t *bytes) {
    return moe_plan_workspace_region_at(p, p ? p->pd.spec.tokens : 0, name, offset, bytes);
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

/* moe_plan_info.gather: MOEGEN_GATHER's mode (2 auto, 1 on) where some variant's up GEMM on this device
 * gathers (moe_gemm_gathers: not on an expert-parallel plan's, whose rows come from the peers; the last
 * variant's kernels are the launcher's), else 0. */
static int gather_mode(const moe_plan *p) {
    for (int v = 0; v < p->pd.nvariants; v++)
        if (moe_gemm_gathers(&p->pd.spec, &p->pd.variants[v].kernels[p->launcher.arch][MOE_K_GEMM_UP]))
            return p->gather;
    return 0;
}

/* moe_plan_info.pdl: MOEGEN_PDL's mode (1 on, 2 auto) where some variant's calls launch with overlap, else 0. */
static int pdl_mode(const moe_plan *p) {
    for (int v = 0; v < p->pd.nvariants; v++)
        if (variant_pdl(p, v))
            return p->pdl;
    return 0;
}

moe_status moe_plan_get_info(const moe_plan *p, moe_plan_info *info) {
    if (!p || !info)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_get_info: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    moe_plan_info full = {.struct_size = sizeof full, .name = s->name, .hash = s->hash, .arch = moe_arch_name(p->launcher.arch),
                            .experts = s->experts, .top_k = s->top_k, .hidden = s->hidden, .ffn = s->ffn,
                            .tokens = s->tokens, .dtype_bytes = 2, .align = p->pd.align, .cache_hit = p->cache_hit,
                            .world = p->ep->mp->world, .rank = p->ep->rank, .ep = p->ep->mp->size[MOE_AXIS_EP],
                            .ep_rank = p->ep->me->ep_rank, .fsdp = p->ep->mp->size[MOE_AXIS_FSDP],
                            .fsdp_rank = p->ep->me->fsdp_rank, .stored = p->ep->mp->nstored,
                            .held = p->ep->mp->nheld, .dispatch_capacity = p->ep->ed->capacity,
                            .cudnn_version = moe_cudnn_version(p->cudnn),
                            .gather_bytes = (long long)moe_ep_gather_bytes(p->ep->mp, s),
                            .route_fuse = p->route_fuse, .pdl = pdl_mode(p), .gather = gather_mode(p),
                            .pair_clusters = p->launcher.clusters,
                            .weight_grad_bytes = s->training ? moe_wgrad_elem_bytes(s) : 0};
    for (int i = 0; i < MOE_K_COUNT; i++)
        full.kernels[i] = p->launcher.kernels[i].name;
    for (int i = 0; p->launcher.bgemm && i < MOE_BGEMM_COUNT; i++)
        full.backward_kernels[i] = p->launcher.bgemm[i].name;
    /* only the bytes the caller's moe.h declares */
    return moe_struct_out(info, &full, sizeof full, MOE_PLAN_INFO_V1_SIZE, "moe_plan_info");
}

int moe_plan_variant_count(const moe_plan *p) {
    return p ? p->pd.nvariants : 0;
}

moe_status moe_plan_variant(const moe_plan *p, int i, int *bucket, int *align, const char **gemm_up,
                            const char **gemm_down) {
    if (!p)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_variant: NULL plan");
    if (i < 0 || i >= p->pd.nvariants)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_variant: variant %d of %d", i, p->pd.nvariants);
    const moe_plan_variant_t *v = &p->pd.variants[i];
    if (bucket)
        *bucket = v->bucket;
    if (align)
        *align = v->align;
    if (gemm_up)
        *gemm_up = v->kernels[p->launcher.arch][MOE_K_GEMM_UP].name;
    if (gemm_down)
        *gemm_down = v->kernels[p->launcher.arch][MOE_K_GEMM_DOWN].name;
    return MOE_OK;
}

_Static_assert(MOE_ROUTE_SEPARATE == MOE_ROUTE_FUSE_OFF && MOE_ROUTE_FUSED_PLAN == MOE_ROUTE_FUSE_PLAN &&
                   MOE_ROUTE_FUSED_SCATTER == MOE_ROUTE_FUSE_SCATTER, "moe.h's route paths are launch_geom.h's modes");

int moe_plan_route_fuse(const moe_plan *p, int tokens) {
    if (!p || tokens < 0 || tokens > p->pd.spec.tokens)
        return -1;
    if (!p->route_fuse)
        return MOE_ROUTE_SEPARATE;
    const moe_spec_t *s = &p->pd.spec;
    return moe_route_fuse_mode(tokens, moe_spec_entries(s), s->hidden, p->launcher.kernels[MOE_K_ROUTE].threads / 32,
                               moe_route_fuse_scatter(moe_spec_fp8(s), s->router.apply == MOE_APPLY_INPUT,
                                                      s->router.select == MOE_SELECT_GIVEN));
}

int moe_plan_pdl(const moe_plan *p, int tokens) {
    if (!p || tokens < 0 || tokens > p->pd.spec.tokens)
        return -1;
    return variant_pdl(p, variant_run(p, tokens, 0));
}

int moe_plan_variant_for(const moe_plan *p, int tokens) {
    if (!p || tokens < 0 || tokens > p->pd.spec.tokens)
        return -1;
    return variant_run(p, tokens, 0);
}
