/* fp8.c — e4m3 bits <-> float and block quantization (see fp8.h). */
#include "fp8.h"

#include "half.h"

#include <math.h>
#include <string.h>

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float moe_e4m3_to_float(uint8_t v) {
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24, e = (v >> 3) & 0xFu, m = v & 7u;
    if (e == 15 && m == 7)
        return u2f(sign | 0x7FC00000u);                  /* NaN */
    if (e == 0)                                          /* subnormal: m * 2^-9 */
        return u2f(sign | f2u((float)m * 0x1p-9f));
    return u2f(sign | ((e + 120u) << 23) | (m << 20));   /* rebias 7 -> 127 */
}

uint8_t moe_float_to_e4m3(float f) {
    uint32_t x = f2u(f);
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    x &= 0x7FFFFFFFu;
    if (x > 0x7F800000u)                                 /* NaN */
        return sign | 0x7Fu;
    if (x >= 0x43E00000u)                                /* >= 448, infinity included: saturate */
        return sign | 0x7Eu;
    if (x >= 0x3C800000u) {                              /* normal: >= 2^-6 */
        x += 0x7FFFFu + ((x >> 20) & 1u);                /* round the 20 dropped bits to nearest even */
        return sign | (uint8_t)((x - (120u << 23)) >> 20); /* rebias 127 -> 7; below 448 stays <= 0x7E */
    }
    /* subnormal: units of 2^-9 (exact scaling); 8 units is the smallest normal, code 0x08 */
    return sign | (uint8_t)nearbyintf(u2f(x) * 512.0f);
}

float moe_fp8_quantize_block(const float *v, size_t n, uint8_t *q) {
    float amax = MOE_FP8_AMAX_MIN;
    for (size_t i = 0; i < n; i++)
        if (fabsf(v[i]) > amax)
            amax = fabsf(v[i]);
    const float mul = MOE_E4M3_MAX / amax;
    for (size_t i = 0; i < n; i++)
        q[i] = moe_float_to_e4m3(v[i] * mul);
    return amax / MOE_E4M3_MAX;
}

void moe_fp8_quantize_weight(const uint16_t *w, long long ld, long long N, long long K, long long br, long long bc,
                             uint8_t *q, float *s) {
    for (long long n0 = 0; n0 < N; n0 += br)
        for (long long k0 = 0; k0 < K; k0 += bc) {
            float amax = MOE_FP8_AMAX_MIN;
            for (long long n = n0; n < n0 + br; n++)
                for (long long k = k0; k < k0 + bc; k++) {
                    const float a = fabsf(moe_half_to_float(w[n * ld + k], MOE_DTYPE_BF16));
                    if (a > amax)
                        amax = a;
                }
            const float mul = MOE_E4M3_MAX / amax;
            for (long long n = n0; n < n0 + br; n++)
                for (long long k = k0; k < k0 + bc; k++)
                    q[n * K + k] = moe_float_to_e4m3(moe_half_to_float(w[n * ld + k], MOE_DTYPE_BF16) * mul);
            s[(n0 / br) * (K / bc) + k0 / bc] = amax / MOE_E4M3_MAX;
        }
}
