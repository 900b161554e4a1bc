// SPDX-License-Identifier: MIT
// The product's two contracts past the exact kernels' 8 rows (nf4.h, nf4_gemv_desc.mode;
// docs/GEMV.md): the exact contract for m up to NF4_GEMV_MAX_M (the oracle's bits on every backend),
// the fast contract on every backend that runs it (the cpu's sequential sum bit for bit against an
// independent evaluation; every backend within the stated bound of a float64 sum, batch-invariant
// and repeatable), which mode each backend reports, and the descriptions refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/gemv.h"
#include "core/half.h"
#include "nf4/nf4.hpp"
#include "tests/support/env.h"
#include "tests/support/gemv.h"
#include "tests/support/gemv_fast.h"

using namespace nf4;

namespace {


std::vector<std::uint8_t> run_host(Context& ctx, const test::GemvCase& c, nf4_gemv_mode mode) {
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()) + 64, 0xA5);
  nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
  g.mode = mode;
  const nf4_status s = nf4_gemv_host(ctx.get(), &g);
  REQUIRE_MESSAGE(s == NF4_OK, std::string(nf4_last_error(ctx.get())));
  for (std::size_t i = static_cast<std::size_t>(c.y_bytes()); i < y.size(); ++i) REQUIRE_MESSAGE(y[i] == 0xA5, "wrote past y");
  y.resize(static_cast<std::size_t>(c.y_bytes()));
  return y;
}

nf4_gemv_mode mode_used(Context& ctx, const test::GemvCase& c, nf4_gemv_mode asked) {
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()));
  nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
  g.mode = asked;
  nf4_gemv_mode used = NF4_GEMV_EXACT;
  REQUIRE_MESSAGE(nf4_gemv_mode_used(ctx.get(), &g, &used) == NF4_OK, std::string(nf4_last_error(ctx.get())));
  return used;
}

}  // namespace

TEST_CASE("gemv: the exact contract past 8 rows (core slices x) gives the oracle's bits on every backend, prepared too") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    CAPTURE(ctx.device_name());
    std::uint64_t seed = 70000;
    for (std::int32_t m : {9, 19, 256})
      for (std::int64_t k : {100, 1024}) {
        test::GemvCase c;
        test::make_gemv_case(c, 21, k, m, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, test::kProductDTypes[seed % test::kProductDTypes.size()], seed);
        ++seed;
        CAPTURE(c.label());
        const auto expected = c.oracle();
        CHECK(test::differing_elements(expected.data(), run_host(ctx, c, NF4_GEMV_EXACT).data(), c.m * c.n, c.y_dtype) == 0);
        // Host pointers: the prepared form of a backend whose memory is the host's.
        const BackendCaps caps = context_backend(ctx.get()).capabilities();
        if (!caps.prepared_gemv || !caps.device_pointers_are_host) continue;
        std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0xA5);
        nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
        nf4_gemv_prepared* raw = nullptr;
        REQUIRE(nf4_gemv_prepare(ctx.get(), &g, &raw) == NF4_OK);
        const std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)> p(raw, nf4_gemv_prepared_destroy);
        CHECK(nf4_gemv_prepared_mode(p.get()) == NF4_GEMV_EXACT);
        REQUIRE(nf4_gemv_prepared_launch(p.get(), nullptr, nullptr, nullptr) == NF4_OK);
        CHECK(test::differing_elements(expected.data(), y.data(), c.m * c.n, c.y_dtype) == 0);
      }
  }
}

TEST_CASE("gemv fast: the cpu backend's fast contract equals a sequential fp32 sum over weights rounded to x's dtype") {
  Context ctx(NF4_BACKEND_CPU);
  std::uint64_t seed = 71000;
  for (nf4_dtype xd : {NF4_DTYPE_F16, NF4_DTYPE_BF16})
    for (nf4_dtype yd : test::kProductDTypes)
      for (std::int64_t k : {1, 33, 1000, 4096}) {
        test::GemvCase c;
        test::make_gemv_case(c, 7, k, 3, seed % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64, seed % 3 != 0, xd, yd, seed);
        ++seed;
        CAPTURE(c.label());
        REQUIRE(mode_used(ctx, c, NF4_GEMV_FAST) == NF4_GEMV_FAST);
        const auto w = test::weight_in_x_dtype(c);
        std::vector<std::uint8_t> expected(static_cast<std::size_t>(c.y_bytes()));
        for (std::int32_t j = 0; j < c.m; ++j)
          for (std::int64_t r = 0; r < c.n; ++r) {
            volatile float acc = 0.0f;  // one rounding per addition
            for (std::int64_t col = 0; col < k; ++col) {
              volatile float p = w[static_cast<std::size_t>(r * k + col)] * cpu::gemv_x_value(c.x.data(), xd, j * k + col);
              acc = acc + p;
            }
            const std::uint32_t bits = gemv_out_bits(acc, yd);
            std::memcpy(&expected[static_cast<std::size_t>(j * c.n + r) * nf4_dtype_size(yd)], &bits, nf4_dtype_size(yd));
          }
        const auto got = run_host(ctx, c, NF4_GEMV_FAST);
        CHECK(test::differing_elements(expected.data(), got.data(), c.m * c.n, yd) == 0);
        const test::FastErrors e = test::fast_errors(c, got.data());
        CHECK(e.outside == 0);
      }
}

