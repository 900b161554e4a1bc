// SPDX-License-Identifier: MIT
#include "backends/cpu/gemv_oracle.h"

#include <bit>
#include <cstring>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/format.h"
#include "core/gemv.h"
#include "core/half.h"
#include "core/tensor.h"

namespace nf4::cpu {

float gemv_x_value(const void* x, nf4_dtype d, std::int64_t idx) {
  switch (d) {
    case NF4_DTYPE_F16: return float_from_f16(static_cast<const std::uint16_t*>(x)[idx]);
    case NF4_DTYPE_BF16: return float_from_bf16(static_cast<const std::uint16_t*>(x)[idx]);
    default: return static_cast<const float*>(x)[idx];
  }
}

void oracle_gemv_rows(const nf4_gemv_desc& g, std::int64_t first_row, std::int64_t rows) {
  const nf4_tensor& t = *g.weight;
  float values[16];
  value_table(t, values);
  const std::int64_t k = g.k;
  const std::int64_t leaves = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(k)));
  std::vector<float> w(static_cast<std::size_t>(k)), node(static_cast<std::size_t>(leaves));
  for (std::int64_t r = first_row; r < first_row + rows; ++r) {
    // w(r, c) = fl32(value(q_i) * absmax[i / blocksize]), i = r * k + c: the dequantized weight.
    for (std::int64_t c = 0; c < k; ++c) {
      const std::int64_t i = r * k + c;
      const unsigned q = format::code_of(t.packed[i / 2], (i & 1) != 0);
      w[c] = values[q] * oracle_absmax(t, i / t.blocksize);
    }
    for (std::int32_t j = 0; j < g.m; ++j) {
      // Level 0: the products, then +0.0f up to the next power of two.
      for (std::int64_t c = 0; c < k; ++c) node[c] = w[c] * gemv_x_value(g.x, g.x_dtype, j * k + c);
      for (std::int64_t c = k; c < leaves; ++c) node[c] = 0.0f;
      // Level L + 1, node t = node 2t + node 2t + 1 of level L, until the root.
      for (std::int64_t width = leaves; width > 1; width /= 2)
        for (std::int64_t c = 0; c < width / 2; ++c) node[c] = node[2 * c] + node[2 * c + 1];
      const std::uint32_t bits = gemv_out_bits(node[0], g.y_dtype);
      const std::int64_t at = j * g.n + r;
      if (g.y_dtype == NF4_DTYPE_F32) std::memcpy(static_cast<std::uint32_t*>(g.y) + at, &bits, 4);
      else static_cast<std::uint16_t*>(g.y)[at] = static_cast<std::uint16_t>(bits);
    }
  }
}

void oracle_gemv(const nf4_gemv_desc& g) {
  validate_gemv(g);
  oracle_gemv_rows(g, 0, g.n);
}

}  // namespace nf4::cpu
