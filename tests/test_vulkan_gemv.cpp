// SPDX-License-Identifier: MIT
// The Vulkan matrix-vector product recorded into an application's command buffer: odd sizes and
// every dtype at buffer offsets, rows split over dispatches at lowered device limits, and the
// statuses of bad product descriptions. Fixtures and the validation layer: tests/support/vulkan.h.
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/vulkan/vk_kernels.h"
#include "nf4/nf4.hpp"
#include "nf4/nf4_vulkan.h"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"
#include "tests/support/gemv_fast.h"
#include "tests/support/vulkan.h"

using namespace nf4;
using namespace nf4::test;

namespace {

// A product description of c: its weight (described into `t`, whose output goes to `unused`), x in
// `in`, y in `out`, placed by p at odd offsets.
nf4_vulkan_gemv place_gemv(const test::GemvCase& c, App::Buffer& in, App::Buffer& out, App::Buffer& unused, Placement& p,
                           nf4_vulkan_tensor& t) {
  t = describe(c.w, NF4_DTYPE_F32, in, unused, p);
  p.out_at = 48;
  nf4_vulkan_gemv g{};
  g.weight = &t;
  g.n = c.n;
  g.k = c.k;
  g.m = c.m;
  g.x_dtype = c.x_dtype;
  g.x = p.put(in, c.x.data(), static_cast<std::int64_t>(c.x.size()));
  g.y_dtype = c.y_dtype;
  g.y = p.out(out, c.y_bytes());
  return g;
}

// Places a product's weight, x and a poisoned y in the app's buffers, records it between the app's
// own work, and checks y against the oracle and every byte around it. Returns the dispatch count.
std::size_t run_embedded_gemv(App& app, nf4_vulkan_context* ctx, const test::GemvCase& c) {
  const cpu::QuantizedWeight& w = c.w;
  const VkDeviceSize in_bytes = w.packed.size() + w.absmax_f32.size() * 4 + w.absmax_u8.size() + w.nested_absmax.size() * 4 + c.x.size() + 4096;
  const VkDeviceSize out_bytes = static_cast<VkDeviceSize>(c.y_bytes()) + 256;
  App::Buffer& in = app.buffer(in_bytes);
  App::Buffer& out = app.buffer(out_bytes);
  App::Buffer& readback = app.buffer(out_bytes);
  App::Buffer& unused = app.buffer(static_cast<VkDeviceSize>(w.numel) * 4 + 4096);  // describe() places an output
  Placement p;
  nf4_vulkan_tensor t{};
  const nf4_vulkan_gemv g = place_gemv(c, in, out, unused, p, t);
  t.out = {};  // not used by the product
  nf4_vulkan_job* job = nullptr;
  const nf4_status s = nf4_vulkan_gemv_job_create(ctx, &g, &job);
  INFO(nf4_vulkan_last_error(ctx));
  REQUIRE(s == NF4_OK);
  const std::size_t dispatches = nf4_vulkan_job_dispatch_count(job);
  app.run_between(job, out, readback);
  nf4_vulkan_job_destroy(job);
  const auto expected = c.oracle();
  CHECK_MESSAGE(test::differing_elements(expected.data(), readback.data + g.y.offset, c.m * c.n, c.y_dtype) == 0, c.label());
  std::size_t clobbered = 0;
  for (VkDeviceSize b = 0; b < readback.size; ++b)
    clobbered += (b < g.y.offset || b >= g.y.offset + static_cast<VkDeviceSize>(c.y_bytes())) && readback.data[b] != 0xA5;
  CHECK_MESSAGE(clobbered == 0, c.label() << ": " << clobbered << " bytes outside y were written");
  return dispatches;
}

}  // namespace

