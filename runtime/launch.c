/* launch.c — kernel launches: the planned grid, the sm_90a GEMMs' TMA
 * tensor maps and persistent grid. See launch.h. */
#define _POSIX_C_SOURCE 200809L
#include "launch.h"

#include "error.h"

#include <stdint.h>
#include <string.h>

/* The TMA tensor maps of sm_90a GEMM k (templates/gemm_sm90.lua): A over
 * [tiles * align, K] at a (every row a tile grid of `tiles` M tiles
 * reaches), B over [slots * N, K] at b; boxes of 64 halves x bm (A) or bn
 * (B) rows in the 128-byte swizzle. Out-of-bounds box parts read as zeros. */
static moe_status gemm_maps(const moe_launcher_t *l, int k, long long tiles, CUdeviceptr a, CUdeviceptr b,
                            CUtensorMap *ma, CUtensorMap *mb) {
    const moe_spec_t *s = &l->pd->spec;
    const moe_kernel_desc_t *d = &l->kernels[k];
    long long K = k == MOE_K_GEMM_UP ? s->hidden : s->ffn, N = k == MOE_K_GEMM_UP ? 2LL * s->ffn : s->hidden;
    const long long rows[2] = {tiles * l->pd->align, l->slots * N};
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

moe_status moe_launch_kernel(const moe_launcher_t *l, int k, int tokens, long long rows_y, CUstream st, void **args,
                             CUevent *ev) {
    if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
    unsigned g[3];
    moe_plan_grid(l->pd, l->arch, k, tokens, g);
    if (rows_y > 0)
        g[1] = (unsigned)rows_y;
    const moe_kernel_desc_t *d = &l->kernels[k];
    CUtensorMap ma, mb;
    void *targs[6];
    if (d->tile.consumers > 0) {
        moe_status rc = gemm_maps(l, k, g[1], *(const CUdeviceptr *)args[0], *(const CUdeviceptr *)args[1], &ma, &mb);
        if (rc)
            return rc;
        memcpy(targs, args, sizeof targs);
        targs[0] = &ma;
        targs[1] = &mb;
        args = targs;
        unsigned long long total = (unsigned long long)g[0] * g[1];
        if (d->tile.persistent && l->sms > 0 && total > (unsigned long long)l->sms)
            total = (unsigned long long)l->sms;
        g[0] = (unsigned)total;
        g[1] = 1;
    }
    CUresult r = moe_cu.cuLaunchKernel(l->fn[k], g[0], g[1], g[2], (unsigned)d->threads, 1, 1, (unsigned)d->smem, st,
                                       args, NULL);
    if (r != CUDA_SUCCESS)
        return moe_fail(MOE_ERR_CUDA, "launching %s (grid %u x %u): %s", d->name, g[0], g[1], moe_cu_error_string(r));
    return MOE_OK;
}
