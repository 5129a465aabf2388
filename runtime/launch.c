/* launch.c — kernel launches: the planned grid, the sm_90a GEMMs' TMA
 * tensor maps and persistent grid. See launch.h. */
#define _POSIX_C_SOURCE 200809L
#include "launch.h"

#include "error.h"
#include "launch_geom.h"

#include <stdint.h>
#include <string.h>

/* Arguments of the largest kernel launched with tensor maps (the gathering split-K up GEMM's: 6 + 2 + 2). */
#define MOE_LAUNCH_MAX_ARGS 10

/* The TMA tensor maps of sm_90a GEMM d of family k (templates/gemm_sm90.lua):
 * A over [tiles * align, K] at a (every row a tile grid of `tiles` M tiles
 * reaches); B over [slots * N, K] at b (the forward GEMMs) or, N-major, over
 * [slots * K, N] (the backward's dgrads); the backward's wgrads: A over
 * [tiles * align, M], B over [tiles * align, N] (the rows, both read in boxes
 * of bk rows; moe_bgemm_mn's M and N); encoded as gen/launch_geom.h says
 * (the vendored launcher pastes the same header). */
static moe_status gemm_maps(const moe_launcher_t *l, const moe_kernel_desc_t *d, int k, long long tiles,
                            CUdeviceptr a, CUdeviceptr b, CUtensorMap *ma, CUtensorMap *mb) {
    const moe_spec_t *s = &l->pd->spec;
    const int dgrad = k == MOE_K_DGRAD_DOWN || k == MOE_K_DGRAD_UP, wgrad = k == MOE_K_WGRAD_UP || k == MOE_K_WGRAD_DOWN;
    long long K = 0, N, M = 0;
    if (wgrad)
        moe_bgemm_mn((moe_kfamily_t)k, s->hidden, s->ffn, &M, &N);
    else if (dgrad)
        moe_dgrad_kn(k == MOE_K_DGRAD_UP, s->hidden, s->ffn, &K, &N);
    else
        moe_gemm_kn(k == MOE_K_GEMM_UP, s->hidden, s->ffn, &K, &N);
    const long long rows[2] = {tiles * l->align, wgrad ? tiles * l->align : dgrad ? l->slots * K : l->slots * N};
    const long long len[2] = {wgrad ? M : K, wgrad || dgrad ? N : K}; /* row lengths */
    const unsigned box_rows[2] = {(unsigned)(wgrad ? d->tile.bk : d->tile.bm),
                                  (unsigned)(wgrad || dgrad ? d->tile.bk : d->tile.bn)};
    CUtensorMap *m[2] = {ma, mb};
    void *base[2] = {(void *)(uintptr_t)a, (void *)(uintptr_t)b};
    const int fp8 = moe_spec_fp8(s); /* e4m3 operands, one byte each */
    for (int i = 0; i < 2; i++) {
        const moe_tmap_geom_t g = fp8 ? moe_tmap_geom8(rows[i], len[i], box_rows[i])
                                      : moe_tmap_geom(rows[i], len[i], box_rows[i]);
        CUresult r = moe_cu.cuTensorMapEncodeTiled(m[i], fp8 ? MOE_TMAP_DTYPE8 : MOE_TMAP_DTYPE, 2, base[i], g.dim,
                                                   g.stride, g.box, g.estride,
                                                   MOE_TMAP_INTERLEAVE, MOE_TMAP_SWIZZLE, MOE_TMAP_L2_PROMOTION,
                                                   MOE_TMAP_OOB_FILL);
        if (r != CUDA_SUCCESS)
            return moe_fail(MOE_ERR_CUDA, "cuTensorMapEncodeTiled (%s %s, %lld x %lld at %p; 16-byte aligned?): %s",
                            d->name, i ? "B" : "A", rows[i], len[i], base[i], moe_cu_error_string(r));
    }
    return MOE_OK;
}

/* The sm_90a wgrad's output: a 3D tensor map over out [slots][M][N] of
 * fp32 or the dtype (spec weight_grads; moe_bgemm_mn's M and N; slots = the
 * launcher's), boxes of 128 bytes (32 or 64 columns) x bm rows of one slot
 * in the 128-byte swizzle, which the kernel stores from shared memory (TMA
 * clips rows past M and columns past N). */
