// SPDX-License-Identifier: MIT
// The bitsandbytes 4-bit format constants, defined once. Included by C++, CUDA (.cu) and used to
// generate the GLSL include (shaders/gen_format_glsl.cpp), so every backend reads the same numbers.
#pragma once

#include <array>
#include <cstdint>

#include "core/host_device.h"

namespace nf4::format {

inline constexpr int kMinBlocksize = 32;
inline constexpr int kMaxBlocksize = 4096;
inline constexpr int kMaxNestedBlocksize = 1 << 20;
inline constexpr int kQuantMapSize = 16;
inline constexpr int kNestedCodeSize = 256;

// Nibble order: element 2j is the HIGH nibble of byte j, element 2j+1 the LOW nibble.
NF4_HD constexpr unsigned code_of(std::uint8_t byte, bool odd_element) {
  return odd_element ? (byte & 15u) : (byte >> 4);
}

// bitsandbytes' device FP4 table for codes 0..7 (magnitudes); bit 3 is the sign. Built with
// `fl32(lut8[q & 7] * (q & 8 ? -1 : 1))`, which is exact, so code 8 is -0.0f (the saved
// quant_map has +0.0f there; bitsandbytes' kernel ignores the saved map for FP4).
inline constexpr float kFp4Magnitudes[8] = {0.0f,         0.005208333333f, 0.66666667f, 1.0f,
                                            0.33333333f, 0.5f,            0.16666667f, 0.25f};

// The standard NF4 table (bitsandbytes' `get_4bit_type("nf4")`). Used by the quantizer to make
// new data; dequantization always reads the table stored with the data.
inline constexpr float kNf4Table[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982251167297f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f};

// Value of FP4 code q as bitsandbytes' kernel computes it.
NF4_HD constexpr float fp4_value(unsigned q) {
  const float m = kFp4Magnitudes[q & 7u];
  return (q & 8u) ? -m : m;  // == fl32(m * -1.0f): negation is exact and gives -0.0f for 0
}

// FP4's 16 values, code by code: the table every backend decodes FP4 codes through.
inline constexpr std::array<float, 16> kFp4Values = [] {
  std::array<float, 16> v{};
  for (unsigned q = 0; q < 16; ++q) v[q] = fp4_value(q);
  return v;
}();

}  // namespace nf4::format
