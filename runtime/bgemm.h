/* bgemm.h — the backward grouped GEMMs (issue #19 and its notation;
 * docs/DESIGN.md "Backward GEMMs"): four generated kernel families,
 * planned when the spec has training = true, launched on the caller's
 * stream with no host synchronization (the ragged per-slot sizes are read on
 * the device from the forward's tables). Internal to libmoegen; the
 * backward (moe_backward) calls it with the plan's launcher
 * (&plan->launcher).
 *
 * Rows are the forward's expert-major rows: slot g's rows start at
 * offsets[g] (aligned to the GEMM bm) and number counts[g]; pad rows
 * between slots are never read (the dgrads mask rows past each M tile's
 * `rows`, the wgrads reduce over [offsets[g], offsets[g] + counts[g]) only).
 * Buffers are row-major, dtype = the spec's (bf16 or fp16), fp32 where said.
 * F is the spec's ffn, H its hidden; 2F columns are in the packed gate/up
 * order of gen/pack_geom.h (granules of MOE_PAIR_GRANULE gate columns, then
 * the matching up columns).
 *
 *   kind                a (dtype)           b (dtype)               out
 *   DGRAD_DOWN  dU  = act'(u) . (a . W2[e])  (dA = a . W2 never stored)
 *                       dys [rows, H]       w2  [slots, H, F]       dU [rows, 2F] dtype, packed;
 *                       u = Ur [rows, 2F] dtype, packed (the saved or recomputed pre-activation, bias
 *                       included); out may equal u (each element is read, then written, by one thread)
 *   DGRAD_UP    dXs = a . W1p[e]
 *                       dU  [rows, 2F]      w1p [slots, 2F, H]      dXs [rows, H] dtype
 *   WGRAD_UP    dW1p[slot] = beta*dW1p[slot] + a_gᵀ . b_g   (K = slot g's rows)
 *                       dU  [rows, 2F]      xs  [rows, H]           dw1p [slots, 2F, H] fp32, packed rows
 *   WGRAD_DOWN  dW2[slot]  = beta*dW2[slot]  + a_gᵀ . b_g
 *                       dys [rows, H]       A = hbuf [rows, F]      dw2  [slots, H, F] fp32
 *   (the wgrads' out in the dtype with spec weight_grads = "dtype": the fp32 sum rounded once, beta 1 the old
 *   value plus it, rounded)
 *
 * The dgrads walk the tile table (each entry's slot is the weight slot, as
 * in the forward). The wgrads walk g = 0 .. slots-1 (the routed experts,
 * then the shared expert's slots) and write slot slot_of[g] of the output
 * (the launcher's slot table; the identity on a mesh of one device). A slot
 * with 0 rows writes zeros (beta 0) or leaves its output untouched (beta 1).
 * dW1p comes out in the packed row order of W1p (unpack with
 * gen/pack_geom.h's moe_unpack_row, as the weights).
 *
 * Not computed here: the bias gradients db1p (column sums of dU per slot)
 * and db2 (column sums of dys per slot) — the backward's own column-sum
 * kernel does them. */
#ifndef MOEGEN_BGEMM_H
#define MOEGEN_BGEMM_H

#include "launch.h"

typedef enum {
    MOE_BGEMM_DGRAD_DOWN = 0, /* dU [rows, 2F] = act'(Ur) . (dys . W2[e]) */
    MOE_BGEMM_DGRAD_UP,       /* dXs [rows, H] = dU . W1p[e] */
    MOE_BGEMM_WGRAD_UP,       /* dW1p[e] (+)= dU_eᵀ . xs_e, fp32 (or the dtype: spec weight_grads) */
    MOE_BGEMM_WGRAD_DOWN,     /* dW2[e] (+)= dys_eᵀ . A_e, as dW1p */
    MOE_BGEMM_KINDS
} moe_bgemm_kind;

typedef struct {
    int tokens;              /* the call's tokens (<= the plan's capacity): sizes the dgrads' grid */
    long long grid_tiles;    /* dgrads: M tiles of the grid (>= the table's length); wgrads: the rows' extent in
                                M tiles (sm_90a's tensor maps); 0 = the plan's max at tokens */
    CUdeviceptr tiles;       /* dgrads: the forward's tile table (workspace region "tiles") */
    CUdeviceptr num_tiles;   /* dgrads: its length (int, on the device) */
    CUdeviceptr offsets;     /* wgrads: int [slots + 1] each slot's first row (workspace region "offsets") */
    CUdeviceptr counts;      /* wgrads: int [slots] each slot's rows (workspace region "counts") */
    CUdeviceptr a, b;        /* the operands of the table above */
    CUdeviceptr u;           /* DGRAD_DOWN: Ur; 0 for the others */
    CUdeviceptr out;         /* the output of the table above (wgrads: 16-byte aligned) */
    int beta;                /* wgrads: 0 = write, 1 = accumulate into out; dgrads: must be 0 */
} moe_bgemm_args;

/* Enqueue the backward GEMM `kind` with arguments a on st. Returns MOE_OK,
 * MOE_ERR_UNSUPPORTED when the plan has no backward kernels (the spec has
 * no training = true, or a module compiled without them), or
 * MOE_ERR_INVALID_ARG for a missing pointer, a wgrad's misaligned out or a
 * bad beta (the last error says which). No host synchronization;
 * capturable in a CUDA graph. */
moe_status moe_bgemm_launch(const moe_launcher_t *l, moe_bgemm_kind kind, const moe_bgemm_args *a, CUstream st);

#endif
