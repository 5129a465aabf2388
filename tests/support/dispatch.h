/* dispatch.h — expert-parallel dispatch and combine: the layouts, in plain C;
 * the CPU model the EP GPU kernels mirror, test support
 * (build/libmoegen_test.a), not part of the shipped library.
 *
 * One rank routes its T tokens to K global experts each (topk_idx [T, K],
 * slot (t, k) is t*K + k). Expert g lives on EP peer owner_ep_rank[g] at that
 * peer's local slot slot[g] — the mesh plan's routing table (mesh.h; docs/DESIGN.md,
 * "Mesh, ownership and the plan-time check"). Nothing here assumes an EP rank
 * holds a contiguous range of experts: every position comes from the table.
 * These functions compute where every row goes; the GPU path mirrors them in
 * kernels and moves the rows with NCCL (or a peer copy).
 *
 * Buffers, for a rank `me` of an EP group of ep ranks with nheld slots each:
 *
 *   send buffer   destination-rank-major; within a destination by its local
 *                 slot; within a slot by (t, k) order. Deterministic (a
 *                 counting sort, no atomics).
 *                   exact mode:    destination d's block starts at
 *                                  send_off[d] = send_counts[0] + .. + send_counts[d-1]
 *                   capacity mode: destination d's block starts at d*C and
 *                                  holds at most C rows (buffer: ep*C rows)
 *   counts        slot_counts[d*nheld + j]: rows this rank sends to peer d
 *                 for d's slot j. Peer d receives row d of every source's
 *                 slot_counts (an all-to-all of nheld ints per pair) as its
 *                 recv_counts[s*nheld + j].
 *   receive       expert-major: rows grouped by local slot, slot j's block
 *                 starting at slot_off[j], a multiple of `align` (the GEMM M
 *                 tile); within a slot by source rank, then source order. The
 *                 rows from source s for slot j form the chunk (s, j): it sits
 *                 at chunk_src[s*nheld + j] within source s's block (of the
 *                 source's send buffer, or of the receiver's [ep, C] buffer in
 *                 capacity mode) and lands at row chunk_dst[s*nheld + j].
 *   return        the results go back in the order they were sent: chunk
 *                 (s, j) of the results returns to source s's return buffer
 *                 at the place it left from, so the return buffer has the
 *                 send buffer's layout and the row of slot (t, k) there is
 *                 send_pos[t*K + k] (-1: dropped, see capacity mode).
 *   combine       y[t] = Σ_k w[t,k] · ret[send_pos[t*K + k]], k increasing.
 *
 * No function prints, exits or keeps state. Each returns a moe_dispatch_status_t;
 * on any status other than MOE_DISPATCH_OK it writes nothing except what its
 * contract names for that status. */
#ifndef MOEGEN_DISPATCH_H
#define MOEGEN_DISPATCH_H

#include "mesh.h"

typedef enum {
    MOE_DISPATCH_OK = 0,
    MOE_DISPATCH_EINVAL = 1,      /* bad argument: NULL, size < 0, index out of range */
    MOE_DISPATCH_ENOMEM = 2,
    MOE_DISPATCH_OVERFLOW = 3,    /* capacity mode: rows beyond capacity, drop policy off */
    MOE_DISPATCH_ESPACE = 4,      /* the caller's tile table is too short */
} moe_dispatch_status_t;

/* Capacity-mode flags. Off (0) by default: overflow is an error. */
enum { MOE_DISPATCH_DROP = 1u };  /* drop rows beyond capacity, highest (t, k) first */

/* One EP group's routing table. The arrays are borrowed, not copied. */
typedef struct {
    int experts;                  /* E */
    int ep;                       /* EP group size; peers are ep ranks 0..ep-1 */
    int nheld;                    /* slots per EP rank after the gather */
    const int *owner_ep_rank;     /* [E] EP rank that holds expert g */
    const int *slot;              /* [E] g's slot on that rank */
} moe_dispatch_route_t;

/* One entry per `align` rows of each slot of the receive buffer, in slot
 * order; empty slots have none. Same layout as the kernels' moe_tile_t
 * (int4: {slot, row_start, rows, 0}). */
typedef struct {
    int slot, row_start, rows, pad;
} moe_dispatch_tile_t;

