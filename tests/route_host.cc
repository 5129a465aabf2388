/* route_host.cc — one spec's emitted route kernel (templates/route.lua) run
 * on the CPU through tests/support/cuda_host.h (its cp.async, ldmatrix and
 * mma.sync emulated there). test_route_host builds it per case: the route's
 * namespace and kernel and the prelude pieces they use (cut from the
 * emitted source, the namespace's inline-asm mma replaced by the host one)
 * are force-included, and -D gives the shape and name:
 *   RH_ROUTE  the kernel;  RH_GATE  1: it takes shared_gate;  RH_TRAIN  1: it takes logits_out
 *   RH_H  hidden;  RH_HR  the router's width (router.hidden, else hidden);  RH_NS  router columns (scored experts);  RH_KE  entries per token;
 *   RH_SLOTS  weight slots;  RH_PER_BLOCK  tokens per block;  RH_SMEM  its dynamic shared memory;
 *   RH_ALIGN  the plan's row block (the fused permute plan's align);  RH_INPUT  router.apply = "input";
 *   RH_SCATTER  moe_route_fuse_mode's scatter (gen/launch_geom.h, moe_route_fuse_scatter): 1 fused copies,
 *   2 fp8 weights (one token's row quantized by the route), 0 never
 *   RH_FP8  1: fp8 weights: a fused row is e4m3 bytes in xs plus a scale per 128 columns in xsc, checked
 *   against runtime/fp8.c's moe_fp8_quantize_block (linked in) byte for byte
 *   RH_K  top_k;  RH_GIVEN  1: router.select = "given" (it takes given_ids);  RH_GIVEN_W  1: and given_w
 *   RH_OWN  1: router.input = "separate" (it takes router_x);  RH_ESCALE  1: router.expert_scale (expert_scale)
 *   RH_W32  1: router.weight_dtype = "fp32" (wr is fp32 in IN);  RH_MC  the route's mma columns (its scratch)
 * usage: route_host IN OUT [fused] — IN (written by test_route_host): T, then x
 * [T, H] and wr [NS, HR] (dtype bits; RH_W32: fp32), the shared expert's w_gate [H]
 * (RH_GATE), sel_bias and logit_bias [NS] (fp32), the caller's ids [T, K] (int32, RH_GIVEN) and weights
 * [T, K] (fp32, RH_GIVEN_W), router_x [T, HR] (dtype bits, RH_OWN), expert_scale [NS] (fp32, RH_ESCALE); the kernel runs unfused (mode 0), or with "fused" in the mode
 * the runtime picks for T (the permute plan, and the scatter for the
 * fewest tokens, in its last block: checked here, check_fused), on a grid
 * of ceil(T / per_block) x moe_route_split blocks, topk_idx, topk_w and the logits
 * poisoned first, the counts and tickets zeroed as the runtime zeroes
 * them; OUT gets topk_idx [T, KE], topk_w [T, KE], counts
 * [SLOTS], (RH_TRAIN) the logits [T, NS] and (RH_GIVEN) the dropped ids' count. test_route_host compares
 * them with the C reference. Exit 1 when a file cannot be read or written
 * or the fused tail is wrong. */
#include "launch_geom.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef RH_FP8
#define RH_FP8 0
#endif
#if RH_FP8
extern "C" float moe_fp8_quantize_block(const float *v, size_t n, uint8_t *q); /* runtime/fp8.c */
#endif

template <class T> static bool get(FILE *f, std::vector<T> &v, size_t n) {
    v.resize(n);
    return fread(v.data(), sizeof(T), n, f) == n;
}
template <class T> static bool put(FILE *f, const std::vector<T> &v) {
    return fwrite(v.data(), sizeof(T), v.size(), f) == v.size();
}

/* The fused tail's outputs against what permute_plan and permute_scatter
 * would leave: offsets the counts rounded up to align, summed; the tile
 * table slot by slot at slot_of[e]; with the scatter (mode 2) every routed
 * entry mapped one to one into its slot's rows, each such row x[t] bit for
 * bit (RH_INPUT, router.apply = "input": round(x[t] . round(w))), a zero
 * expert's entry at row offsets[SLOTS] + t, the cursors at the counts;
 * with the plan alone the cursors 0. Prints what is off; returns
 * the number of wrong values. */
