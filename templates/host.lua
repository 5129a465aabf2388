@ -- host.lua — the vendored launcher: NAME_forward, the whole layer on one
@ -- device for plain nvcc builds (no libmoegen), and the host-side W1/b1
@ -- packing. gen/emit.c expands it after the kernels (the pack kernel's
@ -- template, templates/pack.lua, pasted gen/pack_geom.h before it); it emits nothing that
@ -- NVRTC sees (#ifndef __CUDACC_RTC__). Every number comes from the plan
@ -- through p (gen/emit.c, push_host_params): kernel names, block sizes,
@ -- shared memory, rows per block, workspace offsets, the N tiles of each
@ -- GEMM, the routing table.
@ --
@ -- p: the shared parameters (moe_plan_push_params: p.name, p.E, p.K,
@ -- p.H, p.F, p.align, p.pair_granule, p.bias, p.logit_bias, p.ffn_bias),
@ -- p.ep (the mesh's EP size), p.pack = {name, threads} (the pack kernel), p.slot[e + 1] (expert e's weight slot), p.ws[i] = {name, ctype, offset, bytes},
@ -- p.counts_bytes, p.sm80 / p.sm90 (the arch's kernel set, nil when the
@ -- spec lacks the arch): set[family] = {name, threads, smem, per_block,
@ -- bm, bn, persistent, splitk, gemv, K, N, ntiles (a GEMM's reduction length, B rows
@ -- per expert, N tiles)}, p.splitk_tickets_at (the split-K tickets' first int in counts), set[i] the same in family order; p.neutral: the
@ -- set the arch-neutral kernels come from; p.variants[i]: the GEMM variants
@ -- by bucket (gen/plan.h), each {bucket, align, sm80, sm90, neutral} (its
@ -- kernel sets; p.sm80, p.sm90, p.neutral and p.align are the last's, the
@ -- capacity's), a call of T tokens running the one with the largest
@ -- bucket <= T, or the first; p.launch_geom: the text of
@ -- gen/launch_geom.h, which the launcher calls for the grids, the tile count,
@ -- the TMA encoding and the sm_90a grid size (as the families and runtime do).
@ -- A shared expert (p.shared_slots > 0): the kernels after route see
@ -- p.slots weight slots and p.entries entries per token; its slots sit
@ -- after the routed experts' in the routing table (their own index).
@ -- fp8 expert weights (quant.weights = "fp8_e4m3", docs/DESIGN.md "FP8"):
@ -- the forward runs libmoegen's fp8 path (the quantizing scatter, the fp8
@ -- GEMMs on one-byte tensor maps with their scales, as runtime/moe_forward.c
@ -- and ffn.c launch them), and NAME_quantize / NAME_pack_fp8 launch the
@ -- pack kernel's fp8 siblings (templates/pack.lua).
@ local n = p.name
@ local fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
@ local k = p.neutral

#ifndef __CUDACC_RTC__
@ if p.sm90 then -- the sm_90a GEMM bodies need the arch-specific features
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "${n}.cu holds sm_90a kernels (wgmma, TMA): compile it for compute capability 9.0 with -gencode arch=compute_90a,code=sm_90a, not sm_90 (README, Vendoring)"
#endif
@ end
/* ---- host launch code (plain nvcc builds) ---- */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <mutex>
#include "${n}.h"

/* gen/launch_geom.h, verbatim: the launch facts the runtime shares */
#line 1 "gen/launch_geom.h"
${p.launch_geom}
@ -- (a template line, so the next output line gets its #line back)

/* The routing table: the slot of each expert's weights (manifest.json, "routing"). */
@ local slots = {}
@ for e = 0, p.slots - 1 do
@   slots[#slots + 1] = (e == 0 and "" or (e % 16 ~= 0 and ", " or ",\n    ")) .. (e < p.E and p.slot[e + 1] or e)
@ end
__device__ int ${n}_slot_table[${p.slots}] = {${table.concat(slots)}};

@ local nv = #p.variants
@ if nv == 1 then
static long long ${n}_max_tiles(int tokens) {
    return moe_max_tiles(tokens, ${p.entries}, ${p.slots}, ${p.align});
}
@ else
/* The GEMM variant a call of `tokens` tokens runs (manifest.json,
 * "variants"): the largest bucket <= tokens, or the first. A host value,
 * so a CUDA graph captured at T replays T's variant. */
static int ${n}_variant(int tokens) {
@   for i = nv, 2, -1 do
    if (tokens >= ${p.variants[i].bucket}) return ${i - 1};
@   end
    return 0;
}

/* The row block (GEMM bm) of each variant, and the M tiles of a call. */
@   local aligns = {}
@   for i = 1, nv do aligns[i] = p.variants[i].align end
static const int ${n}_variant_align[${nv}] = {${table.concat(aligns, ", ")}};
@   local pdls = {}
@   for i = 1, nv do pdls[i] = p.variants[i].pdl ~= 0 and "true" or "false" end
/* Whether each variant's calls launch with overlap (its tuning entry's +pdl) when MOEGEN_PDL is unset or auto. */
static const bool ${n}_variant_pdl[${nv}] = {${table.concat(pdls, ", ")}};

static long long ${n}_max_tiles(int tokens, int v) {
    return moe_max_tiles(tokens, ${p.entries}, ${p.slots}, ${n}_variant_align[v]);
}
@ end

@ if p.sm90 then -- the sm_90a GEMMs take their operands as TMA tensor maps
/* A 2D TMA tensor map over rows x k halves at base as the sm_90a GEMMs
 * load it (moe_tmap_geom). The driver's encoder comes through the runtime
 * (cudaGetDriverEntryPoint), so nothing links libcuda. */
#include <cuda.h>
static_assert(sizeof(moe_tmap_t) == sizeof(CUtensorMap), "moe_tmap_t is a CUtensorMap");
typedef CUresult (*${n}_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
    CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static cudaError_t ${n}_encoder(${n}_encode_fn *encode) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess)
        return e;
    if (q != cudaDriverEntryPointSuccess || !fn)
        return cudaErrorNotSupported;
    *encode = (${n}_encode_fn)fn;
    return cudaSuccess;
}

@   local geom, dtype = "moe_tmap_geom", "MOE_TMAP_DTYPE"
@   if fp8 then
@     geom, dtype = "moe_tmap_geom8", "MOE_TMAP_DTYPE8"
/* The fp8 GEMMs' operands are e4m3 bytes (moe_tmap_geom8: boxes of 128 elements). */
@   end
static cudaError_t ${n}_tmap(${n}_encode_fn encode, moe_tmap_t *m, const void *base, long long rows, long long k,
                           unsigned box_rows) {
    const moe_tmap_geom_t g = ${geom}(rows, k, box_rows);
    CUresult r = encode((CUtensorMap *)m, ${dtype}, 2, (void *)base, g.dim, g.stride, g.box, g.estride,
                        MOE_TMAP_INTERLEAVE, MOE_TMAP_SWIZZLE, MOE_TMAP_L2_PROMOTION, MOE_TMAP_OOB_FILL);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

@ end
@ local two = p.sm90 and p.sm80 and p.sm90.gemm_up_swiglu.name ~= p.sm80.gemm_up_swiglu.name
/* What the forward needs of the current device, found on the first call on
 * each device (one process may drive several GPUs; threads may make their
 * first calls at once: one fills the entry under the lock, then publishes
 * it; an entry that failed is tried again on the next call). */
#define ${n}_MAX_DEVICES 64
typedef struct {
    std::atomic<int> ready;
    int use90;      /* the sm_90a GEMMs: compute capability 9.x */
    int sms;        /* multiprocessors (the persistent GEMMs' grid) */
    int clusters;   /* CTA pairs of the "+mc" GEMMs resident at once (the fewest over them): their grid; 0 none */
    int *slot_of;   /* ${n}_slot_table's address on this device */
    int route_fuse; /* 0 with MOEGEN_ROUTE_FUSE=off (read on the first call): route, permute_plan and
                       permute_scatter always launched apart (moe_route_fuse_mode) */
    int pdl;        /* MOEGEN_PDL (read on the first call): 0 off, 1 on, 2 auto (unset): whether a forward's kernels
                       launch as programmatic dependents (${n}_launch): every call's, or those of the calls whose
                       variant's tuning entry says +pdl (${n}_variant_pdl); 0 without the sm_90a kernels (use90) */
    int combine_fuse; /* 1 with MOEGEN_COMBINE_FUSE=on (read on the first call): the combine folded into a gemv
                         down GEMM (moe_combine_fuse_tokens); else its own kernel */
    int gather;     /* MOEGEN_GATHER (read on the first call): 0 off, 1 on, 2 auto (unset): where the sm_90a up GEMM
                       gathers its rows from x (moe_gather_tokens under auto) */
@ if p.sm90 then
    ${n}_encode_fn encode;
@ end
} ${n}_device_t;
static ${n}_device_t ${n}_devices[${n}_MAX_DEVICES];
static std::mutex ${n}_devices_lock;

/* A switch from the environment, as the JIT runtime reads it: 0 off, 1 on, 2 auto (where `with_auto`), dflt
 * when empty or unset; -1 for any other value. */
static int ${n}_env_switch(const char *var, bool with_auto, int dflt) {
    const char *v = getenv(var);
    if (!v || !*v)
        return dflt;
    return !strcmp(v, "on") ? 1 : !strcmp(v, "off") ? 0 : with_auto && !strcmp(v, "auto") ? 2 : -1;
}

static cudaError_t ${n}_device_init(${n}_device_t *d, int dev) {
    int major = 0;
    cudaError_t e;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
        (e = cudaGetSymbolAddress((void **)&d->slot_of, ${n}_slot_table)) != cudaSuccess)
        return e;
    if ((d->route_fuse = ${n}_env_switch("MOEGEN_ROUTE_FUSE", false, 1)) < 0 ||
        (d->pdl = ${n}_env_switch("MOEGEN_PDL", true, 2)) < 0 ||
        (d->combine_fuse = ${n}_env_switch("MOEGEN_COMBINE_FUSE", false, 0)) < 0 ||
        (d->gather = ${n}_env_switch("MOEGEN_GATHER", true, 2)) < 0)
        return cudaErrorInvalidValue;
    if (major != 9)
        d->pdl = 0;
@ if (p.spec.zero_experts or 0) > 0 then
    d->combine_fuse = 0; /* zero experts: a call may have no tile, and the folded combine runs in the tiles' CTAs */
@ end
@ if two then
    d->use90 = major == 9;
@ else
    d->use90 = ${p.sm90 and 1 or 0};
@ end
    if (!d->use90) /* the sm_80 kernels' moe_pdl_begin is empty: they never launch with overlap (the runtime's rule) */
        d->pdl = 0;
@ if p.sm90 then
    if (d->use90 && (e = ${n}_encoder(&d->encode)) != cudaSuccess)
        return e;
@ end
@ -- raise the dynamic shared memory limit of every kernel that needs it,
@ -- each name once (the variants share their arch-neutral kernels); the
@ -- attribute is the current device's
@ local raised = {}
@ local sets = {}
@ for _, v in ipairs(p.variants) do sets[#sets + 1] = v.sm90 or {}; sets[#sets + 1] = v.sm80 or {} end
@ for _, set in ipairs(sets) do
@   for _, kd in ipairs(set) do
@     if kd.smem > 48 * 1024 and not raised[kd.name] then
@       raised[kd.name] = true
    if ((e = cudaFuncSetAttribute(${kd.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, ${kd.smem})) != cudaSuccess) return e;
@     end
@   end
@ end
@ -- the CTA-pair GEMMs ("+mc"): as many pairs as can be resident size their grid (moe_sm90_pair_ctas)
@ local asked = {}
@ for _, set in ipairs(sets) do
@   for _, kd in ipairs(set) do
@     if kd.cluster and not asked[kd.name] then
@       asked[kd.name] = true
    if (d->use90) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(2 * (unsigned)d->sms);
        cfg.blockDim = dim3(${kd.threads});
        cfg.dynamicSmemBytes = ${kd.smem};
        int n = 0;
        if ((e = cudaOccupancyMaxActiveClusters(&n, (const void *)${kd.name}, &cfg)) != cudaSuccess) return e;
        if (n < 1) return cudaErrorInvalidConfiguration;
        if (d->clusters == 0 || n < d->clusters) d->clusters = n;
    }
@     end
@   end
@ end
    return cudaSuccess;
}

/* Launch kernel k on s as the JIT runtime's moe_launch_kernel does: with
 * pdl (the call's: dev->pdl and its variant) a programmatic dependent of the stream's previous kernel (every
 * kernel's first statement waits for the grids before it: docs/DESIGN.md,
 * "Launch overlap"), with coop a cooperative launch (every CTA resident at
 * once, or the launch fails: the chain's up GEMM, templates/gemm_gemv.lua,
 * whose CTAs wait for each other's items), else <<<>>>. A failed launch is
 * the thread's last error, which the forward returns. */
template <typename... P, typename... A>
static void ${n}_launch_as(bool pdl, bool coop, void (*k)(P...), dim3 g, unsigned threads,
                           size_t smem, cudaStream_t s, A... args) {
    if (!pdl && !coop) {
        k<<<g, threads, smem, s>>>(args...);
        return;
    }
    cudaLaunchAttribute at[2];
    unsigned na = 0;
    if (pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (coop) {
        at[na].id = cudaLaunchAttributeCooperative;
        at[na++].val.cooperative = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = na;
    (void)cudaLaunchKernelEx(&cfg, k, args...);
}
template <typename... P, typename... A>
static void ${n}_launch(bool pdl, void (*k)(P...), dim3 g, unsigned threads, size_t smem,
                        cudaStream_t s, A... args) {
    ${n}_launch_as(pdl, false, k, g, threads, smem, s, args...);
}

/* The current device's entry, filled on first use; NULL with *err set. */
static ${n}_device_t *${n}_device(cudaError_t *err) {
    int dev = 0;
    if ((*err = cudaGetDevice(&dev)) != cudaSuccess)
        return NULL;
    if (dev < 0 || dev >= ${n}_MAX_DEVICES) {
        *err = cudaErrorInvalidDevice;
        return NULL;
    }
    ${n}_device_t *d = &${n}_devices[dev];
    if (d->ready.load(std::memory_order_acquire))
        return d;
    std::lock_guard<std::mutex> hold(${n}_devices_lock);
    if (!d->ready.load(std::memory_order_relaxed)) {
        if ((*err = ${n}_device_init(d, dev)) != cudaSuccess)
            return NULL;
        d->ready.store(1, std::memory_order_release);
    }
    return d;
}

extern "C" cudaError_t ${n}_forward(const ${n}_args_t *a, cudaStream_t stream) {
@ if p.ep > 1 then -- rows must move between ranks: only libmoegen's runtime does that
    /* mesh.ep = ${p.ep}: the expert-parallel forward runs through libmoegen (moe_forward
     * with a NCCL communicator); this single-device launcher refuses it. */
    (void)a, (void)stream;
    return cudaErrorNotSupported;
@ end
    if (!a || a->tokens < 0 || a->tokens > ${n}_MAX_TOKENS)
        return cudaErrorInvalidValue;
    if (a->tokens == 0) /* an empty batch: nothing to enqueue, y untouched */
        return cudaSuccess;
@ if p.score == "given" then -- the caller's weights: no router
    if (!a->x || !a->w1p || !a->w2 || !a->y || !a->workspace || !a->topk_ids || !a->topk_weights)
        return cudaErrorInvalidValue;
@ else
    if (!a->x || !a->router_w || !a->w1p || !a->w2 || !a->y || !a->workspace)
        return cudaErrorInvalidValue;
@ end
    /* rows moved 16 bytes at a time: x and y 16-byte aligned, the workspace 256 (as moe_forward checks) */
    if ((uintptr_t)a->x % 16 || (uintptr_t)a->y % 16 || (uintptr_t)a->workspace % 256)
        return cudaErrorInvalidValue;
@ if p.given and p.score ~= "given" then
    if (!a->topk_ids) return cudaErrorInvalidValue; /* the caller's experts */
@ end
@ if p.spec.router.input == "separate" then
    if (!a->router_x) return cudaErrorInvalidValue; /* the router's own input */
@ end
@ if p.spec.router.expert_scale then
    if (!a->router_expert_scale) return cudaErrorInvalidValue;
@ end
@ if p.bias then
    if (!a->router_bias) return cudaErrorInvalidValue;
@ end
@ if p.logit_bias then
    if (!a->router_logit_bias) return cudaErrorInvalidValue;
@ end
@ if p.ffn_bias then
    if (!a->b1p || !a->b2) return cudaErrorInvalidValue;
@ end
@ if p.shared_gate then
    if (!a->shared_gate) return cudaErrorInvalidValue;
@ end
@ if fp8 then
    if (!a->w1s || !a->w2s) return cudaErrorInvalidValue; /* the e4m3 weights' scales */
@ end
    const int T = a->tokens;
    char *ws = (char *)a->workspace;
@ for _, r in ipairs(p.ws) do
@   -- fp8: xs holds the e4m3 rows (and later the bf16 down output), hbuf the
@   -- e4m3 activation; xsc, hsc their scales (regions of 0 bytes otherwise);
@   -- the split-K partials only where a GEMM splits
@   if fp8 and r.name == "hbuf" then
    unsigned char *hbuf = (unsigned char *)(ws + ${r.offset});
@   elseif (fp8 or (r.name ~= "xsc" and r.name ~= "hsc")) and not ((r.name == "splitk" or r.name == "src_of") and r.bytes == 0) then
    ${r.ctype} *${r.name} = (${r.ctype} *)(ws + ${r.offset});
@   end
@ end
@ if nv == 1 then
    const long long tiles_y = ${n}_max_tiles(T);
@ else
    const int v = ${n}_variant(T);
    const long long tiles_y = ${n}_max_tiles(T, v);
@ end
@ -- the GEMM variant: sm_90a kernels on compute capability 9.x when the
@ -- spec has both arches and they differ; otherwise the one in the file
    cudaError_t e;
    const ${n}_device_t *dev = ${n}_device(&e);
    if (!dev)
        return e;
    /* launch overlap: MOEGEN_PDL=on, or auto and the variant's tuning entry (manifest.json, "variants") */
    const bool pdl = dev->pdl == 1 || (dev->pdl == 2 && ${nv == 1 and (p.variants[1].pdl ~= 0 and "true" or "false") or (n .. "_variant_pdl[v]")});
    e = cudaMemsetAsync(counts, 0, ${p.counts_bytes}, stream);
    if (e != cudaSuccess) return e;
@ local route, plan, scatter, combine = k.route, k.permute_plan, k.permute_scatter, k.combine
    /* calls of few tokens: the permute plan (and the scatter) in route's last block (moe_route_fuse_mode) */
    moe_route_fuse_t fz = {0, ${nv == 1 and p.align or (n .. "_variant_align[v]")}, dev->slot_of, offsets, cursor, tiles, num_tiles, xs, row_of, ${fp8 and "xsc" or "(float *)0"}};
    if (dev->route_fuse)
        fz.mode = moe_route_fuse_mode(T, ${p.entries}, ${p.H}, ${route.threads // 32}, moe_route_fuse_scatter(${fp8 and 1 or 0}, ${p.spec.router.apply == "input" and 1 or 0}, ${p.given and 1 or 0}));
    ${n}_launch(pdl, ${route.name}, dim3(moe_blocks(T, ${route.per_block}), moe_route_split(T, ${route.per_block}, ${p.score == "given" and 0 or p.router_hidden})), ${route.threads}, ${route.smem}, stream,
        (const moe_half_t *)a->x, (const ${p.spec.router.weight_dtype == "fp32" and "float" or "moe_half_t"} *)a->router_w, a->router_bias, a->router_logit_bias, T, topk_idx, topk_w,
        counts, route_part, fz${p.shared_gate and ", (const moe_half_t *)a->shared_gate" or ""}${p.spec.training and ", (float *)0" or ""}${p.given and ", a->topk_ids" or ""}${p.score == "given" and ", a->topk_weights" or ""}${p.spec.router.input == "separate" and ", (const moe_half_t *)a->router_x" or ""}${p.spec.router.expert_scale and ", a->router_expert_scale" or ""});
@ if nv == 1 then
    if (fz.mode < MOE_ROUTE_FUSE_PLAN)
        ${n}_launch(pdl, ${plan.name}, dim3(1), ${plan.threads}, 0, stream, counts, (const int *)dev->slot_of, offsets, cursor, tiles, num_tiles);
@ else
@   for i = 1, nv do
@     local vp = p.variants[i].neutral.permute_plan
    ${i == 1 and "if" or "else if"} (fz.mode < MOE_ROUTE_FUSE_PLAN && v == ${i - 1})
        ${n}_launch(pdl, ${vp.name}, dim3(1), ${vp.threads}, 0, stream, counts, (const int *)dev->slot_of, offsets, cursor, tiles, num_tiles);
@   end
@ end
@ if fp8 then -- the scatter quantizes: e4m3 rows into xs, their scales into xsc (route does, for one token: mode 2)
    if (fz.mode < MOE_ROUTE_FUSE_SCATTER)
        ${n}_launch(pdl, ${scatter.name}, dim3(moe_blocks(T, ${scatter.per_block})), ${scatter.threads}, 0, stream, (const moe_half_t *)a->x, topk_idx, topk_w, offsets, cursor, T, (unsigned char *)xs, xsc, row_of);
@ elseif p.gather then
    /* the sm_90a TMA up GEMMs gather their rows from x (docs/DESIGN.md, "The gathered up GEMM"): then the scatter
     * writes src_of and no rows; not when route scatters, nor for a gemv-grid (or sm_80) up GEMM; MOEGEN_GATHER as
     * libmoegen reads it (auto: at the sizes moe_gather_tokens allows) */
    int *gsrc = (int *)0;
    (void)src_of;
@   local gv = {}
@   for i = 1, nv do
@     local vs = p.variants[i]
@     if vs.sm90 and vs.sm90.gemm_up_swiglu.gather then gv[#gv + 1] = i - 1 end
@   end
@   if #gv > 0 then
@     local cond = {}
@     for _, i in ipairs(gv) do cond[#cond + 1] = nv == 1 and "1" or ("v == " .. i) end
    if (fz.mode < MOE_ROUTE_FUSE_SCATTER && dev->use90 && dev->gather && (${table.concat(cond, " || ")}) &&
        (dev->gather == 1 || moe_gather_tokens(T, ${p.entries}, ${p.slots}, ${p.F})))
        gsrc = src_of;
@   end
    if (fz.mode < MOE_ROUTE_FUSE_SCATTER)
        ${n}_launch(pdl, ${scatter.name}, dim3(moe_blocks(T, ${scatter.per_block})), ${scatter.threads}, 0, stream, (const moe_half_t *)a->x, topk_idx, topk_w, offsets, cursor, T, xs, row_of, gsrc);
@ else
    if (fz.mode < MOE_ROUTE_FUSE_SCATTER)
        ${n}_launch(pdl, ${scatter.name}, dim3(moe_blocks(T, ${scatter.per_block})), ${scatter.threads}, 0, stream, (const moe_half_t *)a->x, topk_idx, topk_w, offsets, cursor, T, xs, row_of);
@ end
@ -- one sm_90a GEMM launch: the tensor maps of A (rows of the tile grid) and
@ -- B (every expert's N rows), then the kernel on its 1D grid (one CTA per
@ -- tile, or per SM when persistent)
@ -- (fp8: scales: the A and B scales after the maps, and the up GEMM's output scales)
@ local function sm90_gemm(kd, a, w, bias, out, align, ind, scales)
${ind}    if ((e = ${n}_tmap(dev->encode, &ma, ${a}, tiles_y * ${align}, ${kd.K}, ${kd.bm})) != cudaSuccess ||
${ind}        (e = ${n}_tmap(dev->encode, &mb, ${w}, ${p.slots * kd.N}LL, ${kd.K}, ${kd.bn})) != cudaSuccess)
${ind}        return e;
@   -- fp8: the A and B scales after the maps, the up GEMM's output scales after the output; a training
@   -- plan's up GEMM: its ubuf (none here); split-K (never on a training or fp8 plan): the partials and
@   -- the tickets after the output
@   local mid, tail = "", ""
@   if scales then
@     mid, tail = scales[1] .. ", " .. scales[2] .. ", ", scales[3] and (", " .. scales[3]) or ""
@   else
@     tail = (p.spec.training and out == "hbuf") and ", (moe_half_t *)0" or ""
@     if (kd.splitk or 0) > 0 then tail = tail .. ", splitk, counts + " .. p.splitk_tickets_at end
@     if kd.gather then tail = tail .. ", (const moe_half_t *)a->x, (const int *)gsrc" end
@   end
@   local grid = kd.cluster
@     and string.format("moe_sm90_pair_ctas((unsigned long long)tiles_y, %d, dev->clusters, dev->sms)", kd.ntiles)
@     or string.format("moe_sm90_ctas((unsigned long long)tiles_y * %d, %s, %d, %s)", kd.ntiles,
@                      kd.persistent and "1" or "0", kd.splitk or 0, kd.persistent and "dev->sms" or "0")
${ind}    ${n}_launch(pdl, ${kd.name}, dim3(${grid}), ${kd.threads}, ${kd.smem}, stream, ma, mb, ${mid}(const moe_half_t *)${bias}, tiles, num_tiles, ${out}${tail});
@ end
@ -- one GEMM on the 2D grid of the sm_80 kernels (N tiles x M tiles), raw
@ -- pointers: the sm_80 kernels and the sm_90a gemv grid's (gemm_gemv.lua;
@ -- its down GEMM takes the folded combine's five after the output, y when
@ -- the call folds it: moe_combine_fuse_tokens)
@ -- (fp8, the gemv grid only: scales as sm90_gemm's, after the e4m3 A and B)
@ local function grid2d_gemm(kd, a, w, bias, out, ind, scales)
@   local ub = (p.spec.training and out == "hbuf") and ", (moe_half_t *)0" or ""
@   if kd.gemv and out == "xs" then
@     ub = ", row_of, topk_w, T, cfuse ? (moe_half_t *)a->y : (moe_half_t *)0, counts + " .. p.combine_tickets_at
${ind}    combined = cfuse;
@   end
@   local grid = kd.stream and ("dim3(moe_gemv_stream_ctas(dev->sms, " .. kd.smem .. "))") or ("dim3(" .. kd.ntiles .. ", (unsigned)tiles_y)")
@   if kd.chain then -- the chain's up GEMM: its grid runs the down GEMM and the combine too
${ind}    ${n}_launch_as(pdl, true, ${kd.name}, ${grid}, ${kd.threads}, ${kd.smem}, stream, ${a}, (const moe_half_t *)${w}, (const moe_half_t *)${bias}, tiles, num_tiles, ${out}, (const moe_half_t *)a->w2, (const moe_half_t *)a->b2, xs, row_of, topk_w, T, (moe_half_t *)a->y, counts + ${p.combine_tickets_at}, counts + ${p.combine_tickets_at} + moe_chain_done_at(${p.H}));
${ind}    combined = chained = 1;
@   elseif scales then
${ind}    ${n}_launch(pdl, ${kd.name}, ${grid}, ${kd.threads}, ${kd.smem}, stream, (const unsigned char *)${a}, (const unsigned char *)${w}, ${scales[1]}, ${scales[2]}, (const moe_half_t *)${bias}, tiles, num_tiles, ${out}${scales[3] and (", " .. scales[3]) or ""}${ub});
@   else
${ind}    ${n}_launch(pdl, ${kd.name}, ${grid}, ${kd.threads}, ${kd.smem}, stream, ${a}, (const moe_half_t *)${w}, (const moe_half_t *)${bias}, tiles, num_tiles, ${out}${ub});
@   end
@ end
@ -- both GEMMs of variant vs: the sm_90a kernels on compute capability 9.x
@ -- when the spec has both arches and they differ; otherwise the one in the file
@ local function gemms(vs, ind) -- ind: the lines' extra indent
@   if two then
${ind}    if (dev->use90) {
@   end
@   if vs.sm90 and (two or not vs.sm80) then
@     local up, dn = vs.sm90.gemm_up_swiglu, vs.sm90.gemm_down
@     if not (up.gemv and dn.gemv) then
${ind}    moe_tmap_t ma, mb;
@     end
@     if up.gemv then
@       grid2d_gemm(up, "xs", "a->w1p", "a->b1p", "hbuf", ind, fp8 and {"xsc", "a->w1s", "hsc"})
@     else
@       sm90_gemm(up, "xs", "a->w1p", "a->b1p", "hbuf", vs.align, ind, fp8 and {"xsc", "a->w1s", "hsc"})
@     end
@     if up.chain then
${ind}    if (!chained) {
@       grid2d_gemm(dn, "hbuf", "a->w2", "a->b2", "xs", ind .. "    ", nil)
${ind}    }
@     elseif dn.gemv then
@       grid2d_gemm(dn, "hbuf", "a->w2", "a->b2", "xs", ind, fp8 and {"hsc", "a->w2s"})
@     else
@       sm90_gemm(dn, "hbuf", "a->w2", "a->b2", "xs", vs.align, ind, fp8 and {"hsc", "a->w2s"})
@     end
@   end
@   if two then
${ind}    } else {
@   end
@   if vs.sm80 and (two or not vs.sm90) then
@     grid2d_gemm(vs.sm80.gemm_up_swiglu, "xs", "a->w1p", "a->b1p", "hbuf", ind)
@     grid2d_gemm(vs.sm80.gemm_down, "hbuf", "a->w2", "a->b2", "xs", ind)
@   end
@   if two then
${ind}    }
@   end
@ end
    /* few tokens: a gemv down GEMM writes y itself (moe_combine_fuse_tokens) */
    const int cfuse = dev->combine_fuse && moe_combine_fuse_tokens(T);
    int combined = 0;
    (void)cfuse;
@ local any_chain = false
@ for _, vs in ipairs(p.variants) do
@   if vs.sm90 and vs.sm90.gemm_up_swiglu.chain then any_chain = true end
@ end
@ if any_chain then
    int chained = 0; /* the chain's up GEMM ran the down GEMM and the combine */
@ end
@ if nv == 1 then
@   gemms(p.variants[1], "")
@ else
@   for i = 1, nv do
@     local open = i == 1 and "if" or "\125 else if" -- "}": an interpolation ends at the first brace
@     local from = i == 1 and 1 or p.variants[i].bucket
@     local to = i < nv and (" .. " .. (p.variants[i + 1].bucket - 1)) or " or more"
    ${open} (v == ${i - 1}) { /* calls of ${from}${to} tokens */
@     gemms(p.variants[i], "    ")
@   end
    }
@ end
    if (!combined)
        ${n}_launch(pdl, ${combine.name}, dim3(moe_blocks(T, ${combine.per_block}), moe_combine_split(T, ${p.H})), ${combine.threads}, 0, stream, xs, row_of, topk_w, T, (moe_half_t *)a->y);
    return cudaGetLastError();
}

/* W1 [E, 2F, H] and b1 [E, 2F], gate rows first, into the packed layout
 * (gen/pack_geom.h, pasted above with the pack kernel). */
extern "C" void ${n}_pack_w1(const unsigned short *w1, unsigned short *w1p) {
    const long long F = ${p.F}, H = ${p.H};
    for (long long e = 0; e < ${p.E}; e++)
        for (long long r = 0; r < 2 * F; r++)
            for (long long h = 0; h < H; h++)
                w1p[(e * 2 * F + moe_pack_row(r, F)) * H + h] = w1[(e * 2 * F + r) * H + h];
}

extern "C" void ${n}_pack_b1(const unsigned short *b1, unsigned short *b1p) {
    const long long F = ${p.F};
    for (long long e = 0; e < ${p.E}; e++)
        for (long long r = 0; r < 2 * F; r++)
            b1p[e * 2 * F + moe_pack_row(r, F)] = b1[e * 2 * F + r];
}

@ local pk = p.pack
/* The device-side pack of one checkpoint tensor (the runtime's
 * moe_plan_pack_async; README.md, "Weight layouts"): slots first ..
 * first + count - 1 of packed tensor `tensor` (pack_geom.h's MOE_PACK_*)
 * from strided sources, by the pack kernel above, on `stream`. */
extern "C" cudaError_t ${n}_pack(int tensor, void *dst, const void *src0, const void *src1, const long long s0[3],
                                const long long s1[3], int first, int count, cudaStream_t stream) {
    const int two = tensor == MOE_PACK_W1 || tensor == MOE_PACK_B1;
    if (tensor < MOE_PACK_W1 || tensor > MOE_PACK_B2 || !dst || !src0 || !s0 || (two && (!src1 || !s1)) ||
        first < 0 || count < 0 || (long long)first + count > ${p.E})
        return cudaErrorInvalidValue;
    for (int i = 0; i < 3; i++)
        if (s0[i] < 0 || (two && s1[i] < 0))
            return cudaErrorInvalidValue;
    long long R, C;
    moe_pack_dims(tensor, ${p.F}, ${p.H}, &R, &C);
    const long long n = (long long)count * R * C;
    if (n == 0)
        return cudaSuccess;
    const moe_pack_stride_t a = {s0[0], s0[1], s0[2]}, b = two ? moe_pack_stride_t{s1[0], s1[1], s1[2]} : a;
    const unsigned blocks = moe_blocks(n, ${pk.threads}) < 65536u ? moe_blocks(n, ${pk.threads}) : 65536u; /* a grid-stride loop */
    ${pk.name}<<<blocks, ${pk.threads}, 0, stream>>>(tensor, (unsigned short *)dst, (const unsigned short *)src0,
        (const unsigned short *)(two ? src1 : src0), a, b, first, count);
    return cudaGetLastError();
}
@ if fp8 then
@   local block = p.spec.quant.scaling == "block"

/* The checks of the fp8 packs: W1 (gate src0, up src1) or W2 (src0), slots
 * first .. first + count - 1 of ${p.slots}, strides not negative. */
static int ${n}_fp8_args_ok(int tensor, const void *dst, const float *dst_scales, const void *src0, const void *src1,
                            const long long s0[3], const long long s1[3], int first, int count) {
    const int two = tensor == MOE_PACK_W1;
    if ((tensor != MOE_PACK_W1 && tensor != MOE_PACK_W2) || !dst || !dst_scales || !src0 || !s0 ||
        (two && (!src1 || !s1)) || first < 0 || count < 0 || (long long)first + count > ${p.slots})
        return 0;
    for (int i = 0; i < 3; i++)
        if (s0[i] < 0 || (two && s1[i] < 0))
            return 0;
    return 1;
}

/* The scale blocks of W1 or W2 per slot: ${block and "128 x 128" or "one per row"} (sr x sc). */
static void ${n}_fp8_blocks(int tensor, long long *sr, long long *sc) {
    long long N, K;
    moe_pack_dims(tensor, ${p.F}, ${p.H}, &N, &K);
    *sr = ${block and "N / 128" or "N"}, *sc = ${block and "K / 128" or "1"};
}

/* bf16 W1 or W2 quantized on the device into the fp8 layout (the runtime's
 * moe_plan_pack_quantize_async; README.md, "FP8 weights"): slots first ..
 * first + count - 1 of the e4m3 tensor dst (tensor 0 w1q [slots, 2F, H],
 * 2 w2q [slots, H, F]) and of its fp32 scales dst_scales (${block and "[slots, N/128, K/128]" or "[slots, N]"}),
 * from strided bf16 sources as ${n}_pack's, on `stream`. */
extern "C" cudaError_t ${n}_quantize(int tensor, void *dst, float *dst_scales, const void *src0, const void *src1,
                                    const long long s0[3], const long long s1[3], int first, int count,
                                    cudaStream_t stream) {
    if (!${n}_fp8_args_ok(tensor, dst, dst_scales, src0, src1, s0, s1, first, count))
        return cudaErrorInvalidValue;
    long long sr, sc;
    ${n}_fp8_blocks(tensor, &sr, &sc);
    const long long blocks = (long long)count * sr * sc; /* one CTA per (slot, scale block) */
    if (blocks == 0)
        return cudaSuccess;
    if (blocks > 0x7FFFFFFFLL)
        return cudaErrorInvalidValue;
    const int two = tensor == MOE_PACK_W1;
    const moe_pack_stride_t a = {s0[0], s0[1], s0[2]}, b = two ? moe_pack_stride_t{s1[0], s1[1], s1[2]} : a;
    ${pk.name}_quantize<<<(unsigned)blocks, ${pk.threads}, 0, stream>>>(tensor, (unsigned char *)dst, dst_scales,
        (const unsigned short *)src0, (const unsigned short *)(two ? src1 : src0), a, b, first, count);
    return cudaGetLastError();
}

/* fp8 weights as a checkpoint ships them (the runtime's
 * moe_plan_pack_fp8_async): e4m3 sources (src0, src1 with byte strides s0,
 * s1 as ${n}_pack's) into the packed rows of dst, and their fp32 scales
 * (sc0: gate or W2, sc1: up; element (e, row block, column block) at
 * sc[e * t[0] + rb * t[1] + cb * t[2]]${block and "" or ", cb always 0"}) into dst_scales in
 * the checkpoint's row order, slots first .. first + count - 1, on `stream`. */
extern "C" cudaError_t ${n}_pack_fp8(int tensor, void *dst, float *dst_scales, const void *src0, const void *src1,
                                    const long long s0[3], const long long s1[3], const float *sc0,
                                    const float *sc1, const long long t0[3], const long long t1[3], int first,
                                    int count, cudaStream_t stream) {
    const int two = tensor == MOE_PACK_W1;
    if (!${n}_fp8_args_ok(tensor, dst, dst_scales, src0, src1, s0, s1, first, count) ||
        !${n}_fp8_args_ok(tensor, dst, dst_scales, sc0, sc1, t0, t1, first, count))
        return cudaErrorInvalidValue;
    long long N, K, sr, sc;
    moe_pack_dims(tensor, ${p.F}, ${p.H}, &N, &K);
    ${n}_fp8_blocks(tensor, &sr, &sc);
    const long long n = (long long)count * N * K, ns = (long long)count * sr * sc, f = first, c = count;
    if (n == 0)
        return cudaSuccess;
    const moe_pack_stride_t a = {s0[0], s0[1], s0[2]}, b = two ? moe_pack_stride_t{s1[0], s1[1], s1[2]} : a;
    const moe_pack_stride_t u = {t0[0], t0[1], t0[2]}, v = two ? moe_pack_stride_t{t1[0], t1[1], t1[2]} : u;
    const unsigned blocks = moe_blocks(n, ${pk.threads}) < 65536u ? moe_blocks(n, ${pk.threads}) : 65536u; /* grid-stride loops */
    const unsigned sblocks = moe_blocks(ns, ${pk.threads}) < 65536u ? moe_blocks(ns, ${pk.threads}) : 65536u;
    ${pk.name}_e4m3<<<blocks, ${pk.threads}, 0, stream>>>(tensor, (unsigned char *)dst, (const unsigned char *)src0,
        (const unsigned char *)(two ? src1 : src0), a, b, f, c);
    ${pk.name}_scales<<<sblocks, ${pk.threads}, 0, stream>>>(tensor, dst_scales, sc0, two ? sc1 : sc0, u, v, f, c, sr,
        sc);
    return cudaGetLastError();
}
@ end
@ if p.shared_slots > 0 then

/* The shared expert's slots E + j (j < ${p.shared_slots}): gate rows jF.., up
 * rows F_s + jF.. of w1s [2F_s, H] into w1p (packed like ${n}_pack_w1),
 * columns jF.. of w2s [H, F_s] into w2 [slots, H, F]. */
extern "C" void ${n}_pack_shared(const unsigned short *w1s, const unsigned short *w2s, unsigned short *w1p,
                               unsigned short *w2) {
    const long long E = ${p.E}, M = ${p.shared_slots}, F = ${p.F}, FS = M * F, H = ${p.H};
    for (long long j = 0; j < M; j++) {
        for (long long r = 0; r < 2 * F; r++) {
            const long long up = r >= F, f = up ? r - F : r, pr = moe_pack_row(r, F);
            const unsigned short *src = w1s + (up * FS + j * F + f) * H;
            for (long long h = 0; h < H; h++)
                w1p[((E + j) * 2 * F + pr) * H + h] = src[h];
        }
        for (long long h = 0; h < H; h++)
            for (long long f = 0; f < F; f++)
                w2[((E + j) * H + h) * F + f] = w2s[h * FS + j * F + f];
    }
}
@ end
#endif /* __CUDACC_RTC__ */
