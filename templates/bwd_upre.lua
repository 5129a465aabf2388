@ -- bwd_upre.lua — the up projection's pre-activation for the backward
@ -- (family bwd_upre, gen/family_bwd.c): U[rows, 2F] = xs[rows, H] .
@ -- W1p[expert]^T (+ b1p[expert]), rounded to the dtype, in W1p's packed
@ -- column order (gate and up in granules of 8), over the tile table: the
@ -- backward recomputes U with it when the training forward did not save it
@ -- (recompute_u; the forward saves U from the up GEMM's epilogue).
@ -- The sm_80 GEMM's mainloop (templates/gemm_sm80.lua, kind "pre"), which
@ -- compiles for sm_80 and sm_90a alike; the epilogue is gemm_down.lua's
@ -- store with 2F output columns. Rows past a tile's rows are not written.
@ local G = import("gemm_sm80")
@ local c = G.config(p, "pre")
namespace ${p.kernel}_impl {
@ G.device_code(p, c)
}  // namespace ${p.kernel}_impl

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ xs, const moe_half_t *__restrict__ w1p, const moe_half_t *__restrict__ b1p,
            const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *__restrict__ ubuf) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
@ G.body_start(p, c, "xs", "w1p")
@ if not p.ffn_bias then
    (void)b1p;
@ end

    /* Epilogue: fragment (mi, ni) holds rows r, r + 8 and columns oc, oc + 1. */
@ if p.ffn_bias then
    const moe_half_t *__restrict__ bias = b1p + (long long)expert * N + n0;
@ end
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int oc = wn * WTN + ni * 8 + 2 * t;
@ if c.n_tail then
        if (n0 + wn * WTN + ni * 8 >= N)
            continue;
@ end
@ if p.ffn_bias then
        const unsigned bv = *(const unsigned *)(bias + oc);
        const float b0 = moe_lo_float(bv), b1 = moe_hi_float(bv);
@ end
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * WTM + mi * 16 + g + 8 * h;
@ if p.ffn_bias then
                const unsigned v = moe_pack2(acc[mi][ni][2 * h] + b0, acc[mi][ni][2 * h + 1] + b1);
@ else
                const unsigned v = moe_pack2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
@ end
@ if c.staged then
                st_shared_u32(sbase + (r * LDC + oc) * 2, v);
@ else
                if (r < rows)
                    *(unsigned *)(ubuf + ((long long)(row_start + r) * NOUT + n0 + oc)) = v;
@ end
            }
    }
@ if c.staged then
    __syncthreads();
    store_staged(ubuf + ((long long)row_start * NOUT + n0), sbase, rows, NOUT - n0);
@ end
}
