/* ep.c — expert parallelism: communicators, the dispatch forward and the
 * FSDP gather (README, "Expert parallelism"). */
#define _POSIX_C_SOURCE 200809L
#include "ep.h"
#include "ep_bwd.h"

#include "error.h"
#include "ffn.h"
#include "launch_geom.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_TRY(call)                                                                                 \
    do {                                                                                               \
        ncclResult_t nc_rc_ = (call);                                                                  \
        if (nc_rc_ != ncclSuccess)                                                                     \
            return moe_fail(MOE_ERR_NCCL, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,           \
                            moe_nccl_error_string(nc_rc_));                                            \
    } while (0)

moe_status moe_ep_create(moe_ep_t **out, const moe_plan_desc_t *pd, int rank, char *err, size_t errlen) {
    *out = NULL;
    moe_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep) {
        snprintf(err, errlen, "out of memory");
        return MOE_ERR_NO_MEMORY;
    }
    ep->mp = &pd->mesh;
    if (rank < 0 || rank >= ep->mp->world) {
        snprintf(err, errlen, "rank %d is outside the mesh of %d devices", rank, ep->mp->world);
        moe_ep_destroy(ep);
        return MOE_ERR_INVALID_ARG;
    }
    ep->rank = rank;
    ep->me = &ep->mp->ranks[rank];
    ep->dispatch = moe_ep_wanted(&pd->spec);
    ep->ed = &pd->ep;
    ep->training = pd->spec.training;
    *out = ep;
    return MOE_OK;
}

void moe_ep_destroy(moe_ep_t *ep) {
    if (!ep)
        return;
    if (ep->owner_dev)
        moe_cu.cuMemFree(ep->owner_dev);
    if (ep->ident_dev)
        moe_cu.cuMemFree(ep->ident_dev);
    if (ep->ep_comm)
        moe_nccl.ncclCommDestroy(ep->ep_comm);
    if (ep->fsdp_comm)
        moe_nccl.ncclCommDestroy(ep->fsdp_comm);
    free(ep);
}

/* Split the caller's mesh communicator into this rank's EP and FSDP groups.
 * Colors are the plan's group indices (counted over every other axis), keys
 * the rank's coordinate in the group, so NCCL ranks equal plan ranks. */
moe_status moe_ep_connect(moe_ep_t *ep, void *comm, int device) {
    char why[512];
    if (moe_nccl_load(why, sizeof why))
        return moe_fail(MOE_ERR_UNSUPPORTED, "the mesh has %d devices and needs NCCL, which did not load: %s",
                        ep->mp->world, why);
    ncclComm_t c = (ncclComm_t)comm;
    int n = 0, r = 0, dev = -1;
    NCCL_TRY(moe_nccl.ncclCommCount(c, &n));
    NCCL_TRY(moe_nccl.ncclCommUserRank(c, &r));
    NCCL_TRY(moe_nccl.ncclCommCuDevice(c, &dev));
    if (n != ep->mp->world)
        return moe_fail(MOE_ERR_INVALID_ARG, "the NCCL communicator has %d ranks; the spec's mesh has %d devices", n,
                        ep->mp->world);
    if (r != ep->rank)
        return moe_fail(MOE_ERR_INVALID_ARG, "options.rank is %d but the NCCL communicator's rank is %d", ep->rank, r);
    if (dev != device)
        return moe_fail(MOE_ERR_INVALID_ARG, "the NCCL communicator's rank %d is on device %d; options.device is %d",
                        r, dev, device);
    NCCL_TRY(moe_nccl.ncclCommSplit(c, ep->me->ep_group, ep->me->ep_rank, &ep->ep_comm, NULL));
    NCCL_TRY(moe_nccl.ncclCommSplit(c, ep->me->fsdp_group, ep->me->fsdp_rank, &ep->fsdp_comm, NULL));
    int en = 0, er = -1, fn = 0, fr = -1;
    NCCL_TRY(moe_nccl.ncclCommCount(ep->ep_comm, &en));
    NCCL_TRY(moe_nccl.ncclCommUserRank(ep->ep_comm, &er));
    NCCL_TRY(moe_nccl.ncclCommCount(ep->fsdp_comm, &fn));
    NCCL_TRY(moe_nccl.ncclCommUserRank(ep->fsdp_comm, &fr));
    if (en != ep->mp->size[MOE_AXIS_EP] || er != ep->me->ep_rank || fn != ep->mp->size[MOE_AXIS_FSDP] ||
        fr != ep->me->fsdp_rank)
        return moe_fail(MOE_ERR_NCCL, "ncclCommSplit gave rank %d an EP group of %d (rank %d) and an FSDP group of %d "
                        "(rank %d); the plan says %d (%d) and %d (%d)", ep->rank, en, er, fn, fr,
                        ep->mp->size[MOE_AXIS_EP], ep->me->ep_rank, ep->mp->size[MOE_AXIS_FSDP], ep->me->fsdp_rank);
    return MOE_OK;
}

