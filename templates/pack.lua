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
    moe_pdl_begin();
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
@ if p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3" then
@   local block = p.spec.quant.scaling == "block"

/* The fp8 packs (runtime/pack_fp8.c has the host's; a GPU test holds them
 * equal byte for byte). ${p.kernel}_e4m3: e4m3 W1 or W2 rows, as the 16-bit
 * pack places them, one thread per packed byte. */
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}_e4m3(int tensor, unsigned char *__restrict__ dst, const unsigned char *src0, const unsigned char *src1,
            moe_pack_stride_t s0, moe_pack_stride_t s1, long long first, long long count) {
    moe_pdl_begin();
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

/* The scales of W1 or W2 (sr x sc per slot: ${block and "128 x 128 blocks" or "one per row"}), in the
 * checkpoint's row order: W1's rows below sr / 2 from the gate source, the rest from up. */
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}_scales(int tensor, float *__restrict__ dst, const float *src0, const float *src1, moe_pack_stride_t s0,
            moe_pack_stride_t s1, long long first, long long count, long long sr, long long sc) {
    moe_pdl_begin();
    const long long per = sr * sc, total = count * per;
    dst += first * per;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i / per, rc = i - e * per, r = rc / sc, c = rc - r * sc;
        const int up = tensor == MOE_PACK_W1 && r >= sr / 2;
        const moe_pack_stride_t s = up ? s1 : s0;
        dst[i] = (up ? src1 : src0)[e * s.expert + (up ? r - sr / 2 : r) * s.row + c * s.col];
    }
}

/* bf16 W1 or W2 quantized into the fp8 layout: one CTA per (slot, scale
 * block) of br x bc plain rows and columns (${block and "128 x 128" or "1 x K"}): the block's amax
 * (at least 1e-4), scale amax / 448, e4m3(w * (448 / amax)) round to
 * nearest even, saturating, at the packed row (runtime/pack_fp8.c's rule). */
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}_quantize(int tensor, unsigned char *__restrict__ dst, float *__restrict__ dst_scales,
            const unsigned short *src0, const unsigned short *src1, moe_pack_stride_t s0, moe_pack_stride_t s1,
            long long first, long long count) {
    moe_pdl_begin();
    __shared__ float red[${p.threads // 32}];
    long long N, K;
    moe_pack_dims(tensor, ${p.F}, ${p.H}, &N, &K);
@   if block then
    const long long br = 128, bc = 128;
@   else
    const long long br = 1, bc = K;
@   end
    const long long sr = N / br, sc = K / bc, half = N / 2;
    const long long b = blockIdx.x, e = b / (sr * sc), rb = (b / sc) % sr, cb = b % sc;
    if (e >= count)
        return;
    const long long slot = first + e, n = br * bc;
    float m = 1e-4f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const long long r = rb * br + i / bc, c = cb * bc + i % bc;
        const int up = tensor == MOE_PACK_W1 && r >= half;
        const moe_pack_stride_t s = up ? s1 : s0;
        const unsigned short v = (up ? src1 : src0)[e * s.expert + (up ? r - half : r) * s.row + c * s.col];
        m = fmaxf(m, fabsf(__uint_as_float((unsigned)v << 16)));
    }
    for (int o = 16; o; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < ${p.threads // 32}; ++w)
        m = fmaxf(m, red[w]);
    const float mul = 448.0f / m;
    if (threadIdx.x == 0)
        dst_scales[slot * sr * sc + rb * sc + cb] = m / 448.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const long long r = rb * br + i / bc, c = cb * bc + i % bc;
        const int up = tensor == MOE_PACK_W1 && r >= half;
        const moe_pack_stride_t s = up ? s1 : s0;
        const unsigned short v = (up ? src1 : src0)[e * s.expert + (up ? r - half : r) * s.row + c * s.col];
        unsigned short q2;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(q2) : "f"(0.0f), "f"(__uint_as_float((unsigned)v << 16) * mul));
        const long long pr = tensor == MOE_PACK_W1 ? moe_pack_row(r, ${p.F}) : r;
        dst[(slot * N + pr) * K + c] = (unsigned char)(q2 & 0xFF);
    }
}
@ end
