// SPDX-License-Identifier: MIT
// Prepared products (nf4_gemv_prepare / nf4_gemv_prepared_launch, nf4.h) on the backends that take
// host pointers through the generic API (cpu; cuda's device-pointer form is in
// test_cuda_gemv.cpp, vulkan's prepared form is its gemv job): the oracle's bits with the prepared
// and with new x and y, preparation refusing what nf4_gemv refuses, launches refusing aliasing,
// the object independent of the caller's description, and concurrent launches.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nf4/nf4.hpp"
#include "tests/support/env.h"
#include "tests/support/gemv.h"

using namespace nf4;

namespace {

using GemvHandle = std::unique_ptr<nf4_gemv_prepared, void (*)(nf4_gemv_prepared*)>;

GemvHandle prepare(Context& ctx, const nf4_gemv_desc& g) {
  nf4_gemv_prepared* raw = nullptr;
  const nf4_status s = nf4_gemv_prepare(ctx.get(), &g, &raw);
  REQUIRE_MESSAGE(s == NF4_OK, std::string(nf4_last_error(ctx.get())));
  return GemvHandle(raw, nf4_gemv_prepared_destroy);
}

}  // namespace

TEST_CASE("gemv prepared (cpu): the oracle's bits with the prepared and with new x and y") {
  Context ctx(NF4_BACKEND_CPU);
  std::uint64_t seed = 70000;
  for (std::int64_t k : {1, 33, 100, 1024, 3000})
    for (std::int32_t m : {1, 2, 5, 8}) {
      const std::uint64_t s = seed++;
      test::GemvCase c, c2;
      test::make_gemv_case(c, 17, k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 32 << (s % 4), s % 3 != 0, test::kProductDTypes[s % test::kProductDTypes.size()],
                           test::kProductDTypes[(s / 3) % test::kProductDTypes.size()], s);
      CAPTURE(c.label());
      std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()) + 16, 0xA5);
      nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
      nf4_tensor wt = c.wt;
      g.weight = &wt;
      const GemvHandle p = prepare(ctx, g);
      // The object keeps its own copy: the caller's description may change after preparing.
      g.n = -1;
      wt.numel = 0;
      REQUIRE(nf4_gemv_prepared_launch(p.get(), nullptr, nullptr, nullptr) == NF4_OK);
      CHECK(test::differing_elements(c.oracle().data(), y.data(), c.m * c.n, c.y_dtype) == 0);
      CHECK(std::all_of(y.end() - 16, y.end(), [](std::uint8_t b) { return b == 0xA5; }));
      // Another step: new activations, another output.
      test::make_gemv_case(c2, 17, k, m, NF4_QUANT_NF4, 64, false, c.x_dtype, c.y_dtype, s + 900);
      c2.w = c.w;
      c2.wt = c2.w.describe(NF4_DTYPE_F32, nullptr, 0);
      std::vector<std::uint8_t> y2(static_cast<std::size_t>(c.y_bytes()), 0x11);
      REQUIRE(nf4_gemv_prepared_launch(p.get(), c2.x.data(), y2.data(), nullptr) == NF4_OK);
      CHECK(test::differing_elements(c2.oracle().data(), y2.data(), c.m * c.n, c.y_dtype) == 0);
    }
}