moe_status moe_ep_load(moe_ep_t *ep) {
    if (!ep->dispatch)
        return MOE_OK;
    size_t tb = sizeof(int) * (size_t)ep->mp->experts;
    CU_CHECK(moe_cu.cuMemAlloc(&ep->owner_dev, tb));
    CU_CHECK(moe_cu.cuMemcpyHtoD(ep->owner_dev, ep->mp->owner_ep_rank, tb));
    return moe_ep_bwd_load(ep);
}

static void xfer(moe_ep_call_t *c, int peer, int recv, CUdeviceptr ptr, size_t bytes) {
    c->x[c->nx++] = (moe_xfer_t){peer, recv, ptr, bytes};
}

/* Peer d's block of `out` (out_rows[d] rows, blocks back to back) goes to d
 * while d's block of `in` arrives: dispatch (send buffer -> staging) and
 * return (staging -> send buffer) are the same exchange, mirrored. */
static void row_xfers(moe_ep_call_t *c, int P, long long row_bytes, CUdeviceptr out, const long long *out_rows,
                      CUdeviceptr in, const long long *in_rows) {
    long long o = 0, i = 0;
    for (int d = 0; d < P; d++) {
        xfer(c, d, 0, out + (size_t)(o * row_bytes), (size_t)(out_rows[d] * row_bytes));
        xfer(c, d, 1, in + (size_t)(i * row_bytes), (size_t)(in_rows[d] * row_bytes));
        o += out_rows[d];
        i += in_rows[d];
    }
}

moe_status moe_ep_row_xfers(const moe_spec_t *s, int home, int P, const CUdeviceptr reg[MOE_EW_COUNT],
                            const long long *send_rows, const long long *recv_rows, moe_ep_call_t *c) {
    moe_ep_row_part_t parts[MOE_EP_ROW_PARTS];
    const int n = moe_ep_row_parts(s, home, parts);
    if (c->nx + 2LL * P * n > MOE_XFER_MAX)
        return moe_fail(MOE_ERR_UNSUPPORTED, "the EP group of %d ranks needs %lld transfers a step, more than %d", P,
                        2LL * P * n, MOE_XFER_MAX);
    const long long *out_rows = home ? recv_rows : send_rows, *in_rows = home ? send_rows : recv_rows;
    for (int i = 0; i < n; i++) /* part by part: a peer's receives meet the sends in this order */
        row_xfers(c, P, parts[i].row_bytes, reg[parts[i].from], out_rows, reg[parts[i].to], in_rows);
    return MOE_OK;
}

void moe_ep_block_xfers(moe_ep_call_t *c, int P, long long row_bytes, CUdeviceptr out, const long long *out_rows,
                        CUdeviceptr in, const long long *in_rows) {
    row_xfers(c, P, row_bytes, out, out_rows, in, in_rows);
}

