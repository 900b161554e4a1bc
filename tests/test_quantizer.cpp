// SPDX-License-Identifier: MIT
// Quantize -> dequantize round trips: every element lands on the nearest code of its block.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/format.h"
#include "core/half.h"
#include "tests/support/common.h"

using namespace nf4;

TEST_CASE("round trip: each dequantized value is the nearest representable value of its block") {
  std::uint64_t seed = 100;
  for (std::int64_t n : test::sweep_sizes(1 << 16))
    for (nf4_quant_type qt : test::kQuantTypes)
      for (int bs : {32, 64, 1024})
        for (bool nested : {false, true}) {
          CAPTURE(n);
          CAPTURE(qt);
          CAPTURE(bs);
          CAPTURE(nested);
          const auto x = cpu::random_normal(n, seed++, 0.05f);
          const auto w = cpu::quantize(x.data(), n, cpu::QuantizeOptions{qt, bs, nested, 256});
          std::vector<float> y(n);
          const nf4_tensor t = w.describe(NF4_DTYPE_F32, y.data(), n * 4);
          cpu::oracle_dequantize(t);
          std::vector<float> block_max((n + bs - 1) / bs, 0.0f);
          for (std::int64_t i = 0; i < n; ++i) block_max[i / bs] = std::fmax(block_max[i / bs], std::fabs(x[i]));
          std::int64_t worse = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            const float a = cpu::oracle_absmax(t, i / bs);
            // The best any code could do for x[i] with this block's (possibly re-quantized) absmax:
            float best = INFINITY;
            for (unsigned q = 0; q < 16; ++q) {
              const float v = (qt == NF4_QUANT_NF4 ? format::kNf4Table[q] : format::fp4_value(q)) * a;
              best = std::fmin(best, std::fabs(v - x[i]));
            }
            // Codes are chosen against the exact block maximum m; with nested statistics the stored
            // absmax a is an 8-bit approximation of m, and a code picked for m can be off by at
            // most 2|a - m| (|code| <= 1) for a. Flat: a == m, only fp32 rounding is left.
            const float m = block_max[i / bs];
            if (!nested) REQUIRE(a == m);
            const float slack = 2.0f * std::fabs(a - m) + 1e-6f * std::fabs(a) + 1e-12f;
            worse += std::fabs(y[i] - x[i]) > best + slack;
          }
          CHECK(worse == 0);
        }
}

TEST_CASE("flat absmax is the block maximum; nested absmax approximates it") {
  const std::int64_t n = 64 * 1000;
  const auto x = cpu::random_normal(n, 7, 1.0f);
  const auto flat = cpu::quantize(x.data(), n, cpu::QuantizeOptions{NF4_QUANT_NF4, 64, false, 256});
  const auto nested = cpu::quantize(x.data(), n, cpu::QuantizeOptions{NF4_QUANT_NF4, 64, true, 256});
  const nf4_tensor tn = nested.describe(NF4_DTYPE_F32, nullptr, 0);
  for (std::int64_t b = 0; b < 1000; ++b) {
    float m = 0;
    for (int i = 0; i < 64; ++i) m = std::fmax(m, std::fabs(x[b * 64 + i]));
    CHECK(flat.absmax_f32[b] == m);
    CHECK(cpu::oracle_absmax(tn, b) == doctest::Approx(m).epsilon(0.05));
  }
}

TEST_CASE("fp16 and bf16 inputs quantize like their widened fp32 values") {
  std::vector<std::uint16_t> h(300), b(300);
  std::vector<float> fh(300), fb(300);
  const auto x = cpu::random_normal(300, 3, 1.0f);
  for (int i = 0; i < 300; ++i) {
    h[i] = f16_from_float(x[i]);
    b[i] = bf16_from_float(x[i]);
    fh[i] = float_from_f16(h[i]);
    fb[i] = float_from_bf16(b[i]);
  }
  const cpu::QuantizeOptions o{NF4_QUANT_NF4, 64, true, 256};
  CHECK(cpu::quantize_f16(h.data(), 300, o).packed == cpu::quantize(fh.data(), 300, o).packed);
  CHECK(cpu::quantize_bf16(b.data(), 300, o).packed == cpu::quantize(fb.data(), 300, o).packed);
}

TEST_CASE("quantizer rejects bad options") {
  const float x[4] = {1, 2, 3, 4};
  CHECK_THROWS(cpu::quantize(x, 0, {}));
  CHECK_THROWS(cpu::quantize(x, 4, cpu::QuantizeOptions{NF4_QUANT_NF4, 48, false, 256}));
  CHECK_THROWS(cpu::quantize(x, 4, cpu::QuantizeOptions{NF4_QUANT_NF4, 64, true, 3}));
}
