/* dispatch.c — expert-parallel dispatch and combine layouts (see dispatch.h).
 *
 * Every layout is a counting sort: count rows per (destination, slot), scan
 * the counts into block starts, then walk the slots (t, k) in order and bump
 * a cursor per (destination, slot). The walk fixes the order within a block,
 * so the result depends on nothing but the routing. Arguments are checked in
 * full before anything is written. */
#include "dispatch.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

const char *moe_dispatch_status_name(int status) {
    switch (status) {
    case MOE_DISPATCH_OK: return "ok";
    case MOE_DISPATCH_EINVAL: return "invalid argument";
    case MOE_DISPATCH_ENOMEM: return "out of memory";
    case MOE_DISPATCH_OVERFLOW: return "overflow";
    case MOE_DISPATCH_ESPACE: return "tile table too short";
    default: return "unknown";
    }
}

moe_dispatch_route_t moe_dispatch_route_of_plan(const moe_mesh_plan_t *mp) {
    moe_dispatch_route_t rt;
    rt.experts = mp->experts;
    rt.ep = mp->size[MOE_AXIS_EP];
    rt.nheld = mp->nheld;
    rt.owner_ep_rank = mp->owner_ep_rank;
    rt.slot = mp->slot;
    return rt;
}

/* The routing table and the selection are in range, and the sizes fit an int. */
static int check_route(const moe_dispatch_route_t *rt, const int *topk_idx, int tokens, int top_k) {
    if (!rt || rt->experts < 1 || rt->ep < 1 || rt->nheld < 1 || !rt->owner_ep_rank || !rt->slot) return 0;
    if (tokens < 0 || top_k < 1 || (tokens > 0 && !topk_idx)) return 0;
    if ((long long)tokens * top_k > INT_MAX || (long long)rt->ep * rt->nheld > INT_MAX) return 0;
    for (int g = 0; g < rt->experts; g++) {
        if (rt->owner_ep_rank[g] < 0 || rt->owner_ep_rank[g] >= rt->ep) return 0;
        if (rt->slot[g] < 0 || rt->slot[g] >= rt->nheld) return 0;
    }
    for (int i = 0; i < tokens * top_k; i++)
        if (topk_idx[i] < 0 || topk_idx[i] >= rt->experts) return 0;
    return 1;
}

/* The cursor walk shared by both modes. cnt [ep*nheld] holds the kept rows
 * per (dest, slot), base [ep] each destination's first row, and keep (or
 * NULL: all) whether slot (t, k) is kept. Writes send_pos. */
static int place_rows(const moe_dispatch_route_t *rt, const int *topk_idx, int n, const int *cnt,
                      const int *base, const unsigned char *keep, int *send_pos) {
    const int ep = rt->ep, nh = rt->nheld;
    int *cur = malloc(sizeof(int) * (size_t)ep * (size_t)nh + 1);
    if (!cur) return MOE_DISPATCH_ENOMEM;
    for (int d = 0; d < ep; d++) {
        int row = base[d];
        for (int j = 0; j < nh; j++) {
            cur[d * nh + j] = row;
            row += cnt[d * nh + j];
        }
    }
    for (int i = 0; i < n; i++) {
        if (keep && !keep[i]) {
            send_pos[i] = -1;
            continue;
        }
        const int g = topk_idx[i];
        send_pos[i] = cur[rt->owner_ep_rank[g] * nh + rt->slot[g]]++;
    }
    free(cur);
    return MOE_DISPATCH_OK;
}

int moe_dispatch_send_layout(const moe_dispatch_route_t *rt, const int *topk_idx, int tokens, int top_k,
                             int *send_counts, int *send_off, int *slot_counts, int *send_pos) {
    if (!check_route(rt, topk_idx, tokens, top_k) || !send_counts || !slot_counts || (tokens > 0 && !send_pos))
        return MOE_DISPATCH_EINVAL;
    const int ep = rt->ep, nh = rt->nheld, n = tokens * top_k;
    int *cnt = calloc((size_t)ep * (size_t)nh + 1, sizeof(int));
    int *base = malloc(sizeof(int) * ((size_t)ep + 1));
    if (!cnt || !base) {
        free(cnt);
        free(base);
        return MOE_DISPATCH_ENOMEM;
    }
    for (int i = 0; i < n; i++) cnt[rt->owner_ep_rank[topk_idx[i]] * nh + rt->slot[topk_idx[i]]]++;
    base[0] = 0;
    for (int d = 0; d < ep; d++) {
        int rows = 0;
        for (int j = 0; j < nh; j++) rows += cnt[d * nh + j];
        base[d + 1] = base[d] + rows;
    }
    int rc = place_rows(rt, topk_idx, n, cnt, base, NULL, send_pos);
    if (rc == MOE_DISPATCH_OK) {
        for (int d = 0; d < ep; d++) send_counts[d] = base[d + 1] - base[d];
        if (send_off) memcpy(send_off, base, sizeof(int) * ((size_t)ep + 1));
        memcpy(slot_counts, cnt, sizeof(int) * (size_t)ep * (size_t)nh);
    }
    free(cnt);
    free(base);
    return rc;
}

