/* launch_geom.h — launch facts that the JIT runtime and the vendored
 * launcher share: the blocks of a 1D grid over items, the routed and
 * expert-major row and tile counts, the sm_90a GEMMs' operand shapes and TMA
 * tensor-map encoding, and their 1D grid size.
 *
 * Plain C with no dependency but <stdint.h>: the runtime includes it
 * (runtime/launch.c), the planner and the kernel families' grids call it
 * (gen/plan.c, gen/family_*.c), and emission
 * pastes this file verbatim into every emitted .cu (templates/host.lua), so
 * a vendored source stays self-contained. The MOE_TMAP_* choices name the
 * driver's enumerators and expand where cuda.h is included. Changing this
 * file changes kernels_out/ (make kernels). */
#ifndef MOEGEN_LAUNCH_GEOM_H
#define MOEGEN_LAUNCH_GEOM_H

#include <stdint.h>

/* Blocks of a 1D grid over n items, per_block items per block:
 * ceil(n / per_block). The grids of route, permute_scatter and combine
 * (n: tokens), of ep_scatter (n: routed rows), ep_rows (n: staging
 * rows), swiglu (n: eight-column groups, one per thread) and the GEMMs' N
 * tiles (n: the B rows per expert, per_block: bn). */
static inline unsigned moe_blocks(long long n, long long per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}

/* The route kernel splits H across gridDim.y blocks per block of tokens
 * when there are few tokens (at most MOE_ROUTE_SPLIT_BLOCKS token blocks),
 * so that a decode step reads the router weights with many SMs instead of
 * one, and a batch of fewer token blocks than half the SMs still streams
 * x with most of them. Each split block writes its partial logits (fp32 [per_block, E]) to
 * the route scratch; the last of a token block's splits to finish (a ticket
 * per token block, kept after the E expert counts and zeroed with them)
 * sums them in split order and selects. At least 256 columns of H per
 * split, and at most MOE_ROUTE_SPLIT_CTAS blocks in all. The fused calls'
 * ticket (MOE_ROUTE_FUSE_TICKET) follows the token blocks' tickets. */
#define MOE_ROUTE_SPLIT_BLOCKS 64
#define MOE_ROUTE_SPLIT_CTAS 128
static inline unsigned moe_route_split(long long tokens, int per_block, long long hidden) {
    long long blocks = moe_blocks(tokens, per_block), split = hidden / 256;
    if (blocks > MOE_ROUTE_SPLIT_BLOCKS || split < 2)
        return 1;
    if (split * blocks > MOE_ROUTE_SPLIT_CTAS)
        split = MOE_ROUTE_SPLIT_CTAS / blocks;
    return (unsigned)split;
}

/* Bytes of the route scratch (the split partial logits): enough for any
 * call, since only calls of few tokens split; 0 when H never splits. The
 * tickets are MOE_ROUTE_SPLIT_BLOCKS ints after the E counts (then the
 * fused calls' one and the given ids' error count: MOE_ROUTE_TICKETS in
 * all). */
static inline long long moe_route_scratch_bytes(int per_block, int experts, long long hidden) {
    return hidden / 256 >= 2 ? (long long)MOE_ROUTE_SPLIT_CTAS * per_block * experts * 4 : 0;
}

/* Calls of few tokens fold the permute plan into the route kernel
 * (templates/route.lua, "Fused"): the last route block to finish (one
 * more ticket, MOE_ROUTE_FUSE_TICKET ints after the weight slots' counts)
 * turns the counts into offsets and the tile table, and for the smallest
 * calls also scatters the x rows, so permute_plan (and permute_scatter) are
 * not launched. The choice is the host's, by the call's token count (no
 * host synchronization; a CUDA graph captured at T replays T's path):
 * MOE_ROUTE_FUSE_PLAN up to MOE_ROUTE_FUSE_TOKENS tokens; _SCATTER while
 * the call has at most one token per route warp (one pass of the block's
 * warps) and its routed rows are at most MOE_ROUTE_FUSE_SCATTER_BYTES (what
 * one block copies in about a microsecond), when the scatter can be fused
 * at all (scatter = 0: never; 2: a call of one token alone — fp8 rows,
 * which route's idle warps quantize while it selects (moe_route_fuse_scatter));
 * MOE_ROUTE_FUSE_OFF otherwise, or when the plan turned it off
 * (MOEGEN_ROUTE_FUSE=off, or an expert-parallel plan). */