moe_status moe_ep_read_sizes(const moe_ep_desc_t *ed, CUdeviceptr send_counts, CUdeviceptr recv_counts, CUstream st,
                             moe_ep_call_t *c) {
    const int P = ed->ep, S = ed->nheld;
    if (ed->capacity) {
        for (int d = 0; d < P; d++)
            c->send_rows[d] = c->recv_rows[d] = ed->capacity;
        c->recv_total = (long long)P * ed->capacity;
        return MOE_OK;
    }
    int *h = malloc(sizeof(int) * (size_t)(P + P * S));
    if (!h)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    CUresult r = moe_cu.cuStreamSynchronize(st);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyDtoH(h, send_counts, sizeof(int) * (size_t)P);
    if (r == CUDA_SUCCESS)
        r = moe_cu.cuMemcpyDtoH(h + P, recv_counts, sizeof(int) * (size_t)P * S);
    if (r != CUDA_SUCCESS) {
        free(h);
        return moe_fail(MOE_ERR_CUDA, "reading the dispatch counts: %s", moe_cu_error_string(r));
    }
    c->recv_total = 0;
    for (int d = 0; d < P; d++) {
        c->send_rows[d] = h[d];
        long long n = 0;
        for (int j = 0; j < S; j++)
            n += h[P + d * S + j];
        c->recv_rows[d] = n;
        c->recv_total += n;
    }
    free(h);
    return MOE_OK;
}

moe_status moe_ep_run_step(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                           const moe_forward_args *a, CUstream st, int step, moe_ep_call_t *c) {
    return moe_ep_run_step_train(ep, l, dn, a, NULL, st, step, c);
}

