// SPDX-License-Identifier: MIT
// Every registered backend against the oracle, bit for bit. Iterates the registry, so a backend
// added later is checked here without naming it. Backends that are compiled out or find no
// device are reported (MESSAGE) and skipped visibly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"

using namespace nf4;

namespace {


// Runs `t` (host pointers, out ignored) on the backend and the oracle; returns differing elements.
std::int64_t compare_with_oracle(Context& ctx, nf4_tensor t) {
  const std::int64_t bytes = t.numel * static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  std::vector<std::uint8_t> expected(bytes, 0x5A), actual(bytes + 64, 0xA5);  // poisoned, with a guard tail
  t.out = expected.data();
  t.out_bytes = bytes;
  cpu::oracle_dequantize(t);
  t.out = actual.data();
  ctx.dequantize_host(t);
  for (std::int64_t i = bytes; i < bytes + 64; ++i)
    if (actual[i] != 0xA5) return -1;  // wrote past the end
  return test::differing_elements(expected.data(), actual.data(), t.numel, t.out_dtype);
}

}  // namespace

TEST_CASE("registry lists every known backend once, by the name it parses from, and cpu is always available") {
  const std::vector<nf4_backend_kind> known = backend_kinds();  // auto first
  REQUIRE(nf4_backend_count() == known.size() - 1);
  bool cpu = false;
  std::vector<nf4_backend_kind> listed;
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
    REQUIRE(info.name != nullptr);
    CHECK(info.device_name != nullptr);
    nf4_backend_kind parsed{};
    CHECK(nf4_backend_parse(info.name, &parsed) == NF4_OK);
    CHECK(parsed == info.kind);
    CHECK(std::count(listed.begin(), listed.end(), info.kind) == 0);
    listed.push_back(info.kind);
    if (info.kind == NF4_BACKEND_CPU) cpu = info.available;
  }
  CHECK(cpu);
  nf4_backend_info info{};
  CHECK(nf4_backend_get_info(nf4_backend_count(), &info) == NF4_ERR_INVALID_ARGUMENT);
}

TEST_CASE("every available backend matches the oracle on every golden case") {
  const auto& f = test::golden_file();
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    CAPTURE(ctx.device_name());
    for (const auto& c : test::golden_cases())
      for (nf4_dtype d : test::kDTypes) {
        const auto diff = compare_with_oracle(ctx, io::describe(f, c.param, d, nullptr, 0));
        CHECK_MESSAGE(diff == 0, "backend " << nf4_context_backend(ctx.get()) << " " << c.case_name << " " << test::dtype_label(d));
      }
  }
}

TEST_CASE("every available backend matches the oracle on random tensors of many sizes and variants") {
  const std::int64_t max_size = std::getenv("NF4_TEST_MAX_SIZE") ? std::atoll(std::getenv("NF4_TEST_MAX_SIZE")) : (1 << 17);
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    std::uint64_t seed = 1;
    for (std::int64_t n : test::sweep_sizes(max_size))
      for (nf4_quant_type qt : test::kQuantTypes)
        for (int bs : {32, 64, 256, 4096})
          for (bool nested : {true, false}) {
            const auto w = test::random_weight(n, qt, bs, nested, seed++);
            for (nf4_dtype d : test::kDTypes) {
              const auto diff = compare_with_oracle(ctx, w.describe(d, nullptr, 0));
              CHECK_MESSAGE(diff == 0, "backend " << kind << " n=" << n << " qt=" << qt << " bs=" << bs << " nested=" << nested
                                                  << " " << test::dtype_label(d));
            }
          }
  }
}

TEST_CASE("grouped calls match per-tensor oracle results") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    const std::vector<cpu::QuantizedWeight> ws = {test::random_weight(4096 * 3 + 5, NF4_QUANT_NF4, 64, true, 11),
                                                  test::random_weight(777, NF4_QUANT_FP4, 128, false, 12),
                                                  test::random_weight(64 * 1024, NF4_QUANT_NF4, 64, true, 13)};
    std::vector<std::vector<std::uint16_t>> expected, actual;
    std::vector<nf4_tensor> ts;
    for (const auto& w : ws) {
      expected.emplace_back(w.numel, 0x1111);
      actual.emplace_back(w.numel, 0x2222);
      cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.back().data(), w.numel * 2));
      ts.push_back(w.describe(NF4_DTYPE_BF16, actual.back().data(), w.numel * 2));
    }
    ctx.dequantize_host(ts.data(), ts.size());
    for (std::size_t i = 0; i < ws.size(); ++i) CHECK(expected[i] == actual[i]);
  }
}

