// SPDX-License-Identifier: MIT
// Shared helpers for the test suite: the golden file, random weights, bitwise comparison.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint.h"
#include "tools/checkpoint/safetensors.h"
#include "core/types.h"
#include "nf4/nf4.h"
#include "lab/testdata/quantizer.h"

namespace nf4::test {

inline std::string data_path(const std::string& name) { return std::string(NF4_TEST_DATA_DIR) + "/" + name; }

struct GoldenCase {
  io::QuantizedParam param;
  std::string case_name;  // "c000"
  const io::TensorInfo* expected[std::size(kDtypes)] = {};  // indexed by nf4_dtype
};

// The golden file (bitsandbytes' own output), opened once.
const io::SafetensorsFile& golden_file();
const std::vector<GoldenCase>& golden_cases();

// Every output dtype, from core/types.h's table.
inline constexpr auto kDTypes = all_dtypes();
// The dtypes the fused product takes as x and y.
inline constexpr auto kProductDTypes = product_dtypes();
inline const char* dtype_label(nf4_dtype d) { return dtype_name(d).data(); }
// Every quant type, from core/types.h's table.
inline constexpr auto kQuantTypes = all_quant_types();

// Number of differing output elements (bitwise) between two buffers of n elements of dtype d.
inline std::int64_t differing_elements(const void* a, const void* b, std::int64_t n, nf4_dtype d) {
  const std::size_t es = nf4_dtype_size(d);
  std::int64_t diff = 0;
  const auto* pa = static_cast<const std::uint8_t*>(a);
  const auto* pb = static_cast<const std::uint8_t*>(b);
  for (std::int64_t i = 0; i < n; ++i) diff += std::memcmp(pa + i * es, pb + i * es, es) != 0;
  return diff;
}

// Whether `part` occurs in `s` (a message naming what it should).
inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// SplitMix64: the next value of the stream whose state is s (random test data without the cost
// of quantizing).
inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A quantized random weight of n elements.
cpu::QuantizedWeight random_weight(std::int64_t n, nf4_quant_type qt, int blocksize, bool nested, std::uint64_t seed,
                                   int nested_blocksize = 256);

// Random bnb-shaped data of n elements without quantizing: every code, random statistics (fp32
// absmax in [1e-4, 3), or 8-bit codes with nested scales in [0.001, 0.5) and an offset in [0, 0.1)),
// the saved quant_map of the type. Fast at any size; the oracle defines the answer.
cpu::QuantizedWeight synthetic_weight(std::int64_t n, nf4_quant_type qt, int blocksize, bool nested, std::uint64_t seed,
                                      int nested_blocksize = 256);

// Sizes that sweep densely near zero and at block edges, then geometrically.
std::vector<std::int64_t> sweep_sizes(std::int64_t max_size);

}  // namespace nf4::test