moe_status moe_ep_run_step_train(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                                 const moe_forward_args *a, const moe_ep_train_t *tr, CUstream st, int step,
                                 moe_ep_call_t *c) {
    const moe_plan_desc_t *pd = l->pd;
    const moe_ep_desc_t *ed = ep->ed;
    const moe_spec_t *s = &pd->spec;
    const int P = ed->ep, S = ed->nheld, T = a->tokens;
    const long long row_bytes = 2LL * s->hidden; /* a bf16 row: the results, as combine reads them */
    CUdeviceptr ws = (CUdeviceptr)(uintptr_t)a->workspace, reg[MOE_EW_COUNT];
    moe_ws_region_t wr[MOE_EW_COUNT]; /* laid out for this call's tokens (moe_plan_workspace_size; training:
                                       * moe_plan_train_workspace_size, the regions kept in `saved` empty) */
    if (tr)
        moe_ep_train_ws_layout(ed, pd, T, wr);
    else
        moe_ep_ws_layout(ed, pd, T, wr);
    moe_ws_region_t sv[MOE_ES_COUNT]; /* training: what the backward reads lives in the saved region */
    if (tr)
        moe_ep_saved_layout(ed, pd, T, tr->recompute_u, sv);
    for (int i = 0; i < MOE_EW_COUNT; i++) {
        const int k = tr ? moe_ep_saved_of(i) : -1;
        reg[i] = k >= 0 ? tr->saved + sv[k].offset : ws + wr[i].offset;
    }
    /* training: the logits, U (unless recomputed) and the down output (kept apart from the rows) saved */
    const CUdeviceptr logits = tr ? tr->saved + sv[MOE_ES_LOGITS].offset : 0,
                      ubuf = tr && !tr->recompute_u ? tr->saved + sv[MOE_ES_U].offset : 0,
                      out = tr ? tr->saved + sv[MOE_ES_OR].offset : reg[MOE_EW_XR];
    moe_status rc;
    c->nx = 0;
    switch (step) {
    case 0: { /* route, the send layout, the rows into the send buffer; counts go out */
        CU_CHECK(moe_cu.cuMemsetD32Async(reg[MOE_EW_COUNTS], 0, wr[MOE_EW_COUNTS].bytes / 4, st)); /* and route's tickets */
        CU_CHECK(moe_cu.cuMemsetD32Async(reg[MOE_EW_OVERFLOW], 0, 1, st));
        CU_CHECK(moe_cu.cuMemsetD8Async(reg[MOE_EW_SEND] + (size_t)(moe_ep_send_rows(ed, s, T) * row_bytes), 0,
                                        (size_t)row_bytes, st)); /* the null row */
        moe_route_fuse_args_t nofuse = {0}; /* route only: the send plan is its own kernel */
        void *ra[16] = {(void *)&a->x, (void *)&a->router_w, (void *)&a->router_bias, (void *)&a->router_logit_bias,
                        (void *)&T, &reg[MOE_EW_TOPK_IDX], &reg[MOE_EW_TOPK_W], &reg[MOE_EW_COUNTS],
                        &reg[MOE_EW_ROUTE_PART], &nofuse};
        moe_route_tail_args(s, a, &logits, ra, 10); /* a training plan's logits; given routing's ids */
        if ((rc = moe_launch_kernel(l, MOE_K_ROUTE, T, 0, st, ra, NULL)))
            return rc;
        CUdeviceptr owner = ep->owner_dev, slot = l->slot_table;
        void *sp[] = {&reg[MOE_EW_COUNTS], &owner, &slot, &reg[MOE_EW_SLOT_COUNTS], &reg[MOE_EW_OFFSETS],
                      &reg[MOE_EW_CURSOR], &reg[MOE_EW_SEND_COUNTS], &reg[MOE_EW_SEND_OFF], &reg[MOE_EW_OVERFLOW]};
        if ((rc = moe_launch_kernel(l, MOE_K_EP_SEND_PLAN, T, 0, st, sp, NULL)))
            return rc;
        /* with fp8 weights the scatter quantizes: e4m3 rows into send, their scales into send_sc
         * (templates/ep.lua; the bf16 scatter takes one argument less) */
        void *sc[] = {(void *)&a->x, &reg[MOE_EW_TOPK_IDX], &reg[MOE_EW_TOPK_W], &reg[MOE_EW_OFFSETS],
                      &reg[MOE_EW_CURSOR], &owner, (void *)&T, &reg[MOE_EW_SEND], &reg[MOE_EW_ROW_OF],
                      &reg[MOE_EW_SEND_SC]};
        if ((rc = moe_launch_kernel(l, MOE_K_EP_SCATTER, T, 0, st, sc, NULL)))
            return rc;
        for (int d = 0; d < P; d++) {
            xfer(c, d, 0, reg[MOE_EW_SLOT_COUNTS] + 4 * (size_t)d * S, 4 * (size_t)S);
            xfer(c, d, 1, reg[MOE_EW_RECV_COUNTS] + 4 * (size_t)d * S, 4 * (size_t)S);
        }
        return MOE_OK;
    }
    case 1: { /* the receive layout; rows go out */
        /* exact mode: the one host synchronization, for the sizes NCCL needs */
        if ((rc = moe_ep_read_sizes(ed, reg[MOE_EW_SEND_COUNTS], reg[MOE_EW_RECV_COUNTS], st, c)))
            return rc;
        void *rp[] = {&reg[MOE_EW_RECV_COUNTS], &reg[MOE_EW_CHUNK_SRC], &reg[MOE_EW_CHUNK_DST],
                      &reg[MOE_EW_CHUNK_ROWS], &reg[MOE_EW_SRC_BASE], &reg[MOE_EW_SLOT_OFF], &reg[MOE_EW_TILES],
                      &reg[MOE_EW_NUM_TILES], &reg[MOE_EW_OVERFLOW]};
        if ((rc = moe_launch_kernel(l, MOE_K_EP_RECV_PLAN, T, 0, st, rp, NULL)))
            return rc;
        return moe_ep_row_xfers(s, 0, P, reg, c->send_rows, c->recv_rows, c);
    }
    case 2: { /* slot-major rows, the FFN, the results back to the staging layout; they go home */
        int dir = 0;
        /* fp8: the scales move with the e4m3 rows (dir 0; the bf16 rows kernel takes two arguments less) */
        void *ra[] = {&dir, &reg[MOE_EW_STAGE], &reg[MOE_EW_XR], &reg[MOE_EW_SRC_BASE], &reg[MOE_EW_CHUNK_SRC],
                      &reg[MOE_EW_CHUNK_DST], &reg[MOE_EW_CHUNK_ROWS], &reg[MOE_EW_STAGE_SC], &reg[MOE_EW_XSC]};
        if ((rc = moe_launch_kernel(l, MOE_K_EP_ROWS, T, c->recv_total, st, ra, NULL)))
            return rc;
        /* the M tiles S slots' received rows can fill: each row once, each slot's block aligned */
        long long tiles = moe_max_tiles(c->recv_total, 1, S, pd->align);
        moe_ffn_args_t f = {.tokens = T, .grid_tiles = tiles > 0 ? tiles : 1, .xs = reg[MOE_EW_XR],
                            .tiles = reg[MOE_EW_TILES], .num_tiles = reg[MOE_EW_NUM_TILES],
                            .offsets = reg[MOE_EW_SLOT_OFF], .hbuf = reg[MOE_EW_HBUF], .out = out,
                            .w1p = a->w1p, .b1p = a->b1p, .w2 = a->w2, .b2 = a->b2, .ubuf = ubuf,
                            .xsc = reg[MOE_EW_XSC], .hsc = reg[MOE_EW_HSC], .w1s = a->w1s, .w2s = a->w2s};
        /* training: the generated GEMMs (they store U); the combine runs at home, after the rows return */
        if ((rc = moe_run_ffn(l, tr ? NULL : dn, &f, st, NULL, NULL)))
            return rc;
        dir = 1;
        ra[2] = (void *)&out;
        if ((rc = moe_launch_kernel(l, MOE_K_EP_ROWS, T, c->recv_total, st, ra, NULL)))
            return rc;
        return moe_ep_row_xfers(s, 1, P, reg, c->send_rows, c->recv_rows, c);
    }
    case 3: { /* combine on the token's own rank */
        void *ca[] = {&reg[MOE_EW_SEND], &reg[MOE_EW_ROW_OF], &reg[MOE_EW_TOPK_W], (void *)&T, (void *)&a->y};
        return moe_launch_kernel(l, MOE_K_COMBINE, T, 0, st, ca, NULL);
    }
    }
    return moe_fail(MOE_ERR_INVALID_ARG, "moe_ep_run_step: no step %d", step);
}

