@ -- swiglu.lua — the cuDNN path's standalone activation (family swiglu,
@ -- gen/family_swiglu.c): h [rows, F] = act(u [rows, 2F]) where u is the
@ -- packed up-matmul output, gate and up columns interleaved in granules of
@ -- 8 (the packed W1's pairing), rows = min(offsets[slots], cap). One thread per
@ -- 8 output columns (one 16-byte load of gate, one of up, one store),
@ -- grid-stride, so any grid is right. The same signature and semantics as
@ -- the kernel runtime/cudnn_graph.c compiled from its own string; the math
@ -- is templates/activation.lua's, the conversions the prelude's.
@ local A = import("activation")
namespace ${p.kernel}_impl {
@ local act = A.device(p)
}  // namespace ${p.kernel}_impl

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const uint4 *__restrict__ u, uint4 *__restrict__ h, const int *__restrict__ offsets, long long cap) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    constexpr int PAIR_GRANULE = ${p.pair_granule};  /* gate/up columns interleave in granules of this many */
    static_assert(PAIR_GRANULE == 8, "one 16-byte load of gate and one of up per thread");
    constexpr long long G = ${p.F // 8};  /* 8-column groups per output row */
    long long rows = offsets[${p.slots}];
@ if p.shared_act then
    const long long shared_row0 = offsets[${p.E}];  /* the shared expert's slots' rows, from here on */
@ end
    rows = rows < cap ? rows : cap;
    const long long total = rows * G;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / G;
        const long long j = i - r * G;
        const uint4 g4 = u[r * 2 * G + 2 * j], u4 = u[r * 2 * G + 2 * j + 1];
        const moe_half_t *gp = (const moe_half_t *)&g4, *upp = (const moe_half_t *)&u4;
        uint4 o4;
        moe_half_t *op = (moe_half_t *)&o4;
#pragma unroll
        for (int k = 0; k < 8; k++) op[k] = moe_from_float(${A.call(p, act, "r >= shared_row0", "moe_to_float(gp[k]), moe_to_float(upp[k])")});
        h[i] = o4;
    }
}
