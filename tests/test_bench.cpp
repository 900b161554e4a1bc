// SPDX-License-Identifier: MIT
// The bench runners behind `nf4 bench` (bench/): the one timing-mode parser, the weights it times,
// and every backend's runner (nf4_bench) timing copies and dequantizations on buffers of its own. Iterates the registry: a backend added later
// is timed here as soon as it has a runner.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/timing.h"
#include "bench/weights.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "tests/support/common.h"
#include "tests/support/env.h"
#if defined(NF4_HAVE_VULKAN)
#include "backends/vulkan/vk_kernels.h"
#endif

using namespace nf4;

TEST_CASE("bench: NF4_BENCH_TIMING names one of batch, graph, events") {
  CHECK(bench::parse_timing("") == bench::Timing::kBatch);
  CHECK(bench::parse_timing("batch") == bench::Timing::kBatch);
  CHECK(bench::parse_timing("graph") == bench::Timing::kGraph);
  CHECK(bench::parse_timing("events") == bench::Timing::kEvents);
  try {
    bench::parse_timing("stream");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.status() == NF4_ERR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()) == "NF4_BENCH_TIMING='stream': expected batch, graph or events");
  }
  test::ScopedEnv env("NF4_BENCH_TIMING", "events");
  CHECK(bench::timing_from_env() == bench::Timing::kEvents);
}

TEST_CASE("bench: the timed weights are valid and dequantize to normal numbers, odd sizes included") {
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{63}, std::int64_t{64} * 256 + 3}) {
    const bench::BenchWeight w = bench::make_bench_weight(n, 64, 7);
    std::vector<float> out(static_cast<std::size_t>(n));
    nf4_tensor t = w.describe(NF4_DTYPE_F32);
    t.out = out.data();
    t.out_bytes = n * 4;
    auto backend = create_backend(NF4_BACKEND_CPU);
    backend->dequantize_host(validate_call(&t, 1));
    for (const float v : out) CHECK((v == 0.0f || std::isnormal(v)));
  }
  for (const float x : bench::bench_values(1000, 3)) CHECK((x >= -1.0f && x < 1.0f));
}

TEST_CASE("bench: every available backend's runner times copies and dequantizations") {
  for (const RegisteredBackend& b : registry()) {
    if (!test::backend_ready(b.entry.kind)) continue;
    auto backend = create_backend(b.entry.kind);
    const auto r = bench::make_bench_runner(*backend);
    REQUIRE_MESSAGE(r != nullptr, b.entry.name << " has no runner");
    CHECK(r->cache_bytes() > 0);
    const double copy = r->time_copy_us(std::int64_t{1} << 20, 2, 5);
    const auto w = test::random_weight(1 << 16, NF4_QUANT_NF4, 64, true, 31);
    const nf4_tensor ts[] = {w.describe(NF4_DTYPE_F16, nullptr, 0), w.describe(NF4_DTYPE_BF16, nullptr, 0)};
    const double us = r->time_dequantize_us(ts, 2, 2, 5);
    CHECK(copy > 0.0);
    CHECK(us > 0.0);
    MESSAGE(b.entry.name << ": 1 MiB copy " << copy << " us; 2 x 64Ki-element dequantization " << us << " us");
  }
}

TEST_CASE("cuda: the benchmark runner times copies and dequantizations") {
  if (!test::backend_ready(NF4_BACKEND_CUDA)) return;
  auto backend = create_backend(NF4_BACKEND_CUDA);
  const auto r = bench::make_bench_runner(*backend);
  REQUIRE(r != nullptr);
  CHECK(r->cache_bytes() > 0);
  const double copy = r->time_copy_us(std::int64_t{8} << 20, 2, 5);
  CHECK(copy > 0.0);
  const auto w = test::random_weight(1 << 20, NF4_QUANT_NF4, 64, true, 9);
  const nf4_tensor ts[] = {w.describe(NF4_DTYPE_BF16, nullptr, 0), w.describe(NF4_DTYPE_BF16, nullptr, 0)};
  const double us = r->time_dequantize_us(ts, 2, 2, 5);
  CHECK(us > 0.0);
  MESSAGE("8 MiB copy " << copy << " us; 2 x 1Mi-element dequantization " << us << " us");
}

TEST_CASE("vulkan: the benchmark runner times copies and dequantizations, batched and per dispatch") {
  if (!test::backend_ready(NF4_BACKEND_VULKAN)) return;
  for (const char* timing : {"batch", "events"}) {
    test::ScopedEnv env("NF4_BENCH_TIMING", timing);
    auto backend = create_backend(NF4_BACKEND_VULKAN);
    const auto r = bench::make_bench_runner(*backend);
    REQUIRE(r != nullptr);
    const double copy = r->time_copy_us(std::int64_t{1} << 20, 2, 8);
    const auto w = test::random_weight(1 << 16, NF4_QUANT_NF4, 64, true, 31);
    const nf4_tensor ts[] = {w.describe(NF4_DTYPE_F16, nullptr, 0), w.describe(NF4_DTYPE_BF16, nullptr, 0)};
    const double us = r->time_dequantize_us(ts, 2, 2, 8);
    CHECK(copy > 0.0);
    CHECK(us > 0.0);
    MESSAGE(std::string(timing) << ": 1 MiB copy " << copy << " us; 2 x 64Ki-element dequantization " << us << " us");
  }
#if defined(NF4_HAVE_VULKAN)
  CHECK(vk::validation_message_count() == 0);
#endif
}