/* A step's transfers over a communicator: one NCCL group of sends and receives. */
moe_status moe_ep_send_recv(const moe_ep_t *ep, const moe_ep_call_t *c, CUstream st) {
    ncclComm_t comm = ep->ep_comm;
    NCCL_TRY(moe_nccl.ncclGroupStart());
    for (int i = 0; i < c->nx; i++) {
        const moe_xfer_t *x = &c->x[i];
        ncclResult_t r = x->recv ? moe_nccl.ncclRecv((void *)(uintptr_t)x->ptr, x->bytes, ncclUint8, x->peer, comm, st)
                                 : moe_nccl.ncclSend((const void *)(uintptr_t)x->ptr, x->bytes, ncclUint8, x->peer,
                                                     comm, st);
        if (r != ncclSuccess) {
            moe_nccl.ncclGroupEnd();
            return moe_fail(MOE_ERR_NCCL, "%s of %zu bytes with EP peer %d: %s", x->recv ? "ncclRecv" : "ncclSend",
                            x->bytes, x->peer, moe_nccl_error_string(r));
        }
    }
    NCCL_TRY(moe_nccl.ncclGroupEnd());
    return MOE_OK;
}

moe_status moe_ep_forward_steps(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                                const moe_forward_args *a, const moe_ep_train_t *tr, CUstream st) {
    moe_ep_call_t *c = malloc(sizeof *c);
    if (!c)
        return moe_fail(MOE_ERR_NO_MEMORY, "out of memory");
    moe_status rc = MOE_OK;
    for (int step = 0; step < MOE_EP_STEPS && !rc; step++) {
        rc = moe_ep_run_step_train(ep, l, dn, a, tr, st, step, c);
        if (!rc && c->nx)
            rc = moe_ep_send_recv(ep, c, st);
    }
    free(c);
    return rc;
}

