// SPDX-License-Identifier: MIT
// The device level of the C API (nf4.h, "Devices"): every available backend lists its devices and
// makes a context on each; a device that does not exist is refused naming the index and the count;
// and two devices of one backend run at once, each from its own thread, bit for bit as the oracle.
// Iterates the registry, so a backend added later is covered without naming it. Where fewer than
// two devices exist the concurrent case says so and skips, unless NF4_TEST_REQUIRE_DEVICES=N asks
// for N devices of some backend (the GPU machine's multi-GPU phase).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"
#include "tests/support/gemv.h"

using namespace nf4;
using nf4::test::contains;

namespace {

nf4_device_info device_info(nf4_backend_kind kind, std::size_t index) {
  nf4_device_info info = NF4_DEVICE_INFO_INIT;
  const nf4_status s = nf4_device_get_info(kind, index, &info);
  REQUIRE_MESSAGE(s == NF4_OK, nf4_last_error(nullptr));
  return info;
}

// One thread's work on one context: dequantizations of every dtype and products, host pointers,
// `rounds` times over; the number of results that differ from the oracle's (0 when all agree).
int run_against_oracle(nf4_context* ctx, std::uint64_t seed, int rounds) {
  const cpu::QuantizedWeight w = test::synthetic_weight((1 << 20) + 77, NF4_QUANT_NF4, 64, true, seed);
  const cpu::QuantizedWeight f = test::synthetic_weight(300001, NF4_QUANT_FP4, 128, false, seed + 1);
  test::GemvCase g;
  test::make_gemv_case(g, 256, 512, 4, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F32, seed + 2);
  const std::vector<std::uint8_t> y_expected = g.oracle();
  int wrong = 0;
  for (int r = 0; r < rounds; ++r) {
    for (nf4_dtype d : test::kDTypes) {
      for (const cpu::QuantizedWeight* q : {&w, &f}) {
        const std::int64_t bytes = q->numel * static_cast<std::int64_t>(nf4_dtype_size(d));
        std::vector<std::uint8_t> expected(static_cast<std::size_t>(bytes)), got(static_cast<std::size_t>(bytes), 0xA5);
        cpu::oracle_dequantize(q->describe(d, expected.data(), bytes));
        const nf4_tensor t = q->describe(d, got.data(), bytes);
        if (nf4_dequantize_host(ctx, &t) != NF4_OK || expected != got) ++wrong;
      }
    }
    std::vector<std::uint8_t> y(static_cast<std::size_t>(g.y_bytes()), 0xA5);
    const nf4_gemv_desc desc = g.describe(y.data(), g.y_bytes());
    if (nf4_gemv_host(ctx, &desc) != NF4_OK || y != y_expected) ++wrong;
  }
  return wrong;
}

}  // namespace