int moe_dispatch_send_layout_capacity(const moe_dispatch_route_t *rt, const int *topk_idx, int tokens,
                                      int top_k, int capacity, unsigned flags, int *send_counts,
                                      int *slot_counts, int *send_pos, int *excess, int *excess_per_dest) {
    if (!check_route(rt, topk_idx, tokens, top_k) || capacity < 0 || !excess || !send_counts || !slot_counts ||
        (tokens > 0 && !send_pos) || (long long)rt->ep * capacity > INT_MAX)
        return MOE_DISPATCH_EINVAL;
    const int ep = rt->ep, nh = rt->nheld, n = tokens * top_k;
    int *cnt = calloc((size_t)ep * (size_t)nh + 1, sizeof(int));
    int *sent = calloc((size_t)ep, sizeof(int));     /* rows seen per destination, kept or not */
    int *base = calloc((size_t)ep, sizeof(int));
    unsigned char *keep = malloc((size_t)n + 1);
    if (!cnt || !sent || !base || !keep) {
        free(cnt);
        free(sent);
        free(base);
        free(keep);
        return MOE_DISPATCH_ENOMEM;
    }
    int over = 0;
    for (int i = 0; i < n; i++) {
        const int g = topk_idx[i], d = rt->owner_ep_rank[g];
        keep[i] = sent[d]++ < capacity;   /* the first `capacity` in (t, k) order */
        if (keep[i])
            cnt[d * nh + rt->slot[g]]++;
        else
            over++;
    }
    *excess = over;
    if (excess_per_dest)
        for (int d = 0; d < ep; d++) excess_per_dest[d] = sent[d] > capacity ? sent[d] - capacity : 0;
    int rc = MOE_DISPATCH_OK;
    if (over > 0 && !(flags & MOE_DISPATCH_DROP)) {
        rc = MOE_DISPATCH_OVERFLOW;
    } else {
        for (int d = 0; d < ep; d++) base[d] = d * capacity;
        rc = place_rows(rt, topk_idx, n, cnt, base, keep, send_pos);
        if (rc == MOE_DISPATCH_OK) {
            for (int d = 0; d < ep; d++) send_counts[d] = sent[d] < capacity ? sent[d] : capacity;
            memcpy(slot_counts, cnt, sizeof(int) * (size_t)ep * (size_t)nh);
        }
    }
    free(cnt);
    free(sent);
    free(base);
    free(keep);
    return rc;
}

int moe_dispatch_recv_layout(int ep, int nheld, int align, const int *recv_counts, int *chunk_src,
                             int *chunk_dst, int *slot_off, moe_dispatch_tile_t *tiles, int max_tiles,
                             int *num_tiles) {
    if (ep < 1 || nheld < 1 || align < 1 || max_tiles < 0 || !recv_counts || !chunk_src || !chunk_dst ||
        !slot_off || !num_tiles || (max_tiles > 0 && !tiles) || (long long)ep * nheld > INT_MAX)
        return MOE_DISPATCH_EINVAL;
    /* Sizes first, in 64 bits, so a count that cannot be laid out in int rows is refused. */
    long long rows = 0, ntiles = 0;
    for (int j = 0; j < nheld; j++) {
        long long c = 0;
        for (int s = 0; s < ep; s++) {
            if (recv_counts[s * nheld + j] < 0) return MOE_DISPATCH_EINVAL;
            c += recv_counts[s * nheld + j];
        }
        rows += (c + align - 1) / align * align;
        ntiles += (c + align - 1) / align;
        if (rows > INT_MAX) return MOE_DISPATCH_EINVAL;
    }
    if (ntiles > max_tiles) {
        *num_tiles = (int)ntiles;
        return MOE_DISPATCH_ESPACE;
    }
    for (int s = 0; s < ep; s++) {
        int off = 0;
        for (int j = 0; j < nheld; j++) {
            chunk_src[s * nheld + j] = off;
            off += recv_counts[s * nheld + j];
        }
    }
    int row = 0, nt = 0;
    for (int j = 0; j < nheld; j++) {
        slot_off[j] = row;
        int c = 0;
        for (int s = 0; s < ep; s++) {
            chunk_dst[s * nheld + j] = row + c;
            c += recv_counts[s * nheld + j];
        }
        for (int r = 0; r < c; r += align) {
            tiles[nt].slot = j;
            tiles[nt].row_start = row + r;
            tiles[nt].rows = c - r < align ? c - r : align;
            tiles[nt].pad = 0;
            nt++;
        }
        row += (c + align - 1) / align * align;
    }
    slot_off[nheld] = row;
    *num_tiles = nt;
    return MOE_DISPATCH_OK;
}

int moe_dispatch_combine(int tokens, int top_k, int width, const float *topk_w, const int *ret_pos,
                         const float *ret, int ret_rows, float *y) {
    if (tokens < 0 || top_k < 1 || width < 1 || ret_rows < 0) return MOE_DISPATCH_EINVAL;
    if (tokens == 0) return MOE_DISPATCH_OK;
    if (!topk_w || !ret_pos || !y || (ret_rows > 0 && !ret)) return MOE_DISPATCH_EINVAL;
    const long long n = (long long)tokens * top_k;
    for (long long i = 0; i < n; i++)
        if (ret_pos[i] >= ret_rows) return MOE_DISPATCH_EINVAL;
    for (int t = 0; t < tokens; t++) {
        float *yt = y + (size_t)t * (size_t)width;
        for (int h = 0; h < width; h++) yt[h] = 0.0f;
        for (int k = 0; k < top_k; k++) {
            const int p = ret_pos[(size_t)t * (size_t)top_k + (size_t)k];
            if (p < 0) continue;
            const float w = topk_w[(size_t)t * (size_t)top_k + (size_t)k];
            const float *r = ret + (size_t)p * (size_t)width;
            for (int h = 0; h < width; h++) yt[h] += w * r[h];
        }
    }
    return MOE_DISPATCH_OK;
}