moe_status moe_ep_forward(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                          const moe_forward_args *a, CUstream st) {
    if (ep->unconnected)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_forward: this plan has no communicator (a test plan whose caller "
                        "moves the data); drive it with moe_ep_step");
    return moe_ep_forward_steps(ep, l, dn, a, NULL, st);
}

/* ---- the FSDP gather ---------------------------------------------------- */

static const char *const gather_names[MOE_GATHER_PARTS] = {"w1p", "b1p", "w2", "b2", "w1s", "w2s"};

/* Bytes of one expert of gather part i; 0 = not in this spec. fp8 weights
 * are one byte per element with their fp32 scales beside them. */
long long moe_ep_slot_elems(const moe_spec_t *s, int i) {
    const long long H = s->hidden, F = s->ffn;
    switch (i) {
    case MOE_GATHER_W1P: return 2 * F * H;
    case MOE_GATHER_B1P: return s->ffn_bias ? 2 * F : 0;
    case MOE_GATHER_W2:  return H * F;
    case MOE_GATHER_B2:  return s->ffn_bias ? H : 0;
    }
    return 0;
}

static size_t expert_bytes(const moe_spec_t *s, int i) {
    const int fp8 = moe_spec_fp8(s);
    switch (i) {
    case MOE_GATHER_W1P:
    case MOE_GATHER_W2:  return (fp8 ? 1 : 2) * (size_t)moe_ep_slot_elems(s, i);
    case MOE_GATHER_B1P:
    case MOE_GATHER_B2:  return 2 * (size_t)moe_ep_slot_elems(s, i);
    case MOE_GATHER_W1S: return fp8 ? 4 * (size_t)moe_spec_fp8_scales(s, 0) : 0;
    case MOE_GATHER_W2S: return fp8 ? 4 * (size_t)moe_spec_fp8_scales(s, 1) : 0;
    }
    return 0;
}


moe_status moe_ep_gather_xfers(const moe_mesh_plan_t *mp, int rank, const moe_spec_t *s, const moe_gather_args *g,
                               moe_gather_part_t parts[MOE_GATHER_PARTS], int *nparts, moe_ep_call_t *c) {
    const void *src[MOE_GATHER_PARTS] = {g->stored.w1p, g->stored.b1p, g->stored.w2, g->stored.b2};
    void *dst[MOE_GATHER_PARTS] = {g->held_w1p, g->held_b1p, g->held_w2, g->held_b2};
    if (moe_spec_fp8(s)) { /* read only then: a caller built before the scales' fields passes a shorter struct */
        src[MOE_GATHER_W1S] = g->stored_w1s, src[MOE_GATHER_W2S] = g->stored_w2s;
        dst[MOE_GATHER_W1S] = g->held_w1s, dst[MOE_GATHER_W2S] = g->held_w2s;
    }
    const int shards = moe_ep_fsdp_shards(mp), F = shards ? mp->size[MOE_AXIS_FSDP] : 1,
              me = shards ? mp->ranks[rank].fsdp_rank : 0;
    *nparts = 0;
    if (c)
        c->nx = 0;
    for (int i = 0; i < MOE_GATHER_PARTS; i++) {
        const size_t eb = expert_bytes(s, i);
        if (!eb)
            continue;
        if (!src[i] || !dst[i])
            return moe_fail(MOE_ERR_INVALID_ARG, "moe_gather_weights: tensor %d (%s) is NULL", i, gather_names[i]);
        moe_gather_part_t *p = &parts[(*nparts)++];
        *p = (moe_gather_part_t){i, src[i], (CUdeviceptr)(uintptr_t)dst[i], eb, eb * (size_t)mp->nstored};
        /* every peer's shard lands at its FSDP rank's place, which is slot
         * order (the mesh plan gathers held = peers' stored, by fsdp rank) */
        for (int f = 0; c && F > 1 && f < F; f++) {
            if (f == me)
                continue;
            if (c->nx + 2 > MOE_XFER_MAX)
                return moe_fail(MOE_ERR_UNSUPPORTED, "moe_gather_weights: more than %d transfers", MOE_XFER_MAX);
            xfer(c, f, 0, p->base + p->stride * (size_t)me, p->stride);
            xfer(c, f, 1, p->base + p->stride * (size_t)f, p->stride);
        }
    }
    return MOE_OK;
}