TEST_CASE("vulkan gemv: recorded into the app's command buffer at buffer offsets, odd sizes and every dtype") {
  if (!vulkan_available()) return;
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  std::uint64_t seed = 300;
  for (std::int64_t k : {1, 31, 64, 100, 1024, 1500})
    for (std::int64_t n : {1, 3, 8})
      for (nf4_dtype yd : test::kProductDTypes) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, n, k, static_cast<std::int32_t>(1 + s % 8), s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 32 << (s % 4), s % 3 != 0,
                             test::kProductDTypes[(s / 3) % test::kProductDTypes.size()], yd, s);
        run_embedded_gemv(app, ctx, c);
      }
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}

TEST_CASE("vulkan gemv fast: recorded into the app's command buffer, relaunched; the contract it reports, then runs") {
  if (!vulkan_available()) return;
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  Context standalone(NF4_BACKEND_VULKAN);
  std::uint64_t seed = 900;
  for (nf4_dtype xd : {NF4_DTYPE_BF16, NF4_DTYPE_F16})
    for (const auto& km : {std::pair<std::int64_t, std::int32_t>{96, 1}, {1000, 8}, {4096, 64}, {256, 200}}) {
      const std::int64_t k = km.first;
      const std::int32_t m = km.second;
      const std::uint64_t s = seed++;
      test::GemvCase c;
      test::make_gemv_case(c, 37, k, m, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, k == 1000 ? 128 : 64, s % 3 != 1, xd, test::kDTypes[s % 3], s);
      CAPTURE(c.label());
      const VkDeviceSize in_bytes = c.w.packed.size() + c.w.absmax_f32.size() * 4 + c.w.absmax_u8.size() + c.w.nested_absmax.size() * 4 +
                                    c.x.size() + 4096;
      App::Buffer& in = app.buffer(in_bytes);
      App::Buffer& out = app.buffer(static_cast<VkDeviceSize>(c.y_bytes()) + 256);
      App::Buffer& readback = app.buffer(out.size);
      App::Buffer& unused = app.buffer(static_cast<VkDeviceSize>(c.w.numel) * 4 + 4096);
      Placement p;
      nf4_vulkan_tensor t{};
      nf4_vulkan_gemv g = place_gemv(c, in, out, unused, p, t);
      t.out = {};
      g.mode = NF4_GEMV_FAST;
      nf4_vulkan_job* job = nullptr;
      INFO(nf4_vulkan_last_error(ctx));
      REQUIRE(nf4_vulkan_gemv_job_create(ctx, &g, &job) == NF4_OK);
      const nf4_gemv_mode used = nf4_vulkan_job_gemv_mode(job);
      // The embedding context runs what the standalone backend reports for the same product.
      std::vector<std::uint8_t> host_y(static_cast<std::size_t>(c.y_bytes()));
      nf4_gemv_desc hd = c.describe(host_y.data(), c.y_bytes());
      hd.mode = NF4_GEMV_FAST;
      nf4_gemv_mode standalone_used = NF4_GEMV_FAST;
      REQUIRE(nf4_gemv_mode_used(standalone.get(), &hd, &standalone_used) == NF4_OK);
      CHECK(used == standalone_used);
      if (!app.coop) CHECK(used == NF4_GEMV_EXACT);  // lavapipe, older drivers: the exact shader, reported
      // Prepared once, recorded into two frames: the same bytes, nothing outside y written.
      app.run_between(job, out, readback);
      const std::vector<std::uint8_t> first(readback.data, readback.data + readback.size);
      app.run_between(job, out, readback);
      CHECK(std::equal(first.begin(), first.end(), readback.data));
      nf4_vulkan_job_destroy(job);
      const std::uint8_t* y = readback.data + g.y.offset;
      std::size_t clobbered = 0;
      for (VkDeviceSize b = 0; b < readback.size; ++b)
        clobbered += (b < g.y.offset || b >= g.y.offset + static_cast<VkDeviceSize>(c.y_bytes())) && readback.data[b] != 0xA5;
      CHECK(clobbered == 0);
      if (used == NF4_GEMV_EXACT) {
        CHECK(test::differing_elements(c.oracle().data(), y, c.m * c.n, c.y_dtype) == 0);
        continue;
      }
      const test::FastErrors e = test::fast_errors(c, y);
      CHECK_MESSAGE(e.outside == 0, e.outside << " outputs past the bound");
      // The same shader through the standalone backend: the same bits.
      REQUIRE(nf4_gemv_host(standalone.get(), &hd) == NF4_OK);
      CHECK(std::memcmp(host_y.data(), y, host_y.size()) == 0);
    }
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}

