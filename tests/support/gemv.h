// SPDX-License-Identifier: MIT
// Test data for the fused matrix-vector product: a random weight [n, k], random activations of
// any dtype, the description, and the oracle's answer.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "core/dtype.h"
#include "core/half.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"

namespace nf4::test {

struct GemvCase {
  std::int64_t n = 1, k = 1;
  std::int32_t m = 1;
  nf4_dtype x_dtype = NF4_DTYPE_BF16, y_dtype = NF4_DTYPE_BF16;
  cpu::QuantizedWeight w;
  nf4_tensor wt{};                    // points into w
  std::vector<std::uint8_t> x;        // m * k elements of x_dtype

  GemvCase() = default;
  GemvCase(const GemvCase&) = delete;
  GemvCase& operator=(const GemvCase&) = delete;

  nf4_gemv_desc describe(void* y, std::int64_t y_bytes) const {
    nf4_gemv_desc g{};
    g.weight = &wt;
    g.n = n;
    g.k = k;
    g.m = m;
    g.x_dtype = x_dtype;
    g.x = x.data();
    g.y_dtype = y_dtype;
    g.y = y;
    g.y_bytes = y_bytes;
    return g;
  }
  std::int64_t y_bytes() const { return m * n * static_cast<std::int64_t>(nf4_dtype_size(y_dtype)); }
  std::vector<std::uint8_t> oracle() const {
    std::vector<std::uint8_t> y(static_cast<std::size_t>(y_bytes()), 0x5A);
    cpu::oracle_gemv(describe(y.data(), y_bytes()));
    return y;
  }
  std::string label() const {
    return "n=" + std::to_string(n) + " k=" + std::to_string(k) + " m=" + std::to_string(m) + " " +
           std::string(quant_type_name(w.quant_type)) + " bs=" + std::to_string(w.blocksize) + (w.nested ? " nested" : " flat") +
           " x=" + dtype_label(x_dtype) + " y=" + dtype_label(y_dtype);
  }
};

// m * k activations of dtype d, roughly normal (the sum of four uniforms).
inline std::vector<std::uint8_t> random_activations(std::int64_t count, nf4_dtype d, std::uint64_t seed) {
  std::vector<std::uint8_t> x(static_cast<std::size_t>(count) * nf4_dtype_size(d));
  std::uint64_t s = seed * 0x2545f4914f6cdd1dull + 7;
  for (std::int64_t i = 0; i < count; ++i) {
    float v = 0;
    for (int j = 0; j < 4; ++j) v += static_cast<float>(splitmix(s) >> 40) / static_cast<float>(1 << 24) - 0.5f;
    v *= 1.7f;
    dispatch_dtype(d, [&](auto tag) { store_element<decltype(tag)::value>(x.data(), i, v); });
  }
  return x;
}

inline void make_gemv_case(GemvCase& c, std::int64_t n, std::int64_t k, std::int32_t m, nf4_quant_type qt, int bs, bool nested,
                           nf4_dtype xd, nf4_dtype yd, std::uint64_t seed) {
  c.n = n;
  c.k = k;
  c.m = m;
  c.x_dtype = xd;
  c.y_dtype = yd;
  c.w = random_weight(n * k, qt, bs, nested, seed);
  c.wt = c.w.describe(NF4_DTYPE_F32, nullptr, 0);
  c.x = random_activations(m * k, xd, seed + 1000003);
}

// The dequantized weight row-major [n, k] in fp32, through the dequantization oracle.
inline std::vector<float> dense_weight(const GemvCase& c) {
  std::vector<float> w(static_cast<std::size_t>(c.n * c.k));
  nf4_tensor t = c.wt;
  t.out_dtype = NF4_DTYPE_F32;
  t.out = w.data();
  t.out_bytes = c.n * c.k * 4;
  cpu::oracle_dequantize(t);
  return w;
}

}  // namespace nf4::test
