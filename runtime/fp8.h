/* fp8.h — the one home of the fp8 e4m3 conversions on the host (the OCP
 * e4m3fn format: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
 * infinities; S.1111.111 is NaN; largest finite 448, smallest subnormal
 * 2^-9), and of the per-block activation quantization of the fp8 layer
 * (docs/DESIGN.md, "FP8"), for the runtime's weight quantization, the CPU
 * reference and the tools. The device code does the same with cvt.rn.satfinite. */
#ifndef MOEGEN_FP8_H
#define MOEGEN_FP8_H

#include <stddef.h>
#include <stdint.h>

/* Largest finite e4m3 value, and the amax floor of a quantized block (a
 * block of zeros gets the scale MOE_FP8_AMAX_MIN / 448, not 0). */
#define MOE_E4M3_MAX 448.0f
#define MOE_FP8_AMAX_MIN 1e-4f

/* e4m3 bits -> float, exact (0x7F and 0xFF are NaN). */
float moe_e4m3_to_float(uint8_t v);

/* float -> e4m3 bits: round to nearest even, then saturate: every finite
 * value beyond 448 and +-infinity give +-448 (PTX's cvt.rn.satfinite);
 * NaN gives NaN (0x7F, with the sign bit of the input). Subnormal results
 * are rounded, not flushed; -0 stays 0x80. */
uint8_t moe_float_to_e4m3(float f);

/* Quantize n values as one block: amax = max(max |v[i]|, MOE_FP8_AMAX_MIN),
 * q[i] = e4m3(v[i] * (448 / amax)) (the product formed in fp32); returns the
 * block's scale amax / 448 (v[i] ~ e4m3_to_float(q[i]) * scale). The
 * activations' rule: one block per token per 128 columns. */
float moe_fp8_quantize_block(const float *v, size_t n, uint8_t *q);

/* Quantize a weight matrix w [N, K] (bf16 bits, row-major, element (n, k)
 * at w[n * ld + k]) to e4m3 q [N, K] (row stride K) with one fp32 scale
 * per block of br rows x bc columns (br divides N, bc divides K): the
 * block rule of moe_fp8_quantize_block over each block's values; s is
 * [N / br, K / bc] row-major. The fp8 layer uses (128, 128) for "block"
 * scaling and (1, K) for "channel". */
void moe_fp8_quantize_weight(const uint16_t *w, long long ld, long long N, long long K, long long br, long long bc,
                             uint8_t *q, float *s);

#endif
