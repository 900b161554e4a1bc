// SPDX-License-Identifier: MIT
// The software fp16/bf16 rounding against the compiler's own conversions (libgcc's correctly
// rounded __truncsfhf2 for _Float16) and against hand-checked edge cases.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "core/half.h"

using namespace nf4;

namespace {
#if defined(__FLT16_MANT_DIG__)
std::uint16_t reference_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  std::uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
#else
// Without _Float16 (clang before 15 on x86): the nearest fp16, ties to even, by exact double
// arithmetic over every finite fp16 value (ascending in the bit pattern for positive values).
std::uint16_t reference_f16(float f) {
  static const std::vector<double> values = [] {
    std::vector<double> v(0x7c00);
    for (int h = 0; h < 0x7c00; ++h) v[h] = (h >> 10) == 0 ? std::ldexp(h & 0x3ff, -24) : std::ldexp(1024 + (h & 0x3ff), (h >> 10) - 25);
    return v;
  }();
  const auto sign = static_cast<std::uint16_t>(std::signbit(f) ? 0x8000 : 0);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // halfway to 2^16 and above round to infinity
  if (a >= 65504.0) return sign | 0x7bff;
  const auto hi = static_cast<std::size_t>(std::lower_bound(values.begin(), values.end(), a) - values.begin());
  if (values[hi] == a) return static_cast<std::uint16_t>(sign | hi);
  const std::size_t lo = hi - 1;
  const double dl = a - values[lo], dh = values[hi] - a;
  return static_cast<std::uint16_t>(sign | (dl < dh || (dl == dh && (lo & 1) == 0) ? lo : hi));
}
#endif
// bf16 reference: exact via double arithmetic on the rounding interval.
std::uint16_t reference_bf16(float f) {
  if (std::isnan(f)) return bf16_from_float(f);
  const std::uint32_t u = float_bits(f);
  const std::uint32_t down = u & 0xffff0000u;
  const double lo = bits_float(down), hi = (u & 0x7fffffffu) >= 0x7f7f0000u ? std::copysign(std::ldexp(1.0, 128), f) : bits_float(down + 0x10000u);
  const double dl = std::fabs(static_cast<double>(f) - lo), dh = std::fabs(hi - static_cast<double>(f));
  if (dl < dh || (dl == dh && ((down >> 16) & 1u) == 0)) return static_cast<std::uint16_t>(down >> 16);
  return static_cast<std::uint16_t>((down + 0x10000u) >> 16);
}
}  // namespace

TEST_CASE("fp16 rounding matches the compiler on a dense sweep of all float bit patterns") {
  std::int64_t mismatches = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 997) {  // ~4.3M patterns, all exponents, both signs
    const float f = bits_float(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    mismatches += f16_from_float(f) != reference_f16(f);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 rounding is exact around every fp16 subnormal, normal boundary and overflow") {
  for (std::uint32_t base : {0x33000000u, 0x33800000u, 0x387fc000u, 0x38800000u, 0x477fe000u, 0x477ff000u, 0x47800000u}) {
    for (std::uint32_t d = 0; d < 4096; ++d) {
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        const float f = bits_float((base - 2048 + d) | sign);
        CHECK(f16_from_float(f) == reference_f16(f));
      }
    }
  }
  CHECK(f16_from_float(-0.0f) == 0x8000);
  CHECK(f16_from_float(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK((f16_from_float(std::nanf("")) & 0x7c00) == 0x7c00);
  CHECK((f16_from_float(std::nanf("")) & 0x03ff) != 0);
}

TEST_CASE("bf16 rounding is round-to-nearest-even, keeps NaN and signed zero") {
  std::int64_t mismatches = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 1009) {
    const float f = bits_float(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    mismatches += bf16_from_float(f) != reference_bf16(f);
  }
  CHECK(mismatches == 0);
  CHECK(bf16_from_float(bits_float(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(bf16_from_float(bits_float(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(bf16_from_float(-0.0f) == 0x8000);
  CHECK(bf16_from_float(bits_float(0x7f7fffffu)) == 0x7f80);  // max float rounds to inf
  const std::uint16_t nan = bf16_from_float(bits_float(0x7f800001u));  // signalling NaN whose payload is below bit 16
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);
}

TEST_CASE("widening fp16 and bf16 is exact for every 16-bit pattern") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = float_from_f16(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    CHECK(f16_from_float(f) == h);
    CHECK(bf16_from_float(float_from_bf16(static_cast<std::uint16_t>(h))) == h);
  }
}