TEST_CASE("devices: every available backend lists its devices and makes a context on each") {
  for (std::size_t b = 0; b < nf4_backend_count(); ++b) {
    nf4_backend_info backend{};
    REQUIRE(nf4_backend_get_info(b, &backend) == NF4_OK);
    CAPTURE(backend.name);
    const std::size_t count = nf4_device_count(backend.kind);
    if (!backend.available) {
      CHECK(count == 0);
      nf4_device_info info = NF4_DEVICE_INFO_INIT;
      CHECK(nf4_device_get_info(backend.kind, 0, &info) == NF4_ERR_BACKEND_UNAVAILABLE);
      nf4_context* ctx = nullptr;
      CHECK(nf4_context_create_on_device(backend.kind, 0, nullptr, &ctx) == NF4_ERR_BACKEND_UNAVAILABLE);
      CHECK(ctx == nullptr);
      MESSAGE("backend '" << std::string(backend.name) << "' has no devices here: " << std::string(backend.device_name));
      continue;
    }
    REQUIRE(count >= 1);
    if (backend.kind == NF4_BACKEND_CPU) CHECK(count == 1);
    CHECK(nf4::devices(backend.kind).size() == count);
    for (std::size_t i = 0; i < count; ++i) {
      const nf4_device_info info = device_info(backend.kind, i);
      CAPTURE(info.description);
      MESSAGE(std::string(backend.name) << " device " << i << ": " << std::string(info.description) << ", "
                                        << (info.memory_bytes >> 20) << " MiB, caps " << info.caps);
      CHECK(info.struct_size == sizeof(nf4_device_info));
      CHECK(info.backend == backend.kind);
      CHECK(info.index == i);
      REQUIRE(info.name != nullptr);
      REQUIRE(info.description != nullptr);
      CHECK(std::strlen(info.name) > 0);
      CHECK(contains(info.description, info.name));
      const bool has_uuid = std::any_of(std::begin(info.uuid), std::end(info.uuid), [](std::uint8_t v) { return v != 0; });
      if (backend.kind == NF4_BACKEND_CPU) {
        CHECK(info.type == NF4_DEVICE_TYPE_CPU);
        CHECK(info.memory_bytes > 0);
        CHECK(!has_uuid);
      }
      // A context on it runs there and says so; what the device says it can do, it does.
      Context ctx = Context::on_device(backend.kind, i);
      CHECK(nf4_context_backend(ctx.get()) == backend.kind);
      CHECK(nf4_context_device_index(ctx.get()) == static_cast<std::int32_t>(i));
      CHECK(contains(info.description, ctx.device_name()));
      CHECK(info.caps == device_cap_bits(find_backend(backend.kind)->devices[i].caps));
      const auto w = test::random_weight(1000, NF4_QUANT_NF4, 64, true, 5);
      std::vector<std::uint16_t> out(1000, 0x1234), expected(1000);
      cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 2000));
      const nf4_tensor t = w.describe(NF4_DTYPE_BF16, out.data(), 2000);
      if (!(info.caps & NF4_DEVICE_CAP_DEVICE_POINTERS)) CHECK(nf4_dequantize(ctx.get(), &t) == NF4_ERR_UNSUPPORTED);
      if (info.caps & NF4_DEVICE_CAP_HOST_POINTERS) {
        REQUIRE(nf4_dequantize(ctx.get(), &t) == NF4_OK);
        CHECK(out == expected);
      }
      std::fill(out.begin(), out.end(), 0x1234);
      REQUIRE(nf4_dequantize_host(ctx.get(), &t) == NF4_OK);
      CHECK(out == expected);
      test::GemvCase c;
      test::make_gemv_case(c, 16, 64, 2, NF4_QUANT_NF4, 64, false, NF4_DTYPE_BF16, NF4_DTYPE_F32, 3);
      std::vector<std::uint8_t> y(static_cast<std::size_t>(c.y_bytes()));
      nf4_gemv_desc g = c.describe(y.data(), c.y_bytes());
      g.mode = NF4_GEMV_FAST;
      nf4_gemv_mode used = NF4_GEMV_FAST;
      REQUIRE(nf4_gemv_mode_used(ctx.get(), &g, &used) == NF4_OK);
      if (!(info.caps & NF4_DEVICE_CAP_GEMV_FAST)) CHECK(used == NF4_GEMV_EXACT);
    }
  }
}

TEST_CASE("devices: a device that does not exist is refused, naming the index and the count") {
  for (nf4_backend_kind kind : test::available_backends()) {
    const std::size_t count = nf4_device_count(kind);
    for (const std::size_t index : {count, count + 1, static_cast<std::size_t>(-1)}) {
      CAPTURE(index);
      nf4_context* ctx = reinterpret_cast<nf4_context*>(&ctx);  // must be reset to NULL
      REQUIRE(nf4_context_create_on_device(kind, index, nullptr, &ctx) == NF4_ERR_INVALID_ARGUMENT);
      CHECK(ctx == nullptr);
      const std::string message = nf4_last_error(nullptr);
      CAPTURE(message);
      const std::string name = backend_name(kind);
      CHECK(contains(message, name + " device " + std::to_string(index) + " does not exist"));
      CHECK(contains(message, "has " + std::to_string(count) + " device"));
      nf4_device_info info = NF4_DEVICE_INFO_INIT;
      CHECK(nf4_device_get_info(kind, index, &info) == NF4_ERR_INVALID_ARGUMENT);
      CHECK(contains(nf4_last_error(nullptr), name + " device " + std::to_string(index) + " does not exist"));
    }
  }
  nf4_context* ctx = nullptr;
  CHECK(nf4_context_create_on_device(static_cast<nf4_backend_kind>(77), 0, nullptr, &ctx) == NF4_ERR_UNKNOWN_BACKEND);
  CHECK(nf4_device_count(static_cast<nf4_backend_kind>(77)) == 0);
  CHECK(nf4_context_create_on_device(NF4_BACKEND_CPU, 0, nullptr, nullptr) == NF4_ERR_NULL_POINTER);
  CHECK(nf4_context_device_index(nullptr) == -1);
}

