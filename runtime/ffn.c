/* ffn.c — the expert FFN stage: the generated GEMMs, or the cuDNN path where
 * the plan decided so. See ffn.h. */
#include "ffn.h"

#include "error.h"

int moe_ffn_cudnn(const moe_launcher_t *l, const moe_cudnn_t *dn, int stage, const moe_ffn_args_t *f) {
    return l->slot_identity && !moe_spec_fp8(&l->pd->spec) && moe_cudnn_applies(dn, stage, f) && /* bf16 graphs */
           !(stage == MOE_STAGE_UP && f->ubuf);                                                 /* cuDNN stores no U */
}

moe_status moe_run_ffn(const moe_launcher_t *l, const moe_cudnn_t *dn, const moe_ffn_args_t *f, CUstream st,
                       CUevent *ev, int *combined) {
    moe_status rc;
    if (combined)
        *combined = 0;
    CUdeviceptr xs = f->xs, tiles = f->tiles, nt = f->num_tiles, hbuf = f->hbuf, out = f->out, ubuf = f->ubuf;
    static const int kernel_of[MOE_STAGE_COUNT] = {MOE_K_GEMM_UP, MOE_K_GEMM_DOWN};
    for (int stage = 0; stage < MOE_STAGE_COUNT; stage++) {
        const int k = kernel_of[stage];
        if (moe_ffn_cudnn(l, dn, stage, f)) {
            if (ev && moe_cu.cuEventRecord(ev[k], st) != CUDA_SUCCESS)
                return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
            if ((rc = moe_cudnn_run(dn, stage, f, st)))
                return rc;
            continue;
        }
        void *up[16] = {&xs, (void *)&f->w1p, (void *)&f->b1p, &tiles, &nt, &hbuf, &ubuf}; /* ubuf: training plans' */
        void *down[11] = {&hbuf, (void *)&f->w2, (void *)&f->b2, &tiles, &nt, &out};
        /* fp8 (templates/gemm_sm90.lua, gemm_gemv.lua): the A and B scales after the A and B operands, and
         * the up GEMM's output scales */
        CUdeviceptr xsc = f->xsc, hsc = f->hsc;
        void *up8[] = {&xs, (void *)&f->w1p, &xsc, (void *)&f->w1s, (void *)&f->b1p, &tiles, &nt, &hbuf, &hsc};
        void *down8[13] = {&hbuf, (void *)&f->w2, &hsc, (void *)&f->w2s, (void *)&f->b2, &tiles, &nt, &out};
        const int fp8 = moe_spec_fp8(&l->pd->spec);
        /* the gemv grid's down GEMM: the combine's five after the output (y 0: not folded in) */
        CUdeviceptr y = f->y, row_of = f->row_of, topk_w = f->topk_w, ctk = f->combine_tickets, cdone = f->chain_done;
        CUdeviceptr ychain = cdone ? y : 0; /* the chain's y: non-0 chains the call */
        int tokens = f->tokens;
        const int chains = stage == MOE_STAGE_UP && moe_gemm_chains(&l->pd->spec, &l->kernels[k]);
        if (chains) { /* the chain's up GEMM (never training: no ubuf): the down GEMM's and the combine's after it */
            up[6] = (void *)&f->w2, up[7] = (void *)&f->b2, up[8] = &out, up[9] = &row_of, up[10] = &topk_w;
            up[11] = &tokens, up[12] = &ychain, up[13] = &ctk, up[14] = &cdone;
            if (ychain) { /* chained: one cooperative grid runs the layer's rest; no down GEMM, no combine after it */
                if (combined)
                    *combined = 1;
                if ((rc = moe_launch_kernel_coop(l, k, f->tokens, f->grid_tiles, st, up, ev)))
                    return rc;
                if (ev && moe_cu.cuEventRecord(ev[MOE_K_GEMM_DOWN], st) != CUDA_SUCCESS) /* the (empty) stage */
                    return moe_fail(MOE_ERR_CUDA, "cuEventRecord failed");
                return MOE_OK;
            }
        }
        if (stage == MOE_STAGE_DOWN && l->kernels[k].tile.gemv) {
            void **c = fp8 ? down8 + 8 : down + 6;
            c[0] = &row_of, c[1] = &topk_w, c[2] = &tokens, c[3] = &y, c[4] = &ctk;
            if (combined)
                *combined = y != 0;
        }
        CUdeviceptr skp = f->splitk, skt = f->splitk_tickets;
        if (l->kernels[k].tile.splitk) { /* split-K (no training plan's: gen/family_gemm.c): after the output */
            if (!skp || !skt)
                return moe_fail(MOE_ERR_INVALID_ARG, "%s: a split-K GEMM needs the workspace's splitk region and "
                                "tickets", l->kernels[k].name);
            void **a = stage == MOE_STAGE_UP ? up : down;
            a[6] = &skp;
            a[7] = &skt;
        }
        CUdeviceptr gx = f->x, src_of = f->src_of;
        if (stage == MOE_STAGE_UP && moe_gemm_gathers(&l->pd->spec, &l->kernels[k])) { /* last: x, src_of */
            const int at = l->kernels[k].tile.splitk ? 8 : 6; /* no ubuf: no training plan gathers */
            up[at] = &gx;
            up[at + 1] = &src_of;
        }
        void **args = stage == MOE_STAGE_UP ? (fp8 ? up8 : up) : (fp8 ? down8 : down);
        if ((rc = moe_launch_kernel(l, k, f->tokens, f->grid_tiles, st, args, ev)))
            return rc;
    }
    return MOE_OK;
}
