/* ep.h — the multi-device part of a plan: the mesh tables of this rank, the
 * NCCL communicators of its EP and FSDP groups, and the expert-parallel
 * forward (dispatch, FFN on received rows, return, combine) as steps with
 * the data movement between them described as transfers. Every kernel
 * (route, the dispatch kernels, the FFN, combine) runs through the plan's
 * launcher (launch.h), the FFN also through its cuDNN part; ep.c never sees
 * the plan. Internal. */
#ifndef MOEGEN_EP_H
#define MOEGEN_EP_H

#include "cudnn.h"
#include "driver.h"
#include "ep_plan.h"
#include "launch.h"
#include "mesh.h"
#include "moe.h"
#include "nccl_dl.h"

typedef struct moe_ep {
    const moe_mesh_plan_t *mp;      /* the plan's mesh tables (moe_plan_desc_t.mesh) */
    int rank;                       /* global rank */
    const moe_mesh_rank_t *me;
    int dispatch;                   /* mesh.ep > 1: rows move between EP ranks */
    int training;                   /* the spec has training = true: the EP backward's table is loaded */
    int unconnected;                /* no communicator: the caller moves the data between ranks (moe_ep_step) */
    const moe_ep_desc_t *ed;        /* the plan's EP part (moe_plan_desc_t.ep); valid when dispatch */
    CUdeviceptr owner_dev;          /* [E] owner_ep_rank */
    CUdeviceptr ident_dev;          /* training: [S] the identity, the EP backward's slot table (its weight
                                       gradients are by held slot; runtime/ep_bwd.c) */
    ncclComm_t ep_comm, fsdp_comm;
} moe_ep_t;

/* One transfer of a step: `bytes` from (send) or into (recv) ptr, with the
 * peer's rank in the step's group (EP group for dispatch, FSDP group for
 * the gather). Sends to a peer meet that peer's receives from this rank in
 * list order (as NCCL matches point-to-point calls). */
typedef struct {
    int peer, recv;
    CUdeviceptr ptr;
    size_t bytes;
} moe_xfer_t;

#define MOE_EP_STEPS 4
#define MOE_XFER_MAX 8192

/* Per-call state of an expert-parallel forward (host side). */
typedef struct {
    long long send_rows[4096], recv_rows[4096];   /* per peer, exact mode (read after step 0) */
    long long recv_total;
    int nx;
    moe_xfer_t x[MOE_XFER_MAX];
} moe_ep_call_t;

/* The mesh part for plan pd (which must outlive it) and rank (no device
 * work). */
moe_status moe_ep_create(moe_ep_t **out, const moe_plan_desc_t *pd, int rank, char *err, size_t errlen);
void moe_ep_destroy(moe_ep_t *ep);

/* Split the mesh communicator `comm` into the EP and FSDP groups (collective
 * over comm) after checking its size, rank and device against the plan. */
moe_status moe_ep_connect(moe_ep_t *ep, void *comm, int device);

/* The owner table on the device (when dispatch). The dispatch kernels are
 * the launcher's (moe_launcher_t.ep_fn). */
moe_status moe_ep_load(moe_ep_t *ep);

/* Append to c the transfers of the rows of a dispatch step (host only, no
 * device work): home = 0, the rows out (step 1: send buffer -> the peers'
 * staging), home = 1, the results back (step 2: staging -> the sources'
 * send buffer); one transfer per peer and part (moe_ep_row_parts: with fp8
 * weights the e4m3 rows, then their scales), send_rows[d] rows of this
 * rank's send-buffer side with EP peer d, recv_rows[d] of its staging side;
 * reg: the workspace's regions (moe_ep_ws_layout). MOE_ERR_UNSUPPORTED,
 * nothing appended, when c would hold more than MOE_XFER_MAX. */
moe_status moe_ep_row_xfers(const moe_spec_t *s, int home, int P, const CUdeviceptr reg[MOE_EW_COUNT],
                            const long long *send_rows, const long long *recv_rows, moe_ep_call_t *c);

/* The rows this rank sends to and receives from each EP peer in a step of
 * rows, into c (send_rows, recv_rows, recv_total): in exact mode read from
 * the device's per-peer send counts [P] and per-(source, slot) receive
 * counts [P, S] (one host synchronization of st), in capacity mode every
 * pair's C. The forward's step 1 and the backward's first step. */
moe_status moe_ep_read_sizes(const moe_ep_desc_t *ed, CUdeviceptr send_counts, CUdeviceptr recv_counts, CUstream st,
                             moe_ep_call_t *c);

/* Step `step` (0 .. MOE_EP_STEPS-1) of an expert-parallel forward: enqueue
 * its kernels on st (each through l, the FFN through l and dn) and
 * list in c the transfers that must complete before the next step (over
 * the EP group). Exact mode synchronizes st in step 1. */
moe_status moe_ep_run_step(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                           const moe_forward_args *a, CUstream st, int step, moe_ep_call_t *c);

/* One part's row exchange (the backward's dtype rows; moe_ep_row_xfers lists
 * the forward's parts through it): peer d gets out_rows[d] rows of `out` (the
 * peers' blocks back to back) while d's in_rows[d] rows arrive into `in`,
 * likewise. The dispatch is (send buffer, staging), the return (staging,
 * send buffer); the backward runs them in the other order (ep_bwd.h). */
