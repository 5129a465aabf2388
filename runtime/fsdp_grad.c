/* fsdp_grad.c — moe_reduce_scatter_grads: the weight gradients of the held
 * experts summed over the FSDP group, each rank keeping those of the
 * experts it stores (docs/DESIGN.md, "Training on a mesh"). */
#define _POSIX_C_SOURCE 200809L
#include "fsdp_grad.h"

#include "ep.h"
#include "error.h"
#include "moe_impl.h"
#include "nccl_dl.h"

#include <stdint.h>
#include <stdio.h>

const char *const moe_grad_tensor_names[MOE_GRAD_TENSORS] = {"dw1p", "db1p", "dw2", "db2"};

int moe_fsdp_grad_parts(const moe_mesh_plan_t *mp, const moe_spec_t *s, int rank, moe_grad_part_t parts[4], char *err,
                        size_t errlen) {
    /* with mesh.ep > 1 an EP rank's FSDP peers share its EP coordinate, so they hold the same experts: the
     * same collectives over the same held layout */
    if (rank < 0 || rank >= mp->world) {
        snprintf(err, errlen, "rank %d is outside the mesh of %d devices", rank, mp->world);
        return -1;
    }
    const int fsdp = mp->size[MOE_AXIS_FSDP], shards = moe_ep_fsdp_shards(mp);
    const long long stored = mp->nstored + moe_spec_shared_slots(s), held = mp->nheld + moe_spec_shared_slots(s);
    for (int i = 0; i < MOE_GRAD_TENSORS; i++) {
        long long n = moe_ep_slot_elems(s, i); /* dw1p, db1p, dw2, db2: the gather's first four parts' shapes */
        moe_grad_part_t *p = &parts[i];
        p->count = n * stored;
        p->held = n * held;
        p->group = fsdp;
        p->op = !n ? MOE_GRAD_NONE : fsdp == 1 ? MOE_GRAD_COPY : shards ? MOE_GRAD_REDUCE_SCATTER : MOE_GRAD_ALL_REDUCE;
        if (p->op == MOE_GRAD_COPY || p->op == MOE_GRAD_NONE)
            p->group = 1;
    }
    return 0;
}

/* Whether [a, a + an) and [b, b + bn) (bytes) share a byte. */
static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

