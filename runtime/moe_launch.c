/* moe_launch.c — kernel launches: the planned grid, the sm_90a GEMMs' TMA
 * tensor maps and persistent grid, and the FFN stage (generated GEMMs or
 * the cuDNN path). */
#define _POSIX_C_SOURCE 200809L
#include "moe_impl.h"

#include "cudnn.h"
#include "ep.h"
#include "error.h"

#include <stdint.h>
#include <string.h>

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
            return moe_fail(MOE_ERR_CUDA, "cuTensorMapEncodeTiled (%s %s, %lld x %lld at %p; 16-byte aligned?): %s",
                        d->name, i ? "B" : "A", rows[i], K, base[i], moe_cu_error_string(r));
    }
    return MOE_OK;
}

/* See moe_impl.h. */
moe_status moe_launch_grid(const moe_plan *p, int k, int tokens, long long rows_y, CUstream st, void **args,
                           CUevent *ev) {
    if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
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
        return moe_fail(MOE_ERR_CUDA, "launching %s (grid %u x %u): %s", d->name, g[0], g[1], moe_cu_error_string(r));
    return MOE_OK;
}

moe_status moe_launch_family(const moe_plan *p, int k, int tokens, CUstream st, void **args) {
    return moe_launch_grid(p, k, tokens, 0, st, args, NULL);
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
                return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
            if ((rc = moe_cudnn_run(p->cudnn, stage, f, st)))
                return rc;
            continue;
        }
        void *up[] = {&xs, (void *)&f->w1p, (void *)&f->b1p, &tiles, &nt, &hbuf};
        void *down[] = {&hbuf, (void *)&f->w2, (void *)&f->b2, &tiles, &nt, &out};
        if ((rc = moe_launch_grid(p, k, f->tokens, f->grid_tiles, st, stage == MOE_STAGE_UP ? up : down, ev)))
            return rc;
    }
    return MOE_OK;
}
