@ -- gemm_up_swiglu.lua — grouped up projection with the SwiGLU fused in:
@ -- hbuf[rows, F] = act(xs[rows, H] . W1p[expert]^T (+ b1p[expert])).
@ -- W1p is the gate/up-paired [E, 2F, H]: in each 16 packed rows, 8 gate
@ -- rows then the 8 matching up rows, so the n8 fragments 2i (gate) and
@ -- 2i + 1 (up) of a warp hold the same 8 output columns in the same
@ -- registers and the activation is register-local.
@ -- A training spec (p.spec.training) takes one more parameter, ubuf: when
@ -- not NULL the epilogue also stores the pre-activation U [rows, 2F]
@ -- (bias included, rounded to the dtype, packed columns), which the
@ -- backward's activation gradient reads (docs/DESIGN.md, "Backward").
@ if (p.tile.gemv or 0) > 0 then  -- the gemv grid, few rows per expert (templates/gemm_gemv.lua)
@   import("gemm_gemv").up(p)
@   return
@ end
@ if p.tile.consumers > 0 then   -- sm_90a: the wgmma kernel (templates/gemm_sm90.lua)
@   import("gemm_sm90").up(p)
@   return
@ end
@ local G = import("gemm_sm80")
@ local c = G.config(p, "up")
namespace ${p.kernel}_impl {
@ G.device_code(p, c)
@ local A = import("activation")
@ local act = A.device(p)
@ local function call(args) return A.call_slot(p, act, "expert", args) end
}  // namespace ${p.kernel}_impl

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ xs, const moe_half_t *__restrict__ w1p, const moe_half_t *__restrict__ b1p,
            const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *__restrict__ hbuf${p.spec.training and ", moe_half_t *__restrict__ ubuf" or ""}) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
@ G.body_start(p, c, "xs", "w1p")
@ if not p.ffn_bias then
    (void)b1p;
@ end

    /* Epilogue. Packed column 16j + r is gate (r < 8) or up (r >= 8) of
     * output column 8j + r % 8: fragment 2 nj (gate) and 2 nj + 1 (up) give
     * output columns oc, oc + 1 of rows r, r + 8. */
    const int oc0 = n0 / 2;  /* first output column of the CTA */
@ if p.ffn_bias then
    const moe_half_t *__restrict__ bias = b1p + (long long)expert * N + n0;
@ end
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
        const int oc = (wn * WTN) / 2 + nj * 8 + 2 * t;
@ if c.n_tail then
        if (n0 + wn * WTN + nj * 16 >= N)
            continue;
@ end
@ if p.ffn_bias then
        const int pn = wn * WTN + nj * 16 + 2 * t;  /* packed gate column in the tile; up is pn + 8 */
        const unsigned bg = *(const unsigned *)(bias + pn), bu = *(const unsigned *)(bias + pn + 8);
        const float bg0 = moe_lo_float(bg), bg1 = moe_hi_float(bg), bu0 = moe_lo_float(bu), bu1 = moe_hi_float(bu);
@ end
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * WTM + mi * 16 + g + 8 * h;
@ local bg0, bg1, bu0, bu1 = "", "", "", ""
@ if p.ffn_bias then bg0, bg1, bu0, bu1 = " + bg0", " + bg1", " + bu0", " + bu1" end
                const float o0 = ${call("acc[mi][2 * nj][2 * h]" .. bg0 .. ", acc[mi][2 * nj + 1][2 * h]" .. bu0)};
                const float o1 = ${call("acc[mi][2 * nj][2 * h + 1]" .. bg1 .. ", acc[mi][2 * nj + 1][2 * h + 1]" .. bu1)};
@ if p.spec.training then
                if (ubuf && r < rows) {  /* U: gate columns at the packed column, up 8 further */
                    moe_half_t *__restrict__ ur =
                        ubuf + ((long long)(row_start + r) * N + n0 + wn * WTN + nj * 16 + 2 * t);
                    *(unsigned *)ur = moe_pack2(acc[mi][2 * nj][2 * h]${bg0}, acc[mi][2 * nj][2 * h + 1]${bg1});
                    *(unsigned *)(ur + 8) = moe_pack2(acc[mi][2 * nj + 1][2 * h]${bu0}, acc[mi][2 * nj + 1][2 * h + 1]${bu1});
                }
@ end
@ if c.staged then
                st_shared_u32(sbase + (r * LDC + oc) * 2, moe_pack2(o0, o1));
@ else
                if (r < rows)
                    *(unsigned *)(hbuf + ((long long)(row_start + r) * NOUT + oc0 + oc)) = moe_pack2(o0, o1);
@ end
            }
    }
@ if c.staged then
    __syncthreads();
    store_staged(hbuf + ((long long)row_start * NOUT + oc0), sbase, rows, NOUT - oc0);
@ end
}