#define MOE_ROUTE_FUSE_OFF 0
#define MOE_ROUTE_FUSE_PLAN 1
#define MOE_ROUTE_FUSE_SCATTER 2
#define MOE_ROUTE_FUSE_TOKENS 64
#define MOE_ROUTE_FUSE_SCATTER_BYTES (128 * 1024)
#define MOE_ROUTE_FUSE_TICKET MOE_ROUTE_SPLIT_BLOCKS
/* With given routing (router.select = "given") the route counts the
 * caller's ids outside 0..E-1 (dropped entries) in the int after the fused
 * ticket, zeroed with the counts; moe_plan_routing_errors reads it. */
#define MOE_ROUTE_BAD_IDS (MOE_ROUTE_SPLIT_BLOCKS + 1)
#define MOE_ROUTE_TICKETS (MOE_ROUTE_SPLIT_BLOCKS + 2)
static inline int moe_route_fuse_mode(long long tokens, int entries, long long hidden, int route_warps, int scatter) {
    if (tokens < 1 || tokens > MOE_ROUTE_FUSE_TOKENS)
        return MOE_ROUTE_FUSE_OFF;
    if (scatter && (scatter == 1 || tokens == 1) && tokens <= route_warps &&
        tokens * entries * hidden * 2 <= MOE_ROUTE_FUSE_SCATTER_BYTES)
        return MOE_ROUTE_FUSE_SCATTER;
    return MOE_ROUTE_FUSE_PLAN;
}

/* moe_route_fuse_mode's scatter for a spec: 1 (bf16 / fp16 rows, copied), 2
 * with fp8 weights (one token's row quantized by route's idle warps while
 * it selects: templates/route.lua), 0 for fp8 with router.apply = "input"
 * or given ids (a row that depends on the selection). */
static inline int moe_route_fuse_scatter(int fp8, int apply_input, int given) { return !fp8 ? 1 : apply_input || given ? 0 : 2; }

/* The combine splits each token's H columns across gridDim.y blocks when
 * there are few tokens, so that about MOE_COMBINE_WARPS warps share the
 * work (a warp per token and split, at least 256 columns each). */
#define MOE_COMBINE_WARPS 1024
static inline unsigned moe_combine_split(long long tokens, long long hidden) {
    long long split = MOE_COMBINE_WARPS / (tokens > 0 ? tokens : 1), most = hidden / 256;
    if (split > most)
        split = most;
    return (unsigned)(split > 1 ? split : 1);
}

/* bwd_dwr's token splits (templates/bwd.lua): one per 256 tokens, at most
 * 16, and no more than whose partial sums ([splits, el, hl] fp32) fit `room`
 * bytes (the backward's dwr_part region, moe_dwr_part_bytes); 1: no
 * partials. */
static inline int moe_dwr_splits(long long tokens, int el, long long hl, unsigned long long room) {
    long long z = (tokens + 255) / 256;
    const unsigned long long one = 4ull * (unsigned long long)el * (unsigned long long)hl;
    if (z > 16)
        z = 16;
    if (one > 0 && (unsigned long long)z > room / one)
        z = (long long)(room / one);
    return z < 1 ? 1 : (int)z;
}

/* The backward's dwr_part region: the partial sums of moe_dwr_splits'
 * splits within an fp32 copy of x's size (4 · tokens · hidden bytes). */
static inline unsigned long long moe_dwr_part_bytes(long long tokens, int el, long long hl, long long hidden) {
    const int z = moe_dwr_splits(tokens, el, hl, 4ull * (unsigned long long)(tokens > 0 ? tokens : 0) *
                                                     (unsigned long long)hidden);
    return z > 1 ? 4ull * (unsigned long long)z * (unsigned long long)el * (unsigned long long)hl : 0;
}

/* Routed rows of `tokens` tokens: one per (token, k) pair. */
static inline long long moe_routed_rows(long long tokens, int top_k) {
    return tokens * top_k;
}

/* Rows of the expert-major buffers for `tokens` tokens: the routed rows
 * plus up to align - 1 rows of padding per expert that has any, since each
 * expert's rows start on a multiple of align (the GEMM bm) and an empty
 * expert takes none (permute_plan rounds each count up); at most one
 * expert per routed row has rows. Non-decreasing in tokens. */
static inline long long moe_max_rows(long long tokens, int top_k, int experts, int align) {
    const long long routed = moe_routed_rows(tokens, top_k);
    return routed + (routed < experts ? routed : (long long)experts) * (align - 1);
}

