// SPDX-License-Identifier: MIT
// Shared by the shaders: the format constants (generated from core/format.h at build time) and the
// fp32 -> fp16 / bf16 round-to-nearest-even conversions with integer operations only. Vulkan lets
// packHalf2x16 round either way and nf4 needs no float16 arithmetic or 16-bit storage, so these
// mirror core/half.h line for line (test_vulkan.cpp checks them bit for bit through the kernel).
// packHalf2x16 is used instead only on a device where shaders/f16_check.comp compared it with
// f16_from_bits on every non-NaN fp32 input (see Kernels::enable_f16_hardware).
#ifndef NF4_SHADER_FORMAT_GLSL
#define NF4_SHADER_FORMAT_GLSL

#include "nf4_format_tables.glsl"

uint bf16_from_bits(uint u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;  // NaN: keep quiet
  uint rounding = 0x7fffu + ((u >> 16) & 1u);                        // ties to even
  return (u + rounding) >> 16;                                       // overflow carries into inf correctly
}

// Two bf16 results packed (a in the low half) for inputs known not to be NaN: bf16_from_bits
// without its NaN case, which is all it needs there (inf and the overflow to inf round the same).
uint bf16_pair_not_nan(uint a, uint b) {
  uint ra = a + 0x7fffu + ((a >> 16) & 1u);
  uint rb = b + 0x7fffu + ((b >> 16) & 1u);
  return (ra >> 16) | (rb & 0xffff0000u);
}

uint f16_from_bits(uint u) {
  uint sign = (u >> 16) & 0x8000u;
  uint abs_ = u & 0x7fffffffu;
  if (abs_ > 0x7f800000u) return sign | 0x7e00u | ((abs_ >> 13) & 0x3ffu);  // NaN
  if (abs_ >= 0x477ff000u) return sign | 0x7c00u;                           // rounds to >= 65520: inf
  if (abs_ < 0x38800000u) {
    // Result is an fp16 subnormal (or zero): value = abs_float * 2^24 rounded to an integer.
    if (abs_ < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (tie at 2^-25 goes to 0 as well)
    uint e = abs_ >> 23;                  // 102..112
    uint mant = (abs_ & 0x7fffffu) | 0x800000u;
    uint shift = 126u - e;                // 14..24
    uint q = mant >> shift;
    uint rem = mant & ((1u << shift) - 1u);
    uint half_ = 1u << (shift - 1u);
    uint r = q + ((rem > half_ || (rem == half_ && (q & 1u) != 0u)) ? 1u : 0u);
    return sign | r;
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint rebased = abs_ - 0x38000000u;
  uint r = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return sign | (r >> 13);
}

// Each row's codec (core/types.h, NF4_DTYPES; NF4_ENCODE_OUT names it for a shader's OUT_DTYPE):
// fp32 bits to the row's bits, round to nearest even, as DtypeCodec<row>::from_bits (core/dtype.h).
uint nf4_encode_F16(uint u) { return f16_from_bits(u); }
uint nf4_encode_BF16(uint u) { return bf16_from_bits(u); }
uint nf4_encode_F32(uint u) { return u; }

#endif
