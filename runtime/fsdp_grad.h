/* fsdp_grad.h — the weight gradients' way back over the FSDP group
 * (moe_reduce_scatter_grads, the counterpart of moe_gather_weights): what
 * each rank's held gradients become, as a plain description the CPU tests
 * play on several ranks in memory, and its NCCL execution. Internal. */
#ifndef MOEGEN_FSDP_GRAD_H
#define MOEGEN_FSDP_GRAD_H

#include "driver.h"
#include "launch.h"
#include "mesh.h"
#include "moe.h"
#include "spec.h"

struct moe_ep;

/* How one gradient tensor reaches the stored layout. */
typedef enum {
    MOE_GRAD_NONE = 0,           /* not in this spec (b1p, b2 without ffn_bias) */
    MOE_GRAD_COPY,               /* no FSDP group: stored = held, elements [0, count) */
    MOE_GRAD_REDUCE_SCATTER,     /* held is `group` chunks of count, chunk f the experts FSDP rank f stores:
                                  * stored = Σ over the group's ranks of their chunk fsdp_rank */
    MOE_GRAD_ALL_REDUCE,         /* held = stored on every FSDP rank: stored = Σ over the group of held */
} moe_grad_op_t;

#define MOE_GRAD_TENSORS 4       /* dw1p, db1p, dw2, db2 */

typedef struct {
    moe_grad_op_t op;
    int group;                   /* FSDP ranks summed over (1 for COPY) */
    long long count;             /* elements this rank ends with: its stored experts' gradient */
    long long held;              /* elements of the held gradient it starts from */
} moe_grad_part_t;

/* The four tensors' parts of rank `rank` of mesh plan mp for spec s (0
 * dw1p, 1 db1p, 2 dw2, 3 db2). A shared expert's slots (one device only)
 * follow the routed ones in both layouts. Returns 0, or -1 (why in err)
 * for a mesh whose backward is not built (mesh.ep > 1). */
int moe_fsdp_grad_parts(const moe_mesh_plan_t *mp, const moe_spec_t *s, int rank, moe_grad_part_t parts[4], char *err,
                        size_t errlen);

/* The tensors' names in messages ("dw1p", ...). */
extern const char *const moe_grad_tensor_names[MOE_GRAD_TENSORS];

/* Enqueue the parts of a's tensors on st: copies, the NCCL collectives
 * over ep's FSDP communicator (one NCCL group) and, with a->accumulate,
 * the adds (l's bwd_accum kernel). s: the plan's spec. Checks a's pointers
 * before anything is enqueued. */
moe_status moe_fsdp_grads(const struct moe_ep *ep, const moe_launcher_t *l, const moe_spec_t *s,
                          const moe_grad_scatter_args *a, CUstream st);

#endif