void moe_ep_block_xfers(moe_ep_call_t *c, int P, long long row_bytes, CUdeviceptr out, const long long *out_rows,
                        CUdeviceptr in, const long long *in_rows);

/* A training forward's steps (moe_forward_train on an EP plan): the same
 * steps, the regions the backward reads (moe_ep_saved_of) in the saved
 * region instead of the workspace, route saving the logits, the up GEMM
 * storing U (unless recompute_u), the down output kept apart from the
 * received rows; the generated GEMMs only. tr NULL: the plain forward. */
typedef struct {
    CUdeviceptr saved;              /* moe_ep_saved_layout at the call's tokens, 256-byte aligned */
    int recompute_u;
} moe_ep_train_t;
moe_status moe_ep_run_step_train(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                                 const moe_forward_args *a, const moe_ep_train_t *tr, CUstream st, int step,
                                 moe_ep_call_t *c);

/* Every step of a forward (tr: a training forward's, or NULL) on the plan's
 * communicator: each step's kernels on st, then its transfers over NCCL.
 * moe_ep_forward and the EP training forward; the caller has refused an
 * unconnected plan. */
moe_status moe_ep_forward_steps(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                                const moe_forward_args *a, const moe_ep_train_t *tr, CUstream st);

/* A step's transfers as one NCCL group of sends and receives on st. */
moe_status moe_ep_send_recv(const moe_ep_t *ep, const moe_ep_call_t *c, CUstream st);

/* The whole forward, the transfers done with NCCL on st. */
moe_status moe_ep_forward(const moe_ep_t *ep, const moe_launcher_t *l, const moe_cudnn_t *dn,
                          const moe_forward_args *a, CUstream st);

/* ---- the FSDP gather (moe_gather_weights) ---------------------------------
 *
 * The gather is a list of parts, each one tensor of whole experts: the
 * rank's stored shard (src) goes to its place in the held buffer (base +
 * stride · the rank's FSDP index) and every FSDP peer's shard to its own
 * place, which is slot order. bf16 weights and biases, fp8 e4m3 weights and
 * their fp32 scales are all just parts, so gate/up pairing and the 128 x 128
 * scale blocks move intact (whole packed experts). */
enum { MOE_GATHER_W1P, MOE_GATHER_B1P, MOE_GATHER_W2, MOE_GATHER_B2, MOE_GATHER_W1S, MOE_GATHER_W2S,
       MOE_GATHER_PARTS };

typedef struct {
    int tensor;                     /* MOE_GATHER_*: the pack hook's tensor index */
    const void *src;                /* the rank's stored shard */
    CUdeviceptr base;               /* the held buffer (slot 0) */
    size_t expert_bytes;            /* one expert */
    size_t stride;                  /* one FSDP rank's shard in the held buffer: expert_bytes · stored */
} moe_gather_part_t;

/* The parts of rank `rank`'s gather for spec s from g (*nparts of them, in
 * tensor order), and in c (may be NULL) the transfers over its FSDP group
 * that complete them: its shard of each part to every FSDP peer, each
 * peer's shard into its place. MOE_ERR_INVALID_ARG naming the tensor when
 * one the spec needs is NULL. Host only: no device work. */
moe_status moe_ep_gather_xfers(const moe_mesh_plan_t *mp, int rank, const moe_spec_t *s, const moe_gather_args *g,
                               moe_gather_part_t parts[MOE_GATHER_PARTS], int *nparts, moe_ep_call_t *c);

/* Elements of one expert slot of weight tensor i (MOE_GATHER_W1P, _B1P,
 * _W2, _B2: w1p 2F x H, b1p 2F, w2 H x F, b2 H; the biases 0 without
 * ffn_bias): the gather's parts and the gradients the FSDP reduce-scatter
 * sums (fsdp_grad.c) have these shapes. */
long long moe_ep_slot_elems(const moe_spec_t *s, int i);

/* Does fsdp shard the experts (held > stored: the gather moves them, else
 * it is a local copy)? */
static inline int moe_ep_fsdp_shards(const moe_mesh_plan_t *mp) { return mp->nheld > mp->nstored; }

/* The bytes one gather moves into rank `rank` over its FSDP group (0 when
 * the gather is a local copy): the sum over the spec's parts. */
size_t moe_ep_gather_bytes(const moe_mesh_plan_t *mp, const moe_spec_t *s);

/* The gather's local part: the parts (moe_ep_gather_xfers, with the
 * transfers in c when c is not NULL), and each part's shard written to its
 * place by the pack hook, or copied there unless it is there already. */
moe_status moe_ep_gather_local(const moe_ep_t *ep, const moe_spec_t *s, const moe_gather_args *g, CUstream st, moe_gather_part_t parts[MOE_GATHER_PARTS], int *nparts,
                               moe_ep_call_t *c);

/* The parts' movement over the FSDP group: one NCCL all-gather per part, in
 * place, on st. */
moe_status moe_ep_gather_nccl(const moe_ep_t *ep, const moe_gather_part_t *parts, int nparts, CUstream st);

/* The whole gather: the local part, then (when fsdp shards the experts)
 * the all-gathers on st. */
moe_status moe_ep_gather(const moe_ep_t *ep, const moe_spec_t *s, const moe_gather_args *g, CUstream st);

#endif