TEST_CASE("a device-pointer offset is honoured by every backend (host copy of the value)") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    const auto w = test::random_weight(5000, NF4_QUANT_NF4, 64, true, 99);
    auto t = w.describe(NF4_DTYPE_F32, nullptr, 0);
    const float offset = w.nested_offset;
    t.nested_offset = 123.0f;  // must be ignored: the pointer wins
    t.nested_offset_ptr = &offset;
    CHECK(compare_with_oracle(ctx, t) == 0);
    std::vector<float> a(5000), b(5000);
    t.out = a.data();
    t.out_bytes = 5000 * 4;
    ctx.dequantize_host(t);
    auto t2 = w.describe(NF4_DTYPE_F32, b.data(), 5000 * 4);
    cpu::oracle_dequantize(t2);
    CHECK(a == b);
  }
}

TEST_CASE("NF4_BACKEND selects the backend for auto") {
  setenv("NF4_BACKEND", "cpu", 1);
  {
    Context ctx(NF4_BACKEND_AUTO);
    CHECK(ctx.backend() == NF4_BACKEND_CPU);
  }
  setenv("NF4_BACKEND", "nonsense", 1);
  nf4_context* c = nullptr;
  CHECK(nf4_context_create(NF4_BACKEND_AUTO, &c) == NF4_ERR_UNKNOWN_BACKEND);
  CHECK(c == nullptr);
  CHECK(std::string(nf4_last_error(nullptr)).find("nonsense") != std::string::npos);
  unsetenv("NF4_BACKEND");
}

TEST_CASE("each backend's capabilities are what its calls do") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    const BackendCaps caps = context_backend(ctx.get()).capabilities();
    CAPTURE(ctx.device_name());
    CHECK((caps.device_pointers || !caps.device_pointers_are_host));
    CHECK((caps.device_pointers || (!caps.prepared_launch && !caps.prepared_gemv)));
    const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 5);
    std::vector<std::uint16_t> out(1000, 0x1234), expected(1000);
    cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 2000));
    const nf4_tensor t = w.describe(NF4_DTYPE_BF16, out.data(), 2000);
    nf4_prepared* p = nullptr;
    if (!caps.device_pointers) CHECK(nf4_dequantize(ctx.get(), &t) == NF4_ERR_UNSUPPORTED);
    if (!caps.prepared_launch) CHECK(nf4_prepare(ctx.get(), &t, 1, &p) == NF4_ERR_UNSUPPORTED);
    if (caps.device_pointers_are_host) {  // host memory is this backend's memory: the raw-pointer calls run on it
      REQUIRE(nf4_dequantize(ctx.get(), &t) == NF4_OK);
      CHECK(out == expected);
      if (caps.prepared_launch) {
        REQUIRE(nf4_prepare(ctx.get(), &t, 1, &p) == NF4_OK);
        std::fill(out.begin(), out.end(), 0x1234);
        CHECK(nf4_prepared_launch(p, nullptr, nullptr) == NF4_OK);
        nf4_prepared_destroy(p);
        CHECK(out == expected);
      }
    }
    // The fast contract: never, or whenever a product asks for it with fp16 / bf16 x.
    test::GemvCase c;
    test::make_gemv_case(c, 16, 64, 2, NF4_QUANT_NF4, 64, false, NF4_DTYPE_BF16, NF4_DTYPE_F32, 3);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()));
    nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
    g.mode = NF4_GEMV_FAST;
    nf4_gemv_mode used = NF4_GEMV_EXACT;
    REQUIRE(nf4_gemv_mode_used(ctx.get(), &g, &used) == NF4_OK);
    if (caps.gemv_fast == GemvFastSupport::never) CHECK(used == NF4_GEMV_EXACT);
    if (caps.gemv_fast == GemvFastSupport::whenever) CHECK(used == NF4_GEMV_FAST);
    if (!caps.device_pointers) CHECK(nf4_gemv(ctx.get(), &g) == NF4_ERR_UNSUPPORTED);
    nf4_gemv_prepared* gp = nullptr;
    if (!caps.prepared_gemv) CHECK(nf4_gemv_prepare(ctx.get(), &g, &gp) == NF4_ERR_UNSUPPORTED);
  }
}
