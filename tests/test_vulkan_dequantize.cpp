// SPDX-License-Identifier: MIT
// The standalone Vulkan backend beyond the registry cross-check (test_backends.cpp covers
// dequantize_host on the golden cases and random sizes): both shader strategies on every variant,
// a tensor past lavapipe's 65,535-iteration limit, more than 2^31 elements, device selection, the
// staging copies of a discrete GPU.
// Fixtures and the validation layer: tests/support/vulkan.h.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/oracle.h"
#include "nf4/nf4.hpp"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"
#include "tests/support/vulkan.h"

using namespace nf4;
using namespace nf4::test;

TEST_CASE("vulkan: a tensor past lavapipe's 65,535 loop iterations per invocation") {
  if (!vulkan_available()) return;
  // lavapipe silently ends an invocation after 65,535 loop iterations in total. nf4's loops are
  // bounded per invocation (units, table entries), whatever the tensor size; this tensor has more
  // than 65,535 units per workgroup-column, so a grid-stride loop would have crossed it.
  {
    ScopedEnv tune("NF4_VULKAN_TUNE", "wg=16,units=1");
    Context c(NF4_BACKEND_VULKAN);
    const std::int64_t n = 65536 * 16 + 4099;  // > 65,535 invocations' worth of 16 elements
    for (nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_F32}) {
      const auto w = test::random_weight(n, NF4_QUANT_FP4, 64, true, 11);
      std::vector<std::uint8_t> got(static_cast<std::size_t>(n) * nf4_dtype_size(d), 0x5A);
      const auto expected = oracle(w, d);
      c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
      CHECK(test::differing_elements(expected.data(), got.data(), n, d) == 0);
    }
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: both shader strategies on every variant (per-block table and per-element rounding)") {
  if (!vulkan_available()) return;
  for (const std::string& tune : {tune_table("000") + ",wg=64,units=2", tune_table("111") + ",wg=128,units=3",
                                  tune_table("101") + ",wg=256,units=8", tune_table("000") + ",wg=128,units=4,nt=3,f16hw=0",
                                  tune_table("010") + ",wg=32,units=5,nt=1,pair=0"}) {
    ScopedEnv env("NF4_VULKAN_TUNE", tune.c_str());
    Context c(NF4_BACKEND_VULKAN);
    std::uint64_t seed = 500;
    for (std::int64_t n : {1, 5, 64, 1000, 33333})
      for (nf4_quant_type qt : test::kQuantTypes)
        for (bool nested : {false, true})
          for (int bs : {32, 64, 4096})
            for (nf4_dtype d : test::kDTypes) {
              const auto w = test::random_weight(n, qt, bs, nested, seed++);
              std::vector<std::uint8_t> got(static_cast<std::size_t>(n) * nf4_dtype_size(d));
              c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
              CHECK_MESSAGE(test::differing_elements(oracle(w, d).data(), got.data(), n, d) == 0,
                            std::string(tune) << " n=" << n << " qt=" << qt << " nested=" << nested << " bs=" << bs << " " << std::string(test::dtype_label(d)));
            }
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: the staging copies of a discrete GPU (NF4_VULKAN_STAGED=1) carry odd byte counts exactly") {
  if (!vulkan_available()) return;
  // Device memory is not mapped, as on a discrete GPU, so inputs go through a staging buffer and
  // a copy; byte counts that are not multiples of 4 (an odd x of 16-bit values, an odd fp16
  // output) must be copied within both buffers (the validation layer checks) and exactly.
  ScopedEnv staged("NF4_VULKAN_STAGED", "1");
  Context c(NF4_BACKEND_VULKAN);
  std::uint64_t seed = 900;
  for (std::int64_t n : {1, 37, 4097}) {
    const auto w = test::random_weight(n, NF4_QUANT_NF4, 64, true, seed++);
    for (nf4_dtype d : test::kDTypes) {
      std::vector<std::uint8_t> got(static_cast<std::size_t>(n) * nf4_dtype_size(d), 0x5A);
      c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
      CHECK_MESSAGE(test::differing_elements(oracle(w, d).data(), got.data(), n, d) == 0, "n=" << n << " " << test::dtype_label(d));
    }
  }
  for (const auto& shape : {std::tuple{7, 37, 3}, std::tuple{5, 33, 1}, std::tuple{3, 100, 8}})
    for (nf4_dtype xd : {NF4_DTYPE_F16, NF4_DTYPE_BF16}) {
      // Not a structured binding: clang before 16 cannot capture one in CHECK_MESSAGE's lambda.
      const int n = std::get<0>(shape), k = std::get<1>(shape), m = std::get<2>(shape);
      test::GemvCase g;
      test::make_gemv_case(g, n, k, m, NF4_QUANT_NF4, 64, true, xd, NF4_DTYPE_F16, seed++);
      std::vector<std::uint8_t> y(static_cast<std::size_t>(g.y_bytes()), 0xEE);
      const nf4_gemv_desc desc = g.describe(y.data(), g.y_bytes());
      REQUIRE_MESSAGE(nf4_gemv_host(c.get(), &desc) == NF4_OK, std::string(nf4_last_error(c.get())));
      CHECK_MESSAGE(test::differing_elements(g.oracle().data(), y.data(), g.m * g.n, g.y_dtype) == 0, "n=" << n << " k=" << k << " m=" << m);
    }
  check_no_validation_messages();
}

TEST_CASE("vulkan: NF4_VULKAN_DEVICE picks a device by index or name, and names the choices when wrong") {
  if (!vulkan_available()) return;
  const char* previous = std::getenv("NF4_VULKAN_DEVICE");
  const std::string saved = previous ? previous : "";
  setenv("NF4_VULKAN_DEVICE", "no such device anywhere", 1);
  nf4_context* c = nullptr;
  CHECK(nf4_context_create(NF4_BACKEND_VULKAN, &c) == NF4_ERR_BACKEND_UNAVAILABLE);
  CHECK(std::string(nf4_last_error(nullptr)).find("matches no usable device") != std::string::npos);
  for (const char* index : {"4294967296", "99999999999999999999999"}) {  // past any count, past 64 bits
    setenv("NF4_VULKAN_DEVICE", index, 1);
    CHECK(nf4_context_create(NF4_BACKEND_VULKAN, &c) == NF4_ERR_BACKEND_UNAVAILABLE);
    CHECK(std::string(nf4_last_error(nullptr)).find("matches no usable device") != std::string::npos);
  }
  setenv("NF4_VULKAN_DEVICE", "0", 1);
  REQUIRE(nf4_context_create(NF4_BACKEND_VULKAN, &c) == NF4_OK);
  nf4_context_destroy(c);
  if (previous) setenv("NF4_VULKAN_DEVICE", saved.c_str(), 1);
  else unsetenv("NF4_VULKAN_DEVICE");
  check_no_validation_messages();
}

TEST_CASE("vulkan: more than 2^31 elements (NF4_VULKAN_LARGE=1, about 10 GB of host memory)") {
  if (!std::getenv("NF4_VULKAN_LARGE")) {
    MESSAGE("skipped: set NF4_VULKAN_LARGE=1 (GPU machine)");
    return;
  }
  if (!vulkan_available()) return;
  // A synthetic nested NF4 weight (random codes and statistics: quantizing 2^31 values would take
  // longer than the test), fp16 out, an odd count past 2^31; checked against the oracle on
  // windows at the start, around 2^31 and at the end, and at random places.
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  const cpu::QuantizedWeight w = test::synthetic_weight(n, NF4_QUANT_NF4, 64, true, 31);
  std::uint64_t s = 0x9E3779B97F4A7C15ull;  // the random windows
  std::vector<std::uint16_t> got(static_cast<std::size_t>(n), 0x7777), expected(static_cast<std::size_t>(n), 0x7777);
  Context c(NF4_BACKEND_VULKAN);
  c.dequantize_host(w.describe(NF4_DTYPE_F16, got.data(), n * 2));
  const nf4_tensor t = w.describe(NF4_DTYPE_F16, expected.data(), n * 2);
  std::vector<std::int64_t> starts = {0, (std::int64_t{1} << 31) - (1 << 20), n - (1 << 20)};
  for (int k = 0; k < 16; ++k) starts.push_back(static_cast<std::int64_t>(test::splitmix(s) % static_cast<std::uint64_t>(n - (1 << 16))));
  for (std::int64_t first : starts) {
    const std::int64_t count = std::min<std::int64_t>(1 << 20, n - first);
    cpu::oracle_dequantize_range(t, first, count);
    CHECK_MESSAGE(std::memcmp(&expected[static_cast<std::size_t>(first)], &got[static_cast<std::size_t>(first)], static_cast<std::size_t>(count) * 2) == 0,
                  "window at " << first);
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: NF4_VULKAN_TUNE's numbers are refused when they are not decimal or pass 2^32 (no wrap past a range check)") {
  if (!vulkan_available()) return;
  // 4294967424 = 2^32 + 128 would read as a workgroup of 128 if the value were cut to 32 bits.
  for (const char* tune : {"wg=4294967424", "units=4294967300", "pair=4294967297", "nt=x", "copy_wg=", "f16hw=+1", "bf16hw=2",
                           "copy_units=99999999999999999999"}) {
    CAPTURE(tune);
    ScopedEnv env("NF4_VULKAN_TUNE", tune);
    nf4_context* ctx = nullptr;
    CHECK(nf4_context_create(NF4_BACKEND_VULKAN, &ctx) == NF4_ERR_INVALID_ARGUMENT);
    CHECK(ctx == nullptr);
    const std::string message = nf4_last_error(nullptr);
    const std::string key(tune, std::strchr(tune, '='));
    CHECK_MESSAGE(message.find("NF4_VULKAN_TUNE: " + key) != std::string::npos, message);
  }
}
