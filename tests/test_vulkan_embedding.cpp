// SPDX-License-Identifier: MIT
// The Vulkan embedding API (nf4_vulkan.h): jobs recorded into an application's own command buffer
// at buffer offsets on every variant, chunking at lowered device limits (embedded and standalone),
// and the statuses of bad buffer descriptions. Fixtures and the validation layer:
// tests/support/vulkan.h.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/oracle.h"
#include "nf4/nf4.hpp"
#include "nf4/nf4_vulkan.h"
#include "tests/support/common.h"
#include "tests/support/vulkan.h"

using namespace nf4;
using namespace nf4::test;

TEST_CASE("vulkan: embedded recording into the app's command buffer at buffer offsets, every variant") {
  if (!vulkan_available()) return;
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    MESSAGE("vulkan device: " << std::string(nf4_vulkan_device_name(ctx)));
    std::mt19937_64 rng(42);
    std::uint64_t seed = 1000;
    const int blocksizes[] = {32, 64, 128, 256, 1024, 4096};
    const int nested_blocksizes[] = {256, 1, 4, 1024};
    for (nf4_quant_type qt : test::kQuantTypes)
      for (bool nested : {false, true}) {
        std::vector<cpu::QuantizedWeight> ws;
        std::vector<nf4_dtype> ds;
        for (std::int64_t n : {1, 2, 3, 7, 8, 9, 31, 33, 63, 64, 65, 255, 1000, 4097, 8191, 8193, 16385})
          for (nf4_dtype d : test::kDTypes) {
            ws.push_back(test::random_weight(n, qt, blocksizes[rng() % 6], nested, seed++, nested_blocksizes[rng() % 4]));
            ds.push_back(d);
          }
        for (int r = 0; r < 6; ++r) {  // random sizes
          ws.push_back(test::random_weight(1 + static_cast<std::int64_t>(rng() % 60000), qt, blocksizes[rng() % 6], nested, seed++,
                                           nested_blocksizes[rng() % 4]));
          ds.push_back(test::kDTypes[rng() % 3]);
        }
        run_embedded(app, ctx, ws, ds);
      }
    nf4_vulkan_context_destroy(ctx);
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: chunking around maxStorageBufferRange and maxComputeWorkGroupCount") {
  if (!vulkan_available()) return;
  // Lower the limits: 64 KiB bindings and 2 workgroups per dispatch give 8192-element chunks.
  setenv("NF4_VULKAN_MAX_STORAGE_RANGE", "65536", 1);
  setenv("NF4_VULKAN_MAX_GROUPS", "2", 1);
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    // Nested blocks that straddle chunk boundaries (1024 blocks of 64 span 8 chunks).
    const std::vector<cpu::QuantizedWeight> ws = {test::random_weight(70001, NF4_QUANT_NF4, 64, true, 7, 1024),
                                                  test::random_weight(50000, NF4_QUANT_FP4, 32, true, 8, 512),
                                                  test::random_weight(40961, NF4_QUANT_NF4, 4096, false, 9)};
    std::size_t dispatches = 0;
    run_embedded(app, ctx, ws, {NF4_DTYPE_F16, NF4_DTYPE_F32, NF4_DTYPE_BF16}, &dispatches);
    CHECK(dispatches >= 9 + 7 + 6);
    nf4_vulkan_context_destroy(ctx);

    // The standalone backend under the same limits.
    Context c(NF4_BACKEND_VULKAN);
    const auto w = test::random_weight(100003, NF4_QUANT_NF4, 64, true, 10, 1024);
    std::vector<std::uint16_t> got(100003), expected(100003);
    cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 100003 * 2));
    c.dequantize_host(w.describe(NF4_DTYPE_BF16, got.data(), 100003 * 2));
    CHECK(got == expected);
  }
  unsetenv("NF4_VULKAN_MAX_STORAGE_RANGE");
  unsetenv("NF4_VULKAN_MAX_GROUPS");
  check_no_validation_messages();
}

