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
  return dispatch_dtype(d, [&](auto dtype) { return load_element<decltype(dtype)::value>(x, idx); });
}

namespace {

void store_y(const nf4_gemv_desc& g, std::int64_t at, float v) { gemv_store(g.y, at, v, g.y_dtype); }

// The fast contract for row r (nf4.h, NF4_GEMV_FAST): each dequantized weight rounded to x's dtype
// as nf4_dequantize writes it, then a sequential fp32 sum over c of the products, which are exact
// in fp32 (two 8- or 11-bit significands), so one rounding per addition. A float64 sum of the same
// terms is what the tests hold every backend's fast mode against.
void fast_rows(const nf4_gemv_desc& g, float* w, std::int64_t r) {
  const std::int64_t k = g.k;
  dispatch_dtype(g.x_dtype, [&](auto dtype) {
    for (std::int64_t c = 0; c < k; ++c) w[c] = round_to<decltype(dtype)::value>(w[c]);
  });
  for (std::int32_t j = 0; j < g.m; ++j) {
    float acc = 0.0f;
    for (std::int64_t c = 0; c < k; ++c) acc += w[c] * gemv_x_value(g.x, g.x_dtype, j * k + c);
    store_y(g, j * g.n + r, acc);
  }
}

}  // namespace

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
    if (gemv_wants_fast(g)) {  // fp32 x has no fast contract: the exact one, as core resolves it
      fast_rows(g, w.data(), r);
      continue;
    }
    for (std::int32_t j = 0; j < g.m; ++j) {
      // Level 0: the products, then +0.0f up to the next power of two.
      for (std::int64_t c = 0; c < k; ++c) node[c] = w[c] * gemv_x_value(g.x, g.x_dtype, j * k + c);
      for (std::int64_t c = k; c < leaves; ++c) node[c] = 0.0f;
      // Level L + 1, node t = node 2t + node 2t + 1 of level L, until the root.
      for (std::int64_t width = leaves; width > 1; width /= 2)
        for (std::int64_t c = 0; c < width / 2; ++c) node[c] = node[2 * c] + node[2 * c + 1];
      store_y(g, j * g.n + r, node[0]);
    }
  }
}

void oracle_gemv(const nf4_gemv_desc& g) {
  validate_gemv(g);
  oracle_gemv_rows(g, 0, g.n);
}

}  // namespace nf4::cpu