TEST_CASE("vulkan gemv fast: every schedule of the cooperative-matrix shader gives the same bits") {
  // NF4_VULKAN_COOP_TUNE picks the schedule (which subgroups split K, token tiles, columns per
  // stage, operands in flight, the value table): the sum's order is the same in each, so the bits
  // are. Only where the fast contract runs (the exact shader's bits are the oracle's anyway).
  if (!vulkan_available()) return;
  Context ctx(NF4_BACKEND_VULKAN);
  std::uint64_t seed = 930;
  for (nf4_dtype xd : {NF4_DTYPE_BF16, NF4_DTYPE_F16})
    for (const auto& km : {std::pair<std::int64_t, std::int32_t>{96, 20}, {1000, 100}, {4096, 33}}) {
      const std::uint64_t s = seed++;
      test::GemvCase c;
      test::make_gemv_case(c, 37, km.first, km.second, s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, km.first == 1000 ? 128 : 64, s % 3 != 1, xd,
                           test::kDTypes[s % 3], s);
      CAPTURE(c.label());
      std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()));
      nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
      g.mode = NF4_GEMV_FAST;
      nf4_gemv_mode used = NF4_GEMV_EXACT;
      REQUIRE(nf4_gemv_mode_used(ctx.get(), &g, &used) == NF4_OK);
      if (used != NF4_GEMV_FAST) continue;
      REQUIRE(nf4_gemv_host(ctx.get(), &g) == NF4_OK);
      const std::vector<std::uint8_t> expected = y;
      for (const char* tune : {"small=0", "small=256", "small=256,stt=2,kc=32", "kc=32,bkc=32", "btt=2", "bkc=128,btt=2", "ahead=2", "lut=1",
                               "nt=1"}) {
        CAPTURE(tune);
        ScopedEnv env("NF4_VULKAN_COOP_TUNE", tune);
        std::fill(y.begin(), y.end(), std::uint8_t{0xA5});
        REQUIRE(nf4_gemv_host(ctx.get(), &g) == NF4_OK);
        CHECK(y == expected);
      }
    }
}