TEST_CASE("vulkan: the embedding API rejects bad buffers with the right status") {
  if (!vulkan_available()) return;
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    App::Buffer& in = app.buffer(1 << 16);
    App::Buffer& out = app.buffer(1 << 16);
    const auto w = test::random_weight(1001, NF4_QUANT_NF4, 64, true, 3);
    Placement p;
    const nf4_vulkan_tensor good = describe(w, NF4_DTYPE_F16, in, out, p);
    struct Bad {
      nf4_status status;
      const char* mentions;  // in the message
      std::function<void(nf4_vulkan_tensor&)> mutate;
    };
    const std::vector<Bad> cases = {
        {NF4_ERR_NULL_POINTER, "packed", [](nf4_vulkan_tensor& t) { t.packed.buffer = VK_NULL_HANDLE; }},
        {NF4_ERR_PACKED_SIZE, "packed.size", [](nf4_vulkan_tensor& t) { t.packed.size -= 4; }},
        {NF4_ERR_ABSMAX_SIZE, "absmax.size", [](nf4_vulkan_tensor& t) { t.absmax.size = 8; }},
        {NF4_ERR_NESTED_ABSMAX_SIZE, "nested_absmax.size", [](nf4_vulkan_tensor& t) { t.nested_absmax.size = 0; }},
        {NF4_ERR_NESTED_CODE_SIZE, "nested_code.size", [](nf4_vulkan_tensor& t) { t.nested_code.size = 1020; }},
        {NF4_ERR_QUANT_MAP_SIZE, "quant_map.size", [](nf4_vulkan_tensor& t) { t.quant_map.size = 60; }},
        {NF4_ERR_OUTPUT_TOO_SMALL, "out.size", [](nf4_vulkan_tensor& t) { t.out.size = 2000; }},
        {NF4_ERR_INVALID_ARGUMENT, "out.offset must be a multiple of 16", [](nf4_vulkan_tensor& t) { t.out.offset += 4; }},
        {NF4_ERR_INVALID_ARGUMENT, "packed.offset must be a multiple of 4", [](nf4_vulkan_tensor& t) { t.packed.offset += 2; }},
        {NF4_ERR_BLOCKSIZE, "blocksize", [](nf4_vulkan_tensor& t) { t.blocksize = 48; }},
        {NF4_ERR_ELEMENT_COUNT, "numel", [](nf4_vulkan_tensor& t) { t.numel = 0; }},
        {NF4_ERR_ALIASING, "overlaps packed", [&](nf4_vulkan_tensor& t) { t.out = {in.buffer, good.packed.offset / 16 * 16, 4096}; }},
    };
    for (const Bad& b : cases) {
      nf4_vulkan_tensor t = good;
      b.mutate(t);
      nf4_vulkan_job* job = reinterpret_cast<nf4_vulkan_job*>(std::uintptr_t{1});
      CHECK(nf4_vulkan_job_create(ctx, &t, 1, &job) == b.status);
      CHECK(job == nullptr);
      CHECK_MESSAGE(std::string(nf4_vulkan_last_error(ctx)).find(b.mentions) != std::string::npos, std::string(nf4_vulkan_last_error(ctx)));
    }
    nf4_vulkan_job* job = nullptr;
    CHECK(nf4_vulkan_job_create(ctx, nullptr, 1, &job) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_vulkan_job_record(nullptr, VK_NULL_HANDLE) == NF4_ERR_NULL_POINTER);
    nf4_vulkan_context_info bad{};
    nf4_vulkan_context* c2 = nullptr;
    CHECK(nf4_vulkan_context_create(&bad, &c2) == NF4_ERR_NULL_POINTER);
    CHECK(c2 == nullptr);
    nf4_vulkan_context_destroy(ctx);
  }
  check_no_validation_messages();
}