TEST_CASE("devices: nf4_device_info is versioned by struct_size, and the options reach a context on a device") {
  nf4_device_info info = NF4_DEVICE_INFO_INIT;
  CHECK(nf4_device_get_info(NF4_BACKEND_CPU, 0, nullptr) == NF4_ERR_NULL_POINTER);
  for (const std::uint32_t size : {0u, 8u, 63u, 4097u}) {
    info.struct_size = size;
    CHECK(nf4_device_get_info(NF4_BACKEND_CPU, 0, &info) == NF4_ERR_INVALID_ARGUMENT);
    CHECK(contains(nf4_last_error(nullptr), "struct_size is " + std::to_string(size)));
  }
  // A newer header's larger struct: the fields this library knows, and zeros past them.
  struct Larger {
    nf4_device_info known;
    std::uint8_t newer[40];
  } larger;
  std::memset(&larger, 0xEE, sizeof larger);
  larger.known.struct_size = sizeof larger;
  REQUIRE(nf4_device_get_info(NF4_BACKEND_CPU, 0, &larger.known) == NF4_OK);
  CHECK(larger.known.struct_size == sizeof larger);
  CHECK(larger.known.backend == NF4_BACKEND_CPU);
  CHECK(std::all_of(std::begin(larger.newer), std::end(larger.newer), [](std::uint8_t v) { return v == 0; }));

  // AUTO is the backend nf4_context_create(NF4_BACKEND_AUTO) takes.
  Context automatic(NF4_BACKEND_AUTO);
  CHECK(nf4_device_count(NF4_BACKEND_AUTO) == nf4_device_count(automatic.backend()));
  CHECK(device_info(NF4_BACKEND_AUTO, 0).backend == automatic.backend());

  nf4_context_options options = NF4_CONTEXT_OPTIONS_INIT;
  options.cpu_threads = 3;
  nf4_context* ctx = nullptr;
  REQUIRE(nf4_context_create_on_device(NF4_BACKEND_CPU, 0, &options, &ctx) == NF4_OK);
  CHECK(context_backend(ctx).host_threads() == 3);
  nf4_context_destroy(ctx);
  options.cpu_threads = -1;
  CHECK(nf4_context_create_on_device(NF4_BACKEND_CPU, 0, &options, &ctx) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(ctx == nullptr);
}

TEST_CASE("devices: a context made without a device keeps the backend's default one") {
  for (nf4_backend_kind kind : test::available_backends()) {
    Context ctx(kind);
    const std::int32_t index = nf4_context_device_index(ctx.get());
    CAPTURE(backend_name(kind));
    if (!context_backend(ctx.get()).device_index()) {
      CHECK(index == -1);  // cuda: the calling thread's current device, at each call
      continue;
    }
    REQUIRE(index >= 0);
    REQUIRE(static_cast<std::size_t>(index) < nf4_device_count(kind));
    CHECK(contains(device_info(kind, static_cast<std::size_t>(index)).description, ctx.device_name()));
    CHECK(ctx.device_index() == index);
  }
}

TEST_CASE("devices: a vulkan context on a chosen device ignores NF4_VULKAN_DEVICE") {
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  const test::ScopedEnv bogus("NF4_VULKAN_DEVICE", "no such device anywhere");
  nf4_context* ctx = nullptr;
  CHECK(nf4_context_create(NF4_BACKEND_VULKAN, &ctx) == NF4_ERR_BACKEND_UNAVAILABLE);
  for (std::size_t i = 0; i < nf4_device_count(NF4_BACKEND_VULKAN); ++i) {
    REQUIRE_MESSAGE(nf4_context_create_on_device(NF4_BACKEND_VULKAN, i, nullptr, &ctx) == NF4_OK, nf4_last_error(nullptr));
    CHECK(nf4_context_device_index(ctx) == static_cast<std::int32_t>(i));
    nf4_context_destroy(ctx);
  }
}

TEST_CASE("devices: a context per device of a backend, each from its own thread at once, bit for bit as the oracle") {
  const char* required = std::getenv("NF4_TEST_REQUIRE_DEVICES");
  const std::size_t want = required ? static_cast<std::size_t>(std::strtoul(required, nullptr, 10)) : 0;
  std::size_t most = 0;
  for (nf4_backend_kind kind : test::available_backends()) {
    const std::string name = backend_name(kind);
    const std::size_t count = nf4_device_count(kind);
    most = std::max(most, count);
    // A backend with one device still runs two contexts on it at once (the per-context path).
    if (count < 2) MESSAGE(name << ": " << count << " device, so two contexts on it: the two-device case needs 2 devices");
    const std::size_t contexts_wanted = std::max<std::size_t>(count, 2);
    std::vector<nf4_context*> contexts(contexts_wanted, nullptr);
    for (std::size_t i = 0; i < contexts_wanted; ++i)
      REQUIRE_MESSAGE(nf4_context_create_on_device(kind, i % count, nullptr, &contexts[i]) == NF4_OK, nf4_last_error(nullptr));
    std::vector<int> wrong(contexts_wanted, -1);
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < contexts_wanted; ++i)
      threads.emplace_back([&, i] { wrong[i] = run_against_oracle(contexts[i], 100 + i, 3); });
    for (std::thread& t : threads) t.join();
    for (std::size_t i = 0; i < contexts_wanted; ++i) {
      const std::string device = nf4_context_device_name(contexts[i]);
      CHECK_MESSAGE(wrong[i] == 0, name << " device " << i % count << " (" << device << "): " << wrong[i] << " results differ from the oracle");
      if (wrong[i] == 0) MESSAGE(name << " device " << i % count << " (" << device << "): every result the oracle's");
      nf4_context_destroy(contexts[i]);
    }
  }
  if (want > 0) CHECK_MESSAGE(most >= want, "NF4_TEST_REQUIRE_DEVICES=" << want << " but no backend has that many devices here");
}