TEST_CASE("vulkan gemv: rows split over dispatches at the workgroup-count and storage-range limits") {
  if (!vulkan_available()) return;
  ScopedEnv tune("NF4_VULKAN_GEMV_TUNE", "wg=64");           // two teams: at least 2 rows per workgroup
  ScopedEnv groups("NF4_VULKAN_MAX_GROUPS", "3");            // 6 rows per dispatch
  ScopedEnv range("NF4_VULKAN_MAX_STORAGE_RANGE", "65536");  // and bindings of at most 64 KiB
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  test::GemvCase c;
  test::make_gemv_case(c, 29, 1000, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F16, 77);  // blocks straddle rows
  CHECK(run_embedded_gemv(app, ctx, c) == 5);
  test::GemvCase big;
  test::make_gemv_case(big, 40, 4096, 2, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 78);
  CHECK(run_embedded_gemv(app, ctx, big) >= 7);
  {
    // Two teams sharing each row group: one row per workgroup, 2 per dispatch.
    ScopedEnv split("NF4_VULKAN_GEMV_TUNE", "wg=64,split=2");
    nf4_vulkan_context* split_ctx = app.nf4_context();
    test::GemvCase two;
    test::make_gemv_case(two, 29, 2000, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F16, 80);  // 2 chunks
    CHECK(run_embedded_gemv(app, split_ctx, two) == 15);
    nf4_vulkan_context_destroy(split_ctx);
  }
  nf4_vulkan_context_destroy(ctx);
  {
    // A row of W wider than one storage range: refused with a reason, nothing written.
    Context standalone(NF4_BACKEND_VULKAN);
    test::GemvCase wide;
    test::make_gemv_case(wide, 2, 1 << 17, 1, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 79);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(wide.y_bytes()), 0xEE);
    const nf4_gemv_desc g = wide.describe(y.data(), wide.y_bytes());
    CHECK(nf4_gemv_host(standalone.get(), &g) == NF4_ERR_UNSUPPORTED);
    CHECK(std::string(nf4_last_error(standalone.get())).find("storage-buffer range") != std::string::npos);
    CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan gemv: the automatic split follows CUDA's cost model") {
  // H100: 132 SMs of 64 warps; R = 2 rows per team, 4 teams per workgroup.
  const std::int64_t h100 = 132 * 64;
  CHECK(vk::choose_gemv_split(2048, 14, 4, h100, 0) == 4);   // 4096 x 14336: one wave at any split, 16 -> 4 chunks per part
  CHECK(vk::choose_gemv_split(7168, 4, 4, h100, 0) == 1);    // 14336 x 4096: split 2 takes two waves, no gain
  CHECK(vk::choose_gemv_split(4096, 28, 4, h100, 0) == 2);   // 8192 x 28672: split 4 costs 2 waves of 8, not a quarter below 16
  CHECK(vk::choose_gemv_split(14336, 8, 4, h100, 0) == 1);   // 28672 x 8192: already two waves
  CHECK(vk::choose_gemv_split(2048, 14, 4, 0, 0) == 1);      // resident teams unknown: no split
  CHECK(vk::choose_gemv_split(2, 1, 4, h100, 0) == 1);       // one chunk: nothing to split
  CHECK(vk::choose_gemv_split(2, 3, 8, h100, 0) == 4);       // capped by the padded chunk count
  CHECK(vk::choose_gemv_split(2, 100, 2, h100, 0) == 2);     // and by the teams
  CHECK(vk::choose_gemv_split(2048, 14, 4, 0, 32) == 4);     // forced: capped by the teams
  CHECK(vk::choose_gemv_split(2048, 2, 8, 0, 8) == 2);       // and by the padded chunks
  CHECK(vk::choose_gemv_split(2048, 14, 4, h100, 1) == 1);
}

