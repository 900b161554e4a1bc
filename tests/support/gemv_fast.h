// SPDX-License-Identifier: MIT
// The fast contract's checks (nf4.h, NF4_GEMV_FAST; docs/GEMV.md "The fast contract"), shared by the
// generic tests and the cuda ones: the weights rounded to x's dtype and a float64 reference over
// them, held to the stated bound (core/gemv.h gemv_fast_bound).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "core/gemv.h"
#include "core/half.h"
#include "tests/support/gemv.h"

namespace nf4::test {

// W [n, k] as nf4_dequantize writes it with out_dtype = x's dtype, back in fp32.
inline std::vector<float> weight_in_x_dtype(const GemvCase& c) {
  std::vector<float> w = dense_weight(c);
  for (float& v : w)
    v = c.x_dtype == NF4_DTYPE_F16 ? float_from_f16(f16_from_float(v)) : c.x_dtype == NF4_DTYPE_BF16 ? float_from_bf16(bf16_from_float(v)) : v;
  return w;
}

inline float y_value(const std::uint8_t* y, nf4_dtype d, std::int64_t i) {
  std::uint32_t b = 0;
  std::memcpy(&b, y + static_cast<std::size_t>(i) * nf4_dtype_size(d), nf4_dtype_size(d));
  if (d == NF4_DTYPE_F32) return bits_float(b);
  return d == NF4_DTYPE_BF16 ? float_from_bf16(static_cast<std::uint16_t>(b)) : float_from_f16(static_cast<std::uint16_t>(b));
}

struct FastErrors {
  std::int64_t outside = 0;      // outputs past the bound
  double max_rel = 0;            // max |Y - Y64| / max |Y64| over the matrix
  double worst_bound_use = 0;    // largest |Y - Y64| / bound
};

// Checks y (the fast contract's result of c) against a float64 sum over the rounded weights.
inline FastErrors fast_errors(const GemvCase& c, const std::uint8_t* y) {
  const auto w = weight_in_x_dtype(c);
  FastErrors f;
  double max_ref = 0, max_err = 0;
  for (std::int32_t j = 0; j < c.m; ++j)
    for (std::int64_t r = 0; r < c.n; ++r) {
      double sum = 0, abs_sum = 0;
      for (std::int64_t col = 0; col < c.k; ++col) {
        const double p = static_cast<double>(w[static_cast<std::size_t>(r * c.k + col)]) *
                         static_cast<double>(cpu::gemv_x_value(c.x.data(), c.x_dtype, j * c.k + col));
        sum += p;
        abs_sum += std::fabs(p);
      }
      const double err = std::fabs(static_cast<double>(y_value(y, c.y_dtype, j * c.n + r)) - sum);
      const double bound = gemv_fast_bound(c.k, abs_sum, sum, c.y_dtype);
      if (!(err <= bound)) ++f.outside;
      f.worst_bound_use = std::max(f.worst_bound_use, err / bound);
      max_ref = std::max(max_ref, std::fabs(sum));
      max_err = std::max(max_err, err);
    }
  f.max_rel = max_ref > 0 ? max_err / max_ref : max_err;
  return f;
}

}  // namespace nf4::test
