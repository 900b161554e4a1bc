// SPDX-License-Identifier: MIT
// Software fp32 -> fp16 / bf16 conversion, round to nearest even, NaN stays NaN (quiet), signed
// zeros and infinities kept, fp16 subnormals produced exactly. Integer operations only, so it
// gives the same bits on every host, on CUDA devices without bf16 arithmetic (sm_75) and in GLSL
// (shaders/format.glsl mirrors these two functions line for line).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/format.h"

namespace nf4 {

NF4_HD inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

NF4_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

NF4_HD constexpr std::uint16_t bf16_from_bits(std::uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN: keep quiet
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return static_cast<std::uint16_t>((u + rounding) >> 16);    // overflow carries into inf correctly
}

NF4_HD constexpr std::uint16_t f16_from_bits(std::uint32_t u) {
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is an fp16 subnormal (or zero): value = abs_float * 2^24 rounded to an integer.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0 (tie at 2^-25 goes to 0 as well)
    const std::uint32_t exp = abs >> 23;                 // 102..112
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;              // 14..24
    const std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const std::uint32_t rebased = abs - 0x38000000u;
  const std::uint32_t r = rebased + 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

NF4_HD inline std::uint16_t f16_from_float(float f) { return f16_from_bits(float_bits(f)); }
NF4_HD inline std::uint16_t bf16_from_float(float f) { return bf16_from_bits(float_bits(f)); }

// Exact widening, for tests and for reading fp16/bf16 inputs.
NF4_HD inline float float_from_bf16(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }
NF4_HD inline float float_from_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    exp = 1;
    while ((mant & 0x400u) == 0) {  // normalize the subnormal
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace nf4