TEST_CASE("gemv prepared: preparing refuses what nf4_gemv refuses, on every backend, with the same status") {
  test::GemvCase c;
  test::make_gemv_case(c, 6, 100, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F16, 1);
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0xEE);
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    REQUIRE(nf4_backend_get_info(i, &info) == NF4_OK);
    if (!info.available) continue;
    Context ctx(info.kind);
    CAPTURE(ctx.device_name());
    nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
    nf4_gemv_prepared* p = reinterpret_cast<nf4_gemv_prepared*>(&y);  // must be reset to NULL on failure
    g.m = NF4_GEMV_MAX_M + 1;
    CHECK(nf4_gemv_prepare(ctx.get(), &g, &p) == NF4_ERR_SHAPE);
    CHECK(p == nullptr);
    CHECK(std::string(nf4_last_error(ctx.get())).find("m must be") != std::string::npos);
    g = c.describe(y.data(), c.y_bytes());
    g.y = const_cast<std::uint8_t*>(c.wt.packed);
    CHECK(nf4_gemv_prepare(ctx.get(), &g, &p) == NF4_ERR_ALIASING);
    CHECK(nf4_gemv_prepare(ctx.get(), nullptr, &p) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_prepare(ctx.get(), &g, nullptr) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_prepare(nullptr, &g, &p) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_gemv_prepared_launch(nullptr, nullptr, nullptr, nullptr) == NF4_ERR_NULL_POINTER);
    nf4_gemv_prepared_destroy(nullptr);  // a no-op, like free(NULL)
    // A valid description: a backend without prepared products (vulkan records them through its
    // own job API, nf4_vulkan.h) says so, naming itself.
    g = c.describe(y.data(), c.y_bytes());
    const nf4_status s = nf4_gemv_prepare(ctx.get(), &g, &p);
    if (!nf4::context_backend(ctx.get()).capabilities().prepared_gemv) {
      CHECK(s == NF4_ERR_UNSUPPORTED);
      CHECK(std::string(nf4_last_error(ctx.get())).find(info.name) != std::string::npos);
      CHECK(p == nullptr);
    } else {
      CHECK(s == NF4_OK);
      nf4_gemv_prepared_destroy(p);
    }
    CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
  }
}

TEST_CASE("gemv prepared (cpu): a launch refuses a y that overlaps x or the weight, and writes nothing") {
  Context ctx(NF4_BACKEND_CPU);
  test::GemvCase c;
  test::make_gemv_case(c, 6, 100, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_F32, NF4_DTYPE_F32, 2);
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()), 0xEE);
  const GemvHandle p = prepare(ctx, c.describe(y.data(), c.y_bytes()));
  std::vector<std::uint8_t> x = c.x;
  const std::vector<std::uint8_t> x_before = x;
  CHECK(nf4_gemv_prepared_launch(p.get(), x.data(), x.data() + 8, nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("y overlaps x") != std::string::npos);
  CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, const_cast<std::uint8_t*>(c.wt.packed), nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("packed") != std::string::npos);
  CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, const_cast<float*>(c.wt.nested_code) + 100, nullptr) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("nested_code") != std::string::npos);
  // The prepared y overlapping a new x.
  CHECK(nf4_gemv_prepared_launch(p.get(), y.data(), nullptr, nullptr) == NF4_ERR_ALIASING);
  int not_a_stream = 0;
  CHECK(nf4_gemv_prepared_launch(p.get(), nullptr, nullptr, &not_a_stream) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nf4_last_error(ctx.get())).find("no streams") != std::string::npos);
  CHECK(x == x_before);
  CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
}

TEST_CASE("gemv prepared (cpu): threads launching one prepared product at once, each into its own y") {
  Context ctx(NF4_BACKEND_CPU);
  test::GemvCase c;
  test::make_gemv_case(c, 300, 1000, 4, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 3);
  const std::vector<std::uint8_t> want = c.oracle();
  std::vector<std::uint8_t> y0(static_cast<std::size_t>(c.y_bytes()));
  const GemvHandle p = prepare(ctx, c.describe(y0.data(), c.y_bytes()));
  constexpr int kThreads = 4;
  std::vector<std::vector<std::uint8_t>> ys(kThreads, std::vector<std::uint8_t>(static_cast<std::size_t>(c.y_bytes())));
  std::vector<nf4_status> status(kThreads, NF4_OK);
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        std::fill(ys[t].begin(), ys[t].end(), std::uint8_t{0});
        if (const nf4_status s = nf4_gemv_prepared_launch(p.get(), nullptr, ys[t].data(), nullptr); s != NF4_OK) status[t] = s;
        if (ys[t] != want) ++wrong[t];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(status[t] == NF4_OK);
    CHECK(wrong[t] == 0);
  }
}
