/* half.c — half-precision bits <-> float, exact (see half.h). */
#include "half.h"

#include <string.h>

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F)                                   /* inf, NaN */
        return u2f(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return u2f(sign);                /* +-0 */
        int ex = 1;                                  /* subnormal: normalize */
        while (!(m & 0x400u)) { m <<= 1; ex--; }
        m &= 0x3FFu;
        return u2f(sign | ((uint32_t)(ex + 112) << 23) | (m << 13));
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

static uint16_t float_to_fp16(float f) {
    uint32_t x = f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u)                             /* NaN: quiet, keep payload top */
        return (uint16_t)(sign | 0x7E00u | ((x >> 13) & 0x3FFu));
    if (x >= 0x477FF000u)                            /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (x >= 0x38800000u) {                          /* normal: >= 2^-14 */
        x -= 0x38000000u;                            /* rebias exponent 127 -> 15 */
        x += 0xFFFu + ((x >> 13) & 1u);              /* round to nearest even */
        return (uint16_t)(sign | (x >> 13));
    }
    uint32_t e = x >> 23;
    if (e < 102)                                     /* < 2^-25: rounds to 0 */
        return sign;
    uint32_t mant = (x & 0x7FFFFFu) | 0x800000u;     /* value = mant * 2^(e-150) */
    uint32_t shift = 126 - e;                        /* units of 2^-24: 14..24 */
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);                     /* q == 0x400 is the min normal */
}

static float bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

static uint16_t float_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)             /* NaN: quiet */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);                 /* round to nearest even; overflow -> inf */
    return (uint16_t)(x >> 16);
}

float moe_half_to_float(uint16_t v, moe_dtype_t dt) {
    return dt == MOE_DTYPE_FP16 ? fp16_to_float(v) : bf16_to_float(v);
}

uint16_t moe_float_to_half(float f, moe_dtype_t dt) {
    return dt == MOE_DTYPE_FP16 ? float_to_fp16(f) : float_to_bf16(f);
}

void moe_half_row_to_float(const uint16_t *src, float *dst, size_t n, moe_dtype_t dt) {
    if (dt == MOE_DTYPE_FP16)
        for (size_t i = 0; i < n; i++) dst[i] = fp16_to_float(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}
