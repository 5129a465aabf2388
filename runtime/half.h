/* half.h — the one home of the half-precision conversions (bf16 and fp16
 * as uint16_t bit patterns of a spec's dtype), for the runtime (the cuDNN
 * self-check), the CPU reference and the tools. */
#ifndef MOEGEN_HALF_H
#define MOEGEN_HALF_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

/* Half bits -> float, exact (NaN stays NaN, subnormals kept). */
float moe_half_to_float(uint16_t v, moe_dtype_t dt);

/* Float -> half bits, round to nearest even. Overflow gives +-inf, NaN gives
 * a quiet NaN of the same sign, subnormal results are rounded, not flushed. */
uint16_t moe_float_to_half(float f, moe_dtype_t dt);

/* dst[i] = moe_half_to_float(src[i], dt) for i < n. */
void moe_half_row_to_float(const uint16_t *src, float *dst, size_t n, moe_dtype_t dt);

#endif