moe_status moe_fsdp_grads(const moe_ep_t *ep, const moe_launcher_t *l, const moe_spec_t *s,
                          const moe_grad_scatter_args *a, CUstream st) {
    moe_grad_part_t parts[MOE_GRAD_TENSORS];
    char why[256];
    if (moe_fsdp_grad_parts(ep->mp, s, ep->rank, parts, why, sizeof why))
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_reduce_scatter_grads: %s", why);
    char *src[MOE_GRAD_TENSORS] = {a->held_dw1p, (char *)a->held_db1p, a->held_dw2, (char *)a->held_db2};
    char *dst[MOE_GRAD_TENSORS] = {a->dw1p, (char *)a->db1p, a->dw2, (char *)a->db2};
    /* element bytes and NCCL type of each tensor: the weights' (spec weight_grads), the biases fp32 */
    const int wb = moe_wgrad_elem_bytes(s);
    const size_t eb[MOE_GRAD_TENSORS] = {(size_t)wb, 4, (size_t)wb, 4};
    const ncclDataType_t wt = wb == 4 ? ncclFloat32 : s->dtype == MOE_DTYPE_BF16 ? ncclBfloat16 : ncclFloat16;
    const ncclDataType_t nt[MOE_GRAD_TENSORS] = {wt, ncclFloat32, wt, ncclFloat32};
    const int me = ep->me->fsdp_rank, acc = a->accumulate != 0;
    int collective = 0;
    if (a->accumulate != 0 && a->accumulate != 1)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_reduce_scatter_grads: accumulate = %d; 0 (write) or 1 (add)",
                        a->accumulate);
    for (int i = 0; i < MOE_GRAD_TENSORS; i++) { /* every argument checked before anything is enqueued */
        const moe_grad_part_t *p = &parts[i];
        const char *t = moe_grad_tensor_names[i];
        if (p->op == MOE_GRAD_NONE)
            continue;
        if (!src[i] || !dst[i])
            return moe_fail(MOE_ERR_INVALID_ARG, "moe_reduce_scatter_grads: %s (held_%s or %s) is NULL", t, t, t);
        const size_t nb = eb[i] * (size_t)p->count, hb = eb[i] * (size_t)p->held;
        const int in_place = !acc && p->op == MOE_GRAD_REDUCE_SCATTER && dst[i] == src[i] + nb * me;
        if (acc ? overlap(dst[i], nb, src[i], hb)
                : !in_place && !(dst[i] == src[i] && p->op != MOE_GRAD_REDUCE_SCATTER) && overlap(dst[i], nb, src[i], hb))
            return moe_fail(MOE_ERR_INVALID_ARG, "moe_reduce_scatter_grads: %s overlaps held_%s (%s)", t, t,
                            acc ? "with accumulate = 1 they must not overlap at all"
                                : p->op == MOE_GRAD_REDUCE_SCATTER ? "only the in-place reduce-scatter may: "
                                  "stored = held + fsdp_rank * the stored size"
                                : "only the same buffer may");
        collective |= p->op != MOE_GRAD_COPY;
    }
    if (collective && ep->unconnected)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_reduce_scatter_grads: this plan has no communicator");
    if (acc && !l->bwd)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_reduce_scatter_grads: accumulate = 1 needs the plan's backward "
                        "kernels (training = true)");
    for (int i = 0; i < MOE_GRAD_TENSORS && !acc; i++) /* the copies: they join no NCCL group */
        if (parts[i].op == MOE_GRAD_COPY && dst[i] != src[i])
            CU_CHECK(moe_cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst[i], (CUdeviceptr)(uintptr_t)src[i],
                                              eb[i] * (size_t)parts[i].count, st));
    /* the sums: into the stored buffers, or with accumulate in place in the held ones */
    if (collective) {
        ncclResult_t r = moe_nccl.ncclGroupStart();
        for (int i = 0; i < MOE_GRAD_TENSORS && r == ncclSuccess; i++) {
            const moe_grad_part_t *p = &parts[i];
            const int rs = p->op == MOE_GRAD_REDUCE_SCATTER;
            if (p->op != MOE_GRAD_REDUCE_SCATTER && p->op != MOE_GRAD_ALL_REDUCE)
                continue;
            char *out = acc ? src[i] + (rs ? eb[i] * (size_t)p->count * me : 0) : dst[i];
            r = rs ? moe_nccl.ncclReduceScatter(src[i], out, (size_t)p->count, nt[i], ncclSum, ep->fsdp_comm, st)
                   : moe_nccl.ncclAllReduce(src[i], out, (size_t)p->count, nt[i], ncclSum, ep->fsdp_comm, st);
            if (r != ncclSuccess) {
                moe_nccl.ncclGroupEnd();
                return moe_fail(MOE_ERR_NCCL, "%s of %s (%lld elements) over the FSDP group: %s",
                                rs ? "ncclReduceScatter" : "ncclAllReduce", moe_grad_tensor_names[i], p->count,
                                moe_nccl_error_string(r));
            }
        }
        if ((r = moe_nccl.ncclGroupEnd()) != ncclSuccess)
            return moe_fail(MOE_ERR_NCCL, "moe_reduce_scatter_grads: ncclGroupEnd: %s", moe_nccl_error_string(r));
    }
    for (int i = 0; i < MOE_GRAD_TENSORS && acc; i++) { /* stored += this rank's sum */
        const moe_grad_part_t *p = &parts[i];
        if (p->op == MOE_GRAD_NONE)
            continue;
        const char *sum = src[i] + (p->op == MOE_GRAD_REDUCE_SCATTER ? eb[i] * (size_t)p->count * me : 0);
        long long n = p->count;
        int half = eb[i] == 2;
        void *args[] = {(void *)&sum, (void *)&dst[i], &n, &half};
        moe_status rc = moe_launch_kernel(l, MOE_K_BWD_ACCUM, 0, n, st, args, NULL);
        if (rc)
            return rc;
    }
    return MOE_OK;
}

moe_status moe_reduce_scatter_grads(const moe_plan *p, const moe_grad_scatter_args *a, void *stream) {
    if (!p || !a)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_reduce_scatter_grads: NULL argument");
    if (!p->pd.spec.training)
        return moe_fail(MOE_ERR_UNSUPPORTED, "moe_reduce_scatter_grads: the plan was made without training = true "
                        "(spec key training), so it has no weight gradients to reduce");
    CU_CHECK(moe_cu.cuCtxSetCurrent(p->ctx));
    return moe_fsdp_grads(p->ep, &p->launcher, &p->pd.spec, a, (CUstream)stream);
}