TEST_CASE("vulkan gemv: the embedding API rejects bad products with the right status") {
  if (!vulkan_available()) return;
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  test::GemvCase c;
  test::make_gemv_case(c, 4, 96, 2, NF4_QUANT_NF4, 32, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 5);
  App::Buffer& in = app.buffer(1 << 16);
  App::Buffer& out = app.buffer(1 << 12);
  App::Buffer& unused = app.buffer(1 << 12);
  Placement p;
  nf4_vulkan_tensor t{};
  const nf4_vulkan_gemv good = place_gemv(c, in, out, unused, p, t);
  struct Bad {
    const char* name;
    nf4_status status;
    std::function<void(nf4_vulkan_gemv&)> mutate;
  };
  const std::vector<Bad> cases = {
      {"null weight", NF4_ERR_NULL_POINTER, [](nf4_vulkan_gemv& g) { g.weight = nullptr; }},
      {"n * k != numel", NF4_ERR_SHAPE, [](nf4_vulkan_gemv& g) { g.k += 1; }},
      {"m = 257", NF4_ERR_SHAPE, [](nf4_vulkan_gemv& g) { g.m = NF4_GEMV_MAX_M + 1; }},
      {"mode 2", NF4_ERR_INVALID_ARGUMENT, [](nf4_vulkan_gemv& g) { g.mode = static_cast<nf4_gemv_mode>(2); }},
      {"x dtype", NF4_ERR_DTYPE, [](nf4_vulkan_gemv& g) { g.x_dtype = static_cast<nf4_dtype>(5); }},
      {"no x buffer", NF4_ERR_NULL_POINTER, [](nf4_vulkan_gemv& g) { g.x.buffer = VK_NULL_HANDLE; }},
      {"x too small", NF4_ERR_INVALID_ARGUMENT, [](nf4_vulkan_gemv& g) { g.x.size -= 4; }},
      {"y too small", NF4_ERR_OUTPUT_TOO_SMALL, [](nf4_vulkan_gemv& g) { g.y.size -= 4; }},
      {"y misaligned", NF4_ERR_INVALID_ARGUMENT, [](nf4_vulkan_gemv& g) { g.y.offset += 2; }},
      {"y overlaps x", NF4_ERR_ALIASING, [](nf4_vulkan_gemv& g) { g.y = g.x; }},
      {"y overlaps packed", NF4_ERR_ALIASING, [](nf4_vulkan_gemv& g) { g.y = {g.weight->packed.buffer, g.weight->packed.offset, 4096}; }},
  };
  for (const Bad& b : cases) {
    CAPTURE(b.name);
    nf4_vulkan_gemv g = good;
    b.mutate(g);
    nf4_vulkan_job* job = reinterpret_cast<nf4_vulkan_job*>(1);
    CHECK(nf4_vulkan_gemv_job_create(ctx, &g, &job) == b.status);
    CHECK(job == nullptr);
    CHECK(std::string(nf4_vulkan_last_error(ctx)).size() > 0);
  }
  // The scalars (the weight's, the shape, the dtypes) go through the C API's own validation: a bad
  // one gets the status and the message nf4_gemv_validate gives the same product in host memory.
  std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()));
  const auto same_as_c_api = [&](const char* name, auto mutate) {
    CAPTURE(name);
    nf4_tensor host_weight = c.wt;
    nf4_gemv_desc host = c.describe(y.data(), c.y_bytes());
    host.weight = &host_weight;
    nf4_vulkan_tensor weight = t;
    nf4_vulkan_gemv g = good;
    g.weight = &weight;
    mutate(host, host_weight);
    mutate(g, weight);
    const nf4_status expected = nf4_gemv_validate(&host);
    const std::string message = nf4_last_error(nullptr);
    CHECK(expected != NF4_OK);
    nf4_vulkan_job* job = reinterpret_cast<nf4_vulkan_job*>(1);
    CHECK(nf4_vulkan_gemv_job_create(ctx, &g, &job) == expected);
    CHECK(job == nullptr);
    CHECK(std::string(nf4_vulkan_last_error(ctx)) == message);
  };
  same_as_c_api("null weight", [](auto& g, auto&) { g.weight = nullptr; });
  same_as_c_api("n zero", [](auto& g, auto&) { g.n = 0; });
  same_as_c_api("k negative", [](auto& g, auto&) { g.k = -100; });
  same_as_c_api("n * k > numel", [](auto& g, auto&) { g.n += 1; });
  same_as_c_api("n * k overflows", [](auto& g, auto&) { g.n = INT64_MAX / 2; g.k = 6; });
  same_as_c_api("m zero", [](auto& g, auto&) { g.m = 0; });
  same_as_c_api("m past the maximum", [](auto& g, auto&) { g.m = NF4_GEMV_MAX_M + 1; });
  same_as_c_api("x dtype", [](auto& g, auto&) { g.x_dtype = static_cast<nf4_dtype>(3); });
  same_as_c_api("y dtype", [](auto& g, auto&) { g.y_dtype = static_cast<nf4_dtype>(-1); });
  same_as_c_api("quant type", [](auto&, auto& w) { w.quant_type = static_cast<nf4_quant_type>(7); });
  same_as_c_api("numel zero", [](auto&, auto& w) { w.numel = 0; });
  same_as_c_api("blocksize", [](auto&, auto& w) { w.blocksize = 48; });
  same_as_c_api("nested flag", [](auto&, auto& w) { w.nested = 2; });
  same_as_c_api("nested blocksize", [](auto&, auto& w) { w.nested_blocksize = 3; });

  nf4_vulkan_job* job = nullptr;
  CHECK(nf4_vulkan_gemv_job_create(ctx, &good, &job) == NF4_OK);
  nf4_vulkan_job_destroy(job);
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}
