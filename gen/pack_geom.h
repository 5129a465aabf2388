/* pack_geom.h — the packed expert-weight layout: the one home of where
 * each element of a checkpoint's W1, b1, W2 and b2 lands in the tensors the
 * GEMMs read (w1p, b1p, w2, b2), and of the gate/up pairing granule.
 *
 * Plain C with no includes, callable from host and device code: the
 * planner reads the granule (gen/plan.c), the runtime's host and device
 * packs include it (runtime/pack.c), and emission pastes this file
 * verbatim into every .cu ahead of the pack kernel (templates/pack.lua),
 * where the kernel and the vendored launcher's packing functions
 * (templates/host.lua) call it. Changing this file changes kernels_out/
 * (make kernels).
 *
 * The packed layout, per expert slot (row-major, 16-bit elements):
 *   w1p [2F, H]  gate and up rows paired in granules of MOE_PAIR_GRANULE:
 *                packed row 16j + i is gate row 8j + i for i < 8, up row
 *                8j + i - 8 otherwise (one GEMM output tile holds matching
 *                gate and up columns)
 *   b1p [2F]     paired like w1p's rows
 *   w2  [H, F]   the Linear layout, unchanged
 *   b2  [H]
 * Slots follow one another: slot s of w1p starts at element s * 2F * H. */
#ifndef MOEGEN_PACK_GEOM_H
#define MOEGEN_PACK_GEOM_H

#if defined(__CUDACC__)
#define MOE_PACK_FN static inline __host__ __device__
#else
#define MOE_PACK_FN static inline
#endif

/* Gate and up rows of w1p (and b1p) alternate in blocks of this many. F is
 * a multiple of it (the spec's ffn is a multiple of 8). */
#define MOE_PAIR_GRANULE 8

/* The packed tensors (moe.h's moe_tensor has the same values). */
enum { MOE_PACK_W1 = 0, MOE_PACK_B1 = 1, MOE_PACK_W2 = 2, MOE_PACK_B2 = 3 };

/* Element strides of one source tensor: element (e, row, col) of a
 * source is at base + e * expert + row * row_ + col * col (see
 * moe_pack_source for what row and col are). */
typedef struct {
    long long expert, row, col;
} moe_pack_stride_t;

/* Packed row of plain W1 row r (0 <= r < 2F: gate rows, then up rows). */
MOE_PACK_FN long long moe_pack_row(long long r, long long F) {
    const long long g = MOE_PAIR_GRANULE, up = r >= F, f = up ? r - F : r;
    return (f / g) * 2 * g + up * g + f % g;
}

/* Plain W1 row of packed row pr: the inverse of moe_pack_row. */
MOE_PACK_FN long long moe_unpack_row(long long pr, long long F) {
    const long long g = MOE_PAIR_GRANULE, w = pr % (2 * g), up = w >= g;
    return up * F + (pr / (2 * g)) * g + w - up * g;
}

/* Rows and columns of one expert (slot) of packed tensor t: W1 2F x H,
 * b1 2F x 1, W2 H x F, b2 H x 1. */
MOE_PACK_FN void moe_pack_dims(int t, long long F, long long H, long long *rows, long long *cols) {
    *rows = t == MOE_PACK_W1 || t == MOE_PACK_B1 ? 2 * F : H;
    *cols = t == MOE_PACK_W1 ? H : t == MOE_PACK_W2 ? F : 1;
}

/* The source of packed row pr of tensor t: returns which source holds it
 * (0: gate, or the only source of W2 and b2; 1: up) and sets *row to the
 * row in that source. Sources are indexed (expert, row, col) as
 *   W1 gate, up: (e, f, h), f < F, h < H
 *   b1 gate, up: (e, f, 0)
 *   W2:          (e, h, f), the Linear layout's order
 *   b2:          (e, h, 0)
 * and the packed element (slot, pr, col) comes from source element
 * (e, *row, col). */
MOE_PACK_FN int moe_pack_source(int t, long long pr, long long F, long long *row) {
    if (t == MOE_PACK_W2 || t == MOE_PACK_B2) {
        *row = pr;
        return 0;
    }
    const long long r = moe_unpack_row(pr, F);
    *row = r >= F ? r - F : r;
    return r >= F;
}

#endif