/* M tiles (the GEMMs' tile-table capacity) for `tokens` tokens. */
static inline long long moe_max_tiles(long long tokens, int top_k, int experts, int align) {
    return moe_max_rows(tokens, top_k, experts, align) / align;
}

/* The reduction length K and the B rows per expert N of the up GEMM (up:
 * [rows, H] x [2F, H]^T, gate/up packed) or the down GEMM ([rows, F] x
 * [H, F]^T). */
static inline void moe_gemm_kn(int up, long long hidden, long long ffn, long long *K, long long *N) {
    *K = up ? hidden : ffn;
    *N = up ? 2 * ffn : hidden;
}

/* The reduction length K and the output columns N of the backward dgrads
 * (dgrad_up: [rows, 2F] x [2F, H]; dgrad_down: [rows, H] x [H, F]), whose
 * B, the weights as stored ([slots, K, N]), the sm_90a kernels read
 * N-major: a tensor map over [slots * K, N] (moe_tmap_geom with rows
 * slots * K, row length N and box rows bk), boxes of 64 columns x bk rows.
 * A is K-major as in the forward. */
static inline void moe_dgrad_kn(int up, long long hidden, long long ffn, long long *K, long long *N) {
    *K = up ? 2 * ffn : hidden;
    *N = up ? hidden : ffn;
}

/* A 2D TMA tensor map as the sm_90a GEMMs (templates/gemm_sm90.lua) load
 * their operands: rows x k 16-bit elements, row stride k, boxes of 64
 * elements (one 128-byte swizzle row) x box_rows rows (the tile's bm for A,
 * bn for B), in the 128-byte swizzle; box parts out of bounds read as 0.
 * The fp8 GEMMs' operands are one-byte elements (moe_tmap_geom8,
 * MOE_TMAP_DTYPE8): boxes of 128 elements, the same 128 bytes. */
typedef struct {
    uint64_t dim[2];      /* {k, rows}, innermost first */
    uint64_t stride[1];   /* bytes from one row to the next */
    uint32_t box[2];      /* {64, box_rows} */
    uint32_t estride[2];  /* {1, 1} */
} moe_tmap_geom_t;

#define MOE_TMAP_DTYPE CU_TENSOR_MAP_DATA_TYPE_UINT16
#define MOE_TMAP_INTERLEAVE CU_TENSOR_MAP_INTERLEAVE_NONE
#define MOE_TMAP_SWIZZLE CU_TENSOR_MAP_SWIZZLE_128B
#define MOE_TMAP_L2_PROMOTION CU_TENSOR_MAP_L2_PROMOTION_L2_256B
#define MOE_TMAP_OOB_FILL CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE

static inline moe_tmap_geom_t moe_tmap_geom(long long rows, long long k, unsigned box_rows) {
    moe_tmap_geom_t g = {{(uint64_t)k, (uint64_t)rows}, {(uint64_t)k * 2}, {64, box_rows}, {1, 1}};
    return g;
}

#define MOE_TMAP_DTYPE8 CU_TENSOR_MAP_DATA_TYPE_UINT8

static inline moe_tmap_geom_t moe_tmap_geom8(long long rows, long long k, unsigned box_rows) {
    moe_tmap_geom_t g = {{(uint64_t)k, (uint64_t)rows}, {(uint64_t)k}, {128, box_rows}, {1, 1}};
    return g;
}

/* CTAs of an sm_90a GEMM's 1D grid over `tiles` tiles (N tiles x M
 * tiles): one per tile, or min(tiles, sms) when persistent and the SM
 * count is known (sms > 0), or splitk per tile on the split-K grid
 * (splitk > 0; the CTAs of tile t are t * splitk .. t * splitk + splitk - 1). */
static inline unsigned moe_sm90_ctas(unsigned long long tiles, int persistent, int splitk, int sms) {
    if (persistent && sms > 0 && tiles > (unsigned long long)sms)
        tiles = (unsigned long long)sms;
    return (unsigned)(splitk > 0 ? tiles * (unsigned long long)splitk : tiles);
}

