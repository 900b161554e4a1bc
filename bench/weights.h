// SPDX-License-Identifier: MIT
// The weights and activations `nf4 bench` times: nested NF4 (nested blocksize 256) of any size,
// filled from a seeded generator within the format's ranges, without the test-data quantizer
// (lab/testdata), which the installed CLI does not carry. Every backend's dequantization and
// product take the same path whatever the codes and statistics (no branch on a value; the
// statistics keep every output a normal number), so the times are those of quantized weights.
#pragma once

#include <cstdint>
#include <vector>

#include "nf4/nf4.h"

namespace nf4::bench {

struct BenchWeight {
  std::int64_t numel = 0;
  int blocksize = 64;
  std::vector<std::uint8_t> packed;      // ceil(numel / 2) bytes of codes
  std::vector<std::uint8_t> absmax;      // one nested-absmax index per block
  std::vector<float> nested_absmax;      // one per 256 blocks
  std::vector<float> nested_code;        // 256 entries in [-1, 1]
  std::vector<float> quant_map;          // the NF4 table
  float nested_offset = 0.0f;

  // A description pointing at this weight's host buffers (valid while it lives); no output.
  nf4_tensor describe(nf4_dtype out_dtype) const;
};

BenchWeight make_bench_weight(std::int64_t numel, int blocksize, std::uint64_t seed);

// `n` values uniform in [-1, 1), for the products' x.
std::vector<float> bench_values(std::int64_t n, std::uint64_t seed);

}  // namespace nf4::bench