static moe_status wgrad_out_map(const moe_launcher_t *l, const moe_kernel_desc_t *d, int k, CUdeviceptr out,
                                CUtensorMap *mo) {
    const moe_spec_t *s = &l->pd->spec;
    long long M, N;
    moe_bgemm_mn((moe_kfamily_t)k, s->hidden, s->ffn, &M, &N);
    const int eb = moe_wgrad_elem_bytes(s);
    const CUtensorMapDataType type = eb == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : s->dtype == MOE_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const cuuint64_t dim[3] = {(cuuint64_t)N, (cuuint64_t)M, (cuuint64_t)(l->slots > 0 ? l->slots : 1)};
    const cuuint64_t stride[2] = {(cuuint64_t)N * eb, (cuuint64_t)(M * N) * eb};
    const cuuint32_t box[3] = {(cuuint32_t)(128 / eb), (cuuint32_t)d->tile.bm, 1}, estride[3] = {1, 1, 1};
    CUresult r = moe_cu.cuTensorMapEncodeTiled(mo, type, 3, (void *)(uintptr_t)out, dim, stride, box, estride,
                                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuTensorMapEncodeTiled (%s out, %lld slots of %lld x %lld %s at %p; "
                        "16-byte aligned?): %s", d->name, (long long)dim[2], M, N,
                        eb == 4 ? "fp32" : moe_dtype_name(s->dtype), (void *)(uintptr_t)out, moe_cu_error_string(r));
    return MOE_OK;
}

long long moe_launcher_tiles(const moe_launcher_t *l, int tokens) {
    return moe_max_tiles(tokens, moe_spec_entries(&l->pd->spec), moe_spec_slots(&l->pd->spec), l->align);
}

static moe_status launch(const moe_launcher_t *l, int k, int tokens, long long n, CUstream st, void **args,
                         CUevent *ev, int coop) {
    const moe_kernel_desc_t *d;
    CUfunction fn;
    if (k >= 0 && k < MOE_K_COUNT) {
        d = &l->kernels[k];
        fn = l->fn[k];
        if (n <= 0)
            n = moe_launcher_tiles(l, tokens);
    } else if (k >= MOE_K_EP_FIRST && k < MOE_K_EP_FIRST + MOE_EK_COUNT && l->ep_kernels && !ev) {
        d = &l->ep_kernels[k - MOE_K_EP_FIRST];
        fn = l->ep_fn[k - MOE_K_EP_FIRST];
    } else if (k == MOE_K_SWIGLU && l->swiglu && l->swiglu_fn && !ev) {
        d = l->swiglu;
        fn = l->swiglu_fn;
    } else if (k == MOE_K_PACK && l->pack && l->pack_fn && !ev) {
        d = l->pack;
        fn = l->pack_fn;
    } else if (k >= MOE_K_BWD_FIRST && k < MOE_K_BWD_FIRST + MOE_BK_COUNT && l->bwd && !ev) {
        d = &l->bwd[k - MOE_K_BWD_FIRST];
        fn = l->bwd_fn[k - MOE_K_BWD_FIRST];
    } else if (k >= MOE_K_BGEMM_FIRST && k < MOE_K_BGEMM_FIRST + MOE_BGEMM_COUNT && l->bgemm &&
               l->bgemm_fn[k - MOE_K_BGEMM_FIRST] && !ev) {
        d = &l->bgemm[k - MOE_K_BGEMM_FIRST];
        fn = l->bgemm_fn[k - MOE_K_BGEMM_FIRST];
    } else {
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_launch_kernel: the plan has no kernel of family %d%s", k,
                        ev ? " with an event" : "");
    }
    if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    /* the kernels over the caller's own tokens have nothing to do without
     * any (an expert-parallel rank with an empty batch, which still plans,
     * exchanges and runs its peers' rows); the family grids never go below
     * one block, so they are skipped here */
    if (tokens == 0 && (k == MOE_K_ROUTE || k == MOE_K_PERMUTE_SCATTER || k == MOE_K_COMBINE || k == MOE_K_EP_SCATTER ||
                        k == MOE_K_BWD_DYS || k == MOE_K_BWD_ROUTER || k == MOE_K_BWD_DX))
        return MOE_OK;
    unsigned g[3];
    moe_family_grid(d, &l->pd->spec, tokens, n, g);
    if (moe_tile_stream(&d->tile)) { /* the stream grids: persistent, their CTAs split the items themselves */
        g[0] = moe_gemv_stream_ctas(l->sms, d->smem);
        g[1] = g[2] = 1;
    }
    /* the wgrads and the bias sums walk the launcher's weight slots: an EP
     * rank's held experts (the family's moe_spec_slots without EP) */
    if (k == MOE_K_WGRAD_UP || k == MOE_K_WGRAD_DOWN)
        g[2] = (unsigned)l->slots;
    else if (k == MOE_K_BWD_COLSUM)
        g[1] = (unsigned)l->slots;
    if ((k == MOE_K_SWIGLU || k == MOE_K_PACK || k == MOE_K_BWD_UNPACK || k == MOE_K_BWD_ACCUM) && l->sms > 0 && g[0] > (unsigned)l->sms * 32) /* grid-stride loops */
        g[0] = (unsigned)l->sms * 32;
    CUtensorMap ma, mb, mo;
    void *targs[MOE_LAUNCH_MAX_ARGS];
    if (d->tile.consumers > 0) {
        /* the wgrads' rows: n tiles' (an EP rank's received rows), else every row `tokens` can fill (at least one) */
        const int wgrad = k == MOE_K_WGRAD_UP || k == MOE_K_WGRAD_DOWN;
        long long tiles = wgrad ? (n > 0 ? n : moe_launcher_tiles(l, tokens)) : g[1];
        moe_status rc = gemm_maps(l, d, k, tiles > 0 ? tiles : 1, *(const CUdeviceptr *)args[0],
                                  *(const CUdeviceptr *)args[1], &ma, &mb);
        if (rc)
            return rc;
        /* the GEMMs' arguments (templates/gemm_sm90.lua): 6; with fp8 the two scale pointers more, and the
         * up GEMM's output scales; a training plan's up GEMM has a seventh, ubuf (fp8 plans never train);
         * the backward's GEMMs: dgrad_down 6, dgrad_up 5, the wgrads 8 (runtime/bgemm.c); split-K 2 more */
        int nargs = k == MOE_K_DGRAD_UP ? 5
                    : wgrad ? 8
                    : k >= MOE_K_BGEMM_FIRST ? 6
                    : moe_spec_fp8(&l->pd->spec) ? (k == MOE_K_GEMM_UP ? 9 : 8)
                    : k == MOE_K_GEMM_UP && l->pd->spec.training ? 7 : 6;
        if (d->tile.splitk && !wgrad) /* the partials and tickets after the output (the forward's bf16 GEMMs
                                          * only, never with ubuf: family_gemm.c) */
            nargs += 2;
        if (moe_gemm_gathers(&l->pd->spec, d)) /* x and src_of last (docs/DESIGN.md, "The gathered up GEMM") */
            nargs += 2;
        memcpy(targs, args, sizeof(void *) * (size_t)nargs);
        targs[0] = &ma;
        targs[1] = &mb;
        args = targs;
        if (!wgrad) {
            g[0] = d->tile.cluster ? moe_sm90_pair_ctas(g[1], g[0], l->clusters, l->sms)
                                   : moe_sm90_ctas((unsigned long long)g[0] * g[1], d->tile.persistent, d->tile.splitk,
                                                   l->sms);
            g[1] = 1;
        } else { /* persistent: the wgrads walk (N tile, M tile, slot) themselves; the output a tensor map */
            g[0] = moe_sm90_ctas((unsigned long long)g[0] * g[1] * g[2], 1, 0, l->sms);
            g[1] = g[2] = 1;
            rc = wgrad_out_map(l, d, k, *(const CUdeviceptr *)args[5], &mo);
            if (rc)
                return rc;
            targs[5] = &mo;
        }
    }
    CUresult r;
    if (l->pdl || coop) { /* with pdl every kernel's first statement waits for the grids before it (the
                           * prelude's moe_pdl_begin) */
        CUlaunchAttribute at[2];
        unsigned na = 0;
        if (l->pdl)
            at[na++] = (CUlaunchAttribute){.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                                           .value.programmaticStreamSerializationAllowed = 1};
        if (coop)
            at[na++] = (CUlaunchAttribute){.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value.cooperative = 1};
        const CUlaunchConfig cfg = {.gridDimX = g[0], .gridDimY = g[1], .gridDimZ = g[2],
                                    .blockDimX = (unsigned)d->threads, .blockDimY = 1, .blockDimZ = 1,
                                    .sharedMemBytes = (unsigned)d->smem, .hStream = st, .attrs = at, .numAttrs = na};
        r = moe_cu.cuLaunchKernelEx(&cfg, fn, args, NULL);
    } else {
        r = moe_cu.cuLaunchKernel(fn, g[0], g[1], g[2], (unsigned)d->threads, 1, 1, (unsigned)d->smem, st, args, NULL);
    }
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "launching %s%s (grid %u x %u): %s", d->name, coop ? " cooperatively" : "", g[0],
                        g[1], moe_cu_error_string(r));
    return MOE_OK;
}

moe_status moe_launch_kernel(const moe_launcher_t *l, int k, int tokens, long long n, CUstream st, void **args,
                             CUevent *ev) {
    return launch(l, k, tokens, n, st, args, ev, 0);
}

moe_status moe_launch_kernel_coop(const moe_launcher_t *l, int k, int tokens, long long n, CUstream st, void **args,
                                  CUevent *ev) {
    return launch(l, k, tokens, n, st, args, ev, 1);
}