/* A short name of a status ("ok", "overflow", ...); "unknown" otherwise. */
const char *moe_dispatch_status_name(int status);

/* The routing table of a built mesh plan (the same for every EP group).
 * Borrows the plan's arrays: valid while the plan is. */
moe_dispatch_route_t moe_dispatch_route_of_plan(const moe_mesh_plan_t *mp);

/* Exact mode, sender side. For `tokens` >= 0 tokens routed to top_k >= 1
 * experts each (topk_idx [tokens*top_k], each in [0, E)), writes
 *   send_counts [ep]          rows for each peer
 *   send_off    [ep + 1]      first row of each peer's block; [ep] = total
 *                             (may be NULL)
 *   slot_counts [ep*nheld]    rows for each (peer, peer's slot)
 *   send_pos    [tokens*top_k] row of slot (t, k) in the send buffer
 * EINVAL (nothing written) on bad arguments or a routing table entry out of
 * range; ENOMEM when scratch memory runs out. */
int moe_dispatch_send_layout(const moe_dispatch_route_t *rt, const int *topk_idx, int tokens, int top_k,
                             int *send_counts, int *send_off, int *slot_counts, int *send_pos);

/* Capacity mode, sender side: each (source, destination) pair carries at most
 * `capacity` >= 0 rows, destination d's block at rows d*capacity.. of a send
 * buffer of ep*capacity rows. Counts rows per destination in (t, k) order;
 * those past capacity are the excess. *excess (required) gets the total
 * excess and excess_per_dest [ep] (may be NULL) each destination's.
 *   No excess: as moe_dispatch_send_layout (send_pos < ep*capacity); OK.
 *   Excess, flags without MOE_DISPATCH_DROP: returns MOE_DISPATCH_OVERFLOW and
 *     writes only *excess and excess_per_dest; nothing is dropped, and the
 *     caller must not send (use exact mode, or a larger capacity).
 *   Excess, MOE_DISPATCH_DROP: per destination the first `capacity` rows in
 *     (t, k) order are kept, the rest dropped (send_pos -1, left out of the
 *     counts); returns OK with the number dropped in *excess.
 * Outputs: send_counts [ep] (rows kept, each <= capacity), slot_counts
 * [ep*nheld] (kept), send_pos [tokens*top_k]. */
int moe_dispatch_send_layout_capacity(const moe_dispatch_route_t *rt, const int *topk_idx, int tokens,
                                      int top_k, int capacity, unsigned flags, int *send_counts,
                                      int *slot_counts, int *send_pos, int *excess, int *excess_per_dest);

/* Receiver side, either mode. From recv_counts [ep*nheld] (rows from source s
 * for local slot j, the all-to-all of the senders' slot_counts) and align >= 1:
 *   chunk_src [ep*nheld]   offset of chunk (s, j) within source s's block:
 *                          recv_counts[s][0] + .. + recv_counts[s][j-1]
 *   chunk_dst [ep*nheld]   its first row in the receive buffer (for an empty
 *                          chunk, where it would start)
 *   slot_off  [nheld + 1]  first row of slot j, a multiple of align;
 *                          [nheld] = the receive buffer's rows, padding included
 *   tiles     [max_tiles]  the tile table, *num_tiles entries
 * Padding rows (a slot's block rounded up to align) belong to no tile. When
 * max_tiles is short, returns ESPACE and writes only *num_tiles, the length
 * needed (tiles may then be NULL: max_tiles = 0 asks for the length). */
int moe_dispatch_recv_layout(int ep, int nheld, int align, const int *recv_counts, int *chunk_src,
                             int *chunk_dst, int *slot_off, moe_dispatch_tile_t *tiles, int max_tiles,
                             int *num_tiles);

/* Combine on the source rank: for each token t,
 *   y[t*width + h] = Σ_k topk_w[t*top_k + k] · ret[ret_pos[t*top_k + k]*width + h]
 * accumulated in fp32 from 0, k increasing; ret_pos < 0 (dropped) adds
 * nothing. ret has ret_rows rows of `width` floats; ret_pos is the send
 * layout's send_pos. Writes all tokens*width values of y. EINVAL (nothing
 * written) when a position is >= ret_rows. */
int moe_dispatch_combine(int tokens, int top_k, int width, const float *topk_w, const int *ret_pos,
                         const float *ret, int ret_rows, float *y);

#endif