static long check_fused(int mode, int T, const std::vector<moe_half_t> &x, const std::vector<int> &idx,
                        const std::vector<float> &w,
                        const std::vector<int> &counts, const std::vector<int> &slot_of, int align,
                        const std::vector<int> &offsets, const std::vector<int> &cursor, const std::vector<int> &tiles,
                        int num_tiles, const std::vector<moe_half_t> &xs, const std::vector<int> &row_of,
                        const std::vector<float> &xsc) {
    const int H = RH_H, KE = RH_KE, SLOTS = RH_SLOTS;
    long bad_off = 0, bad_tiles = 0, bad_map = 0, bad_rows = 0, bad_cursor = 0;
    int nt = 0;
    for (int e = 0; e < SLOTS; e++) {
        bad_off += offsets[e + 1] != offsets[e] + (counts[e] + align - 1) / align * align;
        for (int j = 0; j * align < counts[e]; j++, nt++) {
            const int *t4 = &tiles[4 * (size_t)nt];
            const int rows = counts[e] - j * align < align ? counts[e] - j * align : align;
            bad_tiles += nt >= num_tiles || t4[0] != slot_of[e] || t4[1] != offsets[e] + j * align || t4[2] != rows;
        }
    }
    bad_off += offsets[0] != 0;
    bad_tiles += nt != num_tiles;
    if (mode == MOE_ROUTE_FUSE_SCATTER) {
        std::vector<char> used(xs.size() / H, 0);
        for (int t = 0; t < T; t++)
            for (int k = 0; k < KE; k++) {
                const int e = idx[(size_t)t * KE + k], r = row_of[(size_t)t * KE + k];
                const bool ok = e < SLOTS ? r >= offsets[e] && r < offsets[e] + counts[e] && !used[r]
                                          : r == offsets[SLOTS] + t;
                if (!ok) {
                    bad_map++;
                    continue;
                }
                used[r] = 1;
#if RH_FP8 /* e4m3 bytes (rows of H) and a scale per 128 columns, as permute_scatter quantizes */
                {
                    const unsigned char *q = reinterpret_cast<const unsigned char *>(xs.data()) + (size_t)r * H;
                    float v[128];
                    uint8_t want[128];
                    for (int b = 0; b < H / 128; b++) {
                        for (int i = 0; i < 128; i++)
                            v[i] = moe_to_float(x[(size_t)t * H + b * 128 + i]);
                        const float sc = moe_fp8_quantize_block(v, 128, want);
                        bad_rows += memcmp(q + b * 128, want, 128) != 0 ||
                                    memcmp(&xsc[(size_t)r * (H / 128) + b], &sc, 4) != 0;
                    }
                }
#elif RH_INPUT /* router.apply = "input": the row is round(x . round(w)) */
                const float wk = moe_round(w[(size_t)t * KE + k]);
                for (int h = 0; h < H; h++)
                    bad_rows += xs[(size_t)r * H + h] != moe_from_float(moe_to_float(x[(size_t)t * H + h]) * wk);
#else
                bad_rows += memcmp(&xs[(size_t)r * H], &x[(size_t)t * H], (size_t)H * 2) != 0;
#endif
            }
        for (int e = 0; e < SLOTS; e++)
            bad_cursor += cursor[e] != counts[e];
    } else {
        for (int e = 0; e < SLOTS; e++)
            bad_cursor += cursor[e] != 0;
    }
    printf("  route_host fused (mode %d): %d tiles; offsets %ld, tiles %ld, row map %ld, rows %ld, cursors %ld off\n",
           mode, num_tiles, bad_off, bad_tiles, bad_map, bad_rows, bad_cursor);
    return bad_off + bad_tiles + bad_map + bad_rows + bad_cursor;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "fused")))
        return 1;
    FILE *in = fopen(argv[1], "rb");
    int T = 0;
    std::vector<moe_half_t> x, wr, wg, rx;
    std::vector<float> sel, lb, gw, es, wr32;
    std::vector<int> gids;
    const int H = RH_H, HR = RH_HR, NS = RH_NS, KE = RH_KE, SLOTS = RH_SLOTS, K = RH_K;
    bool ok = in && fread(&T, sizeof T, 1, in) == 1 && T > 0 && get(in, x, (size_t)T * H) &&
              (RH_W32 ? get(in, wr32, (size_t)NS * HR) : get(in, wr, (size_t)NS * HR)) &&
              (!RH_GATE || get(in, wg, (size_t)H)) && get(in, sel, (size_t)NS) &&
              get(in, lb, (size_t)NS) && (!RH_GIVEN || get(in, gids, (size_t)T * K)) &&
              (!RH_GIVEN_W || get(in, gw, (size_t)T * K)) && (!RH_OWN || get(in, rx, (size_t)T * HR)) &&
              (!RH_ESCALE || get(in, es, (size_t)NS));
    if (in)
        fclose(in);
    if (!ok)
        return 1;
    std::vector<int> idx((size_t)T * KE, -7), counts((size_t)SLOTS + MOE_ROUTE_TICKETS, 0);
    std::vector<float> w((size_t)T * KE, -7.0f), logits((size_t)T * NS, -7.0f);
    const long long part = moe_route_scratch_bytes(RH_PER_BLOCK, RH_MC, HR);
    std::vector<float> route_part((size_t)(part > 0 ? part / 4 : 1), -7.0f);
    /* the fused tail (argv[3] "fused": the mode the runtime picks for T): its outputs poisoned,
     * the slots at a permutation (the tiles must carry slot_of[e]) */
    const int mode = argc == 4 ? moe_route_fuse_mode(T, KE, H, 256 / 32, RH_SCATTER) : MOE_ROUTE_FUSE_OFF;
    const int align = RH_ALIGN;
    const long long rows = moe_max_rows(T, KE, SLOTS, align) + T + 1, ntiles = moe_max_tiles(T, KE, SLOTS, align);
    std::vector<int> slot_of(SLOTS), offsets((size_t)SLOTS + 1, -7), cursor(SLOTS, -7), tiles(4 * (size_t)ntiles, -7),
        num_tiles(1, -7), row_of((size_t)T * KE, -7);
    std::vector<moe_half_t> xs((size_t)rows * H, 0xffff);
    std::vector<float> xsc(RH_FP8 ? (size_t)rows * (H / 128) : 1, -7.0f);
    for (int e = 0; e < SLOTS; e++)
        slot_of[e] = SLOTS - 1 - e;
    moe_route_fuse_t fuse = {};
    if (mode) {
        fuse.mode = mode, fuse.align = align, fuse.slot_of = slot_of.data(), fuse.offsets = offsets.data();
        fuse.cursor = cursor.data(), fuse.tiles = reinterpret_cast<moe_tile_t *>(tiles.data());
        fuse.num_tiles = num_tiles.data(), fuse.xs = xs.data(), fuse.row_of = row_of.data(), fuse.xsc = xsc.data();
    }
    const unsigned gx = (unsigned)((T + RH_PER_BLOCK - 1) / RH_PER_BLOCK), gy = moe_route_split(T, RH_PER_BLOCK, RH_GIVEN_W ? 0 : HR);
    host_launch(gx, gy, RH_SMEM, [&] {
        RH_ROUTE(x.data(),
#if RH_W32
                 wr32.data(),
#else
                 wr.data(),
#endif
                 sel.data(), lb.data(), T, idx.data(), w.data(), counts.data(),
                 route_part.data(), fuse
#if RH_GATE
                 , wg.data()
#endif
#if RH_TRAIN
                 , logits.data()
#endif
#if RH_GIVEN
                 , gids.data()
#endif
#if RH_GIVEN_W
                 , gw.data()
#endif
#if RH_OWN
                 , rx.data()
#endif
#if RH_ESCALE
                 , es.data()
#endif
        );
    });
    const std::vector<int> dropped(1, counts[(size_t)SLOTS + MOE_ROUTE_BAD_IDS]);
    counts.resize((size_t)SLOTS);
    const long fused_bad = mode ? check_fused(mode, T, x, idx, w, counts, slot_of, align, offsets, cursor, tiles,
                                              num_tiles[0], xs, row_of, xsc)
                                : 0;
    FILE *out = fopen(argv[2], "wb");
    ok = out && put(out, idx) && put(out, w) && put(out, counts) && (!RH_TRAIN || put(out, logits)) &&
         (!RH_GIVEN || put(out, dropped));
    if (out)
        ok = fclose(out) == 0 && ok;
    printf("  route_host: %d tokens, %u x %u blocks, fuse mode %d\n", T, gx, gy, mode);
    return ok && !fused_bad ? 0 : 1;
}
