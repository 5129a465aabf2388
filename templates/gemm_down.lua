@ -- gemm_down.lua — grouped down projection:
@ -- obuf[rows, H] = hbuf[rows, F] . W2[expert]^T (+ b2[expert]), W2 [E, H, F].
@ if (p.tile.gemv or 0) > 0 then  -- the gemv grid, few rows per expert (templates/gemm_gemv.lua)
@   import("gemm_gemv").down(p)
@   return
@ end
@ if p.tile.consumers > 0 then   -- sm_90a: the wgmma kernel (templates/gemm_sm90.lua)
@   import("gemm_sm90").down(p)
@   return
@ end
@ local G = import("gemm_sm80")
@ local c = G.config(p, "down")
namespace ${p.kernel}_impl {
@ G.device_code(p, c)
}  // namespace ${p.kernel}_impl

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ hbuf, const moe_half_t *__restrict__ w2, const moe_half_t *__restrict__ b2,
            const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *__restrict__ obuf) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
@ G.body_start(p, c, "hbuf", "w2")
@ if not p.ffn_bias then
    (void)b2;
@ end

    /* Epilogue: fragment (mi, ni) holds rows r, r + 8 and columns oc, oc + 1. */
@ if p.ffn_bias then
    const moe_half_t *__restrict__ bias = b2 + (long long)expert * N + n0;
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
                    *(unsigned *)(obuf + ((long long)(row_start + r) * NOUT + n0 + oc)) = v;
@ end
            }
    }
@ if c.staged then
    __syncthreads();
    store_staged(obuf + ((long long)row_start * NOUT + n0), sbase, rows, NOUT - n0);
@ end
}