/* CTAs of an sm_90a GEMM in CTA pairs (tile.cluster, "+mc": 2-CTA clusters
 * on a persistent grid; templates/gemm_sm90.lua): the pairs walk (pair of
 * M tiles, N tile) items, so twice min(items, clusters), clusters the
 * pairs that can be resident at once (the driver's occupancy answer, 0 =
 * not known), never more than half the SMs (sms > 0): every pair kernel
 * takes an SM a CTA, and a pair beyond the resident ones would run its
 * share of the items in a second wave. */
static inline unsigned moe_sm90_pair_ctas(unsigned long long mtiles, unsigned long long ntiles, int clusters,
                                          int sms) {
    unsigned long long items = (mtiles + 1) / 2 * ntiles, cap = clusters > 0 ? (unsigned long long)clusters : 0;
    if (sms > 1 && (cap == 0 || cap > (unsigned long long)sms / 2))
        cap = (unsigned long long)sms / 2;
    if (cap > 0 && items > cap)
        items = cap;
    return (unsigned)(2 * (items > 0 ? items : 1));
}

/* The split-K GEMMs' arrival counters (one int per tile, every split's
 * CTA takes one ticket, the last resets it to 0) sit in the counts region
 * after the E' slot counts and route's tickets (MOE_ROUTE_TICKETS: the
 * split blocks' and the fused tail's), so the memset before route zeroes
 * them too: their first int. */
static inline long long moe_splitk_tickets_at(int slots) {
    return (long long)slots + MOE_ROUTE_TICKETS;
}

/* CTAs of the gemv "stream" grid (templates/gemm_gemv.lua, stream_code):
 * as many as fit on every SM at smem bytes of shared memory each (of the
 * 227 KB an SM gives a CTA, 1 KB more per CTA reserved), at most 2 an SM
 * (its __launch_bounds__: 288 threads of up to 112 registers); 132 SMs
 * when the count is unknown. */
static inline unsigned moe_gemv_stream_ctas(int sms, int smem) {
    int per = (227 * 1024) / (smem + 1024);
    per = per < 1 ? 1 : per > 2 ? 2 : per;
    return (unsigned)((sms > 0 ? sms : 132) * per);
}

/* The combine folded into the down GEMM (templates/gemm_gemv.lua): when
 * the call's down GEMM runs on the gemv grid, on one device (not an
 * expert-parallel rank, whose combine runs after the rows came home; not
 * a training forward) and the call has at most MOE_COMBINE_FUSE_TOKENS
 * tokens, each column slice's last CTA writes y and the combine kernel is
 * not launched; unless MOEGEN_COMBINE_FUSE=off. Its tickets, one per
 * column slice (bn >= 8 columns: at most hidden / 8), are the last
 * moe_combine_tickets(hidden) ints of the counts region, zeroed with it,
 * in a plan with a gemv down GEMM in some variant. */
#define MOE_COMBINE_FUSE_TOKENS 64
static inline int moe_combine_fuse_tokens(long long tokens) {
    return tokens >= 1 && tokens <= MOE_COMBINE_FUSE_TOKENS;
}
/* Does a call of `tokens` tokens run the gathered up GEMM where its kernels
 * can (docs/DESIGN.md, "The gathered up GEMM"; MOEGEN_GATHER=auto, the
 * default, and the vendored launcher)? The rule the measurements support
 * (docs/PERF.md, "The gathered up GEMM" and its sixteenth-session
 * follow-up): gathering saves the scatter's copy of x (T·k' rows written
 * and read back) but its A loads cost more than TMA's reads of the copy, a
 * cost paid again for each of the up GEMM's tiles of a slot and that shows
 * where the GEMM is compute-bound; so at most 2^19 rows × packed
 * up-projection columns per weight slot on average (T·k'·2F <= 2^19·E':
 * 32 tiles of 64 × 256 a slot). */
#define MOE_GATHER_ROW_COLS_PER_SLOT (1LL << 19)
static inline int moe_gather_tokens(long long tokens, long long entries, long long slots, long long ffn) {
    return tokens * entries * 2 * ffn <= MOE_GATHER_ROW_COLS_PER_SLOT * slots;
}
static inline long long moe_combine_tickets(long long hidden) {
    return hidden / 8;
}
/* The chain (gen/family.h, moe_gemm_chains; templates/gemm_gemv.lua): its
 * combine takes the stream grids' hidden / 16 column blocks' tickets, the
 * first half of moe_combine_tickets; its counter of CTAs done with their up
 * items is the int after them, moe_chain_done_at(hidden) of the tickets. */
static inline long long moe_chain_done_at(long long hidden) {
    return hidden / 16;
}

#endif
