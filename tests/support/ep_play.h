/* ep_play.h — one step's transfers of every rank of a mesh, played on one
 * GPU: the GPU tests run each rank as a plan created without a
 * communicator, and do here what NCCL would (test_ep_gpu, test_bwd_gpu). */
#ifndef MOEGEN_TEST_EP_PLAY_H
#define MOEGEN_TEST_EP_PLAY_H

#include "check.h"
#include "driver.h"
#include "ep.h"
#include "mesh.h"

#include <sys/types.h>

/* Rank r's send to its group peer q meets q's receive from r, in list
 * order as NCCL matches them, over the EP groups (fsdp = 0) or the FSDP
 * groups (fsdp = 1); the sizes must agree. Synchronizes the context after
 * the copies. Returns 0 when every transfer went, 1 otherwise (a check
 * failed or a copy did). */
static int ep_play_xfers(const moe_mesh_plan_t *mp, moe_ep_call_t **calls, int fsdp) {
    int bad = 0;
    for (int r = 0; r < mp->world; r++) {
        const int me = fsdp ? mp->ranks[r].fsdp_rank : mp->ranks[r].ep_rank;
        for (int i = 0; i < calls[r]->nx; i++) {
            const moe_xfer_t *s = &calls[r]->x[i];
            if (s->recv)
                continue;
            int q = fsdp ? mp->ranks[r].fsdp_peers[s->peer] : mp->ranks[r].ep_peers[s->peer], nth = 0;
            for (int j = 0; j < i; j++) /* sends to one peer meet its receives in list order, as in NCCL */
                nth += !calls[r]->x[j].recv && calls[r]->x[j].peer == s->peer;
            const moe_xfer_t *m = NULL;
            for (int j = 0; j < calls[q]->nx && !m; j++)
                if (calls[q]->x[j].recv && calls[q]->x[j].peer == me && nth-- == 0)
                    m = &calls[q]->x[j];
            if (!m || m->bytes != s->bytes) {
                CHECKF(0, "rank %d sends %zu bytes to rank %d, which receives %zd", r, s->bytes, q,
                       m ? (ssize_t)m->bytes : (ssize_t)-1);
                bad = 1;
                continue;
            }
            if (s->bytes && moe_cu.cuMemcpyDtoDAsync(m->ptr, s->ptr, s->bytes, NULL) != CUDA_SUCCESS)
                bad = 1;
        }
    }
    if (moe_cu.cuCtxSynchronize() != CUDA_SUCCESS)
        bad = 1;
    return bad;
}

#endif