TEST_CASE("gemv fast: each backend reports its contract, and runs it: within the bound, batch-invariant, repeatable, m = 1..256") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    CAPTURE(ctx.device_name());
    std::uint64_t seed = 72000;
    double worst_rel = 0, worst_use = 0;
    for (nf4_dtype xd : {NF4_DTYPE_BF16, NF4_DTYPE_F16})
      for (std::int64_t k : {96, 1000, 4096}) {
        test::GemvCase c;
        test::make_gemv_case(c, 37, k, 256, seed % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, k == 1000 ? 128 : 64, seed % 3 != 1, xd,
                             test::kProductDTypes[seed % test::kProductDTypes.size()], seed);
        ++seed;
        CAPTURE(c.label());
        const nf4_gemv_mode used = mode_used(ctx, c, NF4_GEMV_FAST);
        // A backend without a fast path says so and runs the exact contract.
        const GemvFastSupport fast = context_backend(ctx.get()).capabilities().gemv_fast;
        if (fast == GemvFastSupport::never) CHECK(used == NF4_GEMV_EXACT);
        if (fast == GemvFastSupport::whenever) CHECK(used == NF4_GEMV_FAST);
        const auto all = run_host(ctx, c, NF4_GEMV_FAST);
        if (used == NF4_GEMV_EXACT) {
          CHECK(test::differing_elements(c.oracle().data(), all.data(), c.m * c.n, c.y_dtype) == 0);
          continue;
        }
        const test::FastErrors e = test::fast_errors(c, all.data());
        CHECK_MESSAGE(e.outside == 0, e.outside << " outputs past the bound");
        worst_rel = std::max(worst_rel, e.max_rel);
        worst_use = std::max(worst_use, e.worst_bound_use);
        CHECK(run_host(ctx, c, NF4_GEMV_FAST) == all);  // repeatable
        // Rows alone and in batches of every token-tile shape give the batch's bits.
        const std::size_t row_bytes = static_cast<std::size_t>(c.n) * nf4_dtype_size(c.y_dtype);
        const std::size_t x_row = static_cast<std::size_t>(k) * nf4_dtype_size(xd);
        for (const auto& rows : {std::pair<std::int32_t, std::int32_t>{0, 1}, {5, 1}, {255, 1}, {3, 2}, {10, 7}, {8, 8}, {17, 9},
                                 {100, 16}, {31, 17}, {64, 33}, {1, 64}, {150, 100}, {0, 255}}) {
          // Plain variables, not a structured binding: clang 14 cannot capture one in doctest's lambdas.
          const std::int32_t first = rows.first, m = rows.second;
          test::GemvCase part;
          part.n = c.n, part.k = k, part.m = m, part.x_dtype = xd, part.y_dtype = c.y_dtype;
          part.wt = c.wt;
          part.x.assign(c.x.begin() + static_cast<std::ptrdiff_t>(first * x_row), c.x.begin() + static_cast<std::ptrdiff_t>((first + m) * x_row));
          const auto got = run_host(ctx, part, NF4_GEMV_FAST);
          CHECK_MESSAGE(std::memcmp(got.data(), all.data() + first * row_bytes, got.size()) == 0,
                        "rows " << first << ".." << first + m - 1 << " alone differ from the batch of 256");
        }
      }
    if (worst_use > 0)
      MESSAGE("gemv fast on " << ctx.device_name() << ": max relative error vs float64 " << worst_rel << ", largest fraction of the bound used "
                              << worst_use);
  }
}

TEST_CASE("gemv fast: fp32 x runs the exact contract everywhere, and bad modes and m are refused with nothing written") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    test::GemvCase c;
    test::make_gemv_case(c, 5, 64, 2, NF4_QUANT_NF4, 64, true, NF4_DTYPE_F32, NF4_DTYPE_F32, 73000);
    CHECK(mode_used(ctx, c, NF4_GEMV_FAST) == NF4_GEMV_EXACT);
    CHECK(test::differing_elements(c.oracle().data(), run_host(ctx, c, NF4_GEMV_FAST).data(), c.m * c.n, c.y_dtype) == 0);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0x5A);
    nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
    g.mode = static_cast<nf4_gemv_mode>(2);
    CHECK(nf4_gemv_host(ctx.get(), &g) == NF4_ERR_INVALID_ARGUMENT);
    CHECK(std::string(nf4_last_error(ctx.get())).find("mode") != std::string::npos);
    nf4_gemv_mode used = NF4_GEMV_FAST;
    CHECK(nf4_gemv_mode_used(ctx.get(), &g, &used) == NF4_ERR_INVALID_ARGUMENT);
    CHECK(nf4_gemv_mode_used(ctx.get(), &g, nullptr) == NF4_ERR_NULL_POINTER);
    g.mode = NF4_GEMV_FAST;
    g.m = NF4_GEMV_MAX_M + 1;
    CHECK(nf4_gemv_host(ctx.get(), &g) == NF4_ERR_SHAPE);
    CHECK(std::string(nf4_last_error(ctx.get())).find("m must be in [1, 256]") != std::string::npos);
    CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0x5A; }));
  }
  CHECK(nf4_gemv_prepared_mode(nullptr) == NF4_GEMV_EXACT);
}
