@ -- pack.lua — the device-side weight pack (family pack, gen/family_pack.c):
@ -- `count` slots of a packed tensor (w1p, b1p, w2 or b2; tensor is
@ -- pack_geom.h's MOE_PACK_*) from first on, gathered from strided sources
@ -- (W1, b1: gate src0 and up src1; W2, b2: src0). One thread per packed
@ -- element, grid-stride, so any grid is right; the writes are contiguous,
@ -- the reads follow the sources' strides. Where each element comes from is
@ -- gen/pack_geom.h's, pasted here verbatim (the runtime's host pack and the
@ -- vendored launcher's packing call the same functions). The runtime
@ -- checks the arguments (runtime/pack.c) and launches it through
@ -- moe_launch_kernel; it is emitted into every .cu.

/* gen/pack_geom.h, verbatim: the packed layout the host pack shares */
#line 1 "gen/pack_geom.h"
${p.pack_geom}
@ -- (a template line, so the next output line gets its #line back)

static_assert(MOE_PAIR_GRANULE == ${p.pair_granule}, "the plan's pairing granule is pack_geom.h's");

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(int tensor, unsigned short *__restrict__ dst, const unsigned short *src0, const unsigned short *src1,
            moe_pack_stride_t s0, moe_pack_stride_t s1, long long first, long long count) {
    long long R, C;
    moe_pack_dims(tensor, ${p.F}, ${p.H}, &R, &C);
    const long long per = R * C, total = count * per;
    dst += first * per;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i / per, rc = i - e * per, pr = rc / C, c = rc - pr * C;
        long long row;
        const int up = moe_pack_source(tensor, pr, ${p.F}, &row);
        const moe_pack_stride_t s = up ? s1 : s0;
        dst[i] = (up ? src1 : src0)[e * s.expert + row * s.row + c * s.col];
    }
}