size_t moe_ep_gather_bytes(const moe_mesh_plan_t *mp, const moe_spec_t *s) {
    if (!moe_ep_fsdp_shards(mp))
        return 0;
    size_t eb = 0;
    for (int i = 0; i < MOE_GATHER_PARTS; i++)
        eb += expert_bytes(s, i);
    return eb * (size_t)(mp->nheld - mp->nstored);
}

moe_status moe_ep_gather_local(const moe_ep_t *ep, const moe_spec_t *s, const moe_gather_args *g, CUstream st, moe_gather_part_t parts[MOE_GATHER_PARTS], int *nparts,
                               moe_ep_call_t *c) {
    moe_status rc = moe_ep_gather_xfers(ep->mp, ep->rank, s, g, parts, nparts, c);
    const int me = moe_ep_fsdp_shards(ep->mp) ? ep->me->fsdp_rank : 0;
    for (int i = 0; i < *nparts && !rc; i++) {
        const moe_gather_part_t *p = &parts[i];
        CUdeviceptr mine = p->base + p->stride * (size_t)me;
        if (g->pack) {
            rc = g->pack(g->user, p->tensor, p->src, (void *)(uintptr_t)mine, p->stride, st);
            if (rc)
                return moe_fail(rc, "moe_gather_weights: the pack hook failed on tensor %d (%s) with status %d",
                                p->tensor, gather_names[p->tensor], rc);
        } else if ((const void *)(uintptr_t)mine != p->src) {
            CU_CHECK(moe_cu.cuMemcpyDtoDAsync(mine, (CUdeviceptr)(uintptr_t)p->src, p->stride, st));
        }
    }
    return rc;
}

moe_status moe_ep_gather_nccl(const moe_ep_t *ep, const moe_gather_part_t *parts, int nparts, CUstream st) {
    for (int i = 0; i < nparts; i++) {
        const moe_gather_part_t *p = &parts[i];
        char *base = (char *)(uintptr_t)p->base;
        ncclResult_t r = moe_nccl.ncclAllGather(base + p->stride * (size_t)ep->me->fsdp_rank, base, p->stride,
                                                ncclUint8, ep->fsdp_comm, st);
        if (r != ncclSuccess)
            return moe_fail(MOE_ERR_NCCL, "ncclAllGather of %zu bytes (%s) over the FSDP group: %s", p->stride,
                            gather_names[p->tensor], moe_nccl_error_string(r));
    }
    return MOE_OK;
}

moe_status moe_ep_gather(const moe_ep_t *ep, const moe_spec_t *s, const moe_gather_args *g, CUstream st) {
    const int shards = moe_ep_fsdp_shards(ep->mp);
    if (shards && ep->unconnected)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_gather_weights: this plan has no communicator");
    moe_gather_part_t parts[MOE_GATHER_PARTS];
    int n = 0;
    moe_status rc = moe_ep_gather_local(ep, s, g, st, parts, &n, NULL);
    if (!rc && shards) /* the same movement as moe_ep_gather_xfers lists, as NCCL all-gathers */
        rc = moe_ep_gather_nccl(ep, parts, n, st);
    return rc;
}
