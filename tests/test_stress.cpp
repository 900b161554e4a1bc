// SPDX-License-Identifier: MIT
// Concurrency stress (docs/RELIABILITY.md): on every available backend, 8 threads dequantize
// random small tensors, first each thread with its own context (created inside the thread, except
// under Vulkan's validation layer: see vulkan_layer_races), then all sharing one context. Every
// result must be bit-identical to the oracle, every deliberately bad call must fail with the
// calling thread's own message (last error is per thread), and a failed call must write nothing.
// Runs under ThreadSanitizer in .ci/tsan.sh.
//
// NF4_STRESS_ITERS = dequantizations per thread per mode (default 1000, see stress_iters; raise it
// for long runs). NF4_STRESS_BACKENDS = a list of backend names to restrict the run to.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "core/env.h"
#include "nf4/nf4.h"
#include "tests/support/common.h"

using namespace nf4;

namespace {

constexpr int kThreads = 8;

// Per thread and mode. A software Vulkan device (lavapipe, in CI) takes milliseconds per call on
// two cores, so it gets 1000 calls per mode in all instead of 1000 per thread.
int stress_iters(nf4_backend_kind kind) {
  const char* env = std::getenv("NF4_STRESS_ITERS");
  if (const int n = env ? std::atoi(env) : 0; n > 0) return n;
  if (find_backend(kind)->device_or_reason.find("llvmpipe") != std::string::npos) return 1000 / kThreads;
  return 1000;
}

// A weight with its oracle outputs for each dtype, computed once up front.
struct Entry {
  cpu::QuantizedWeight w;
  std::vector<std::uint8_t> expected[3];
};

const std::vector<Entry>& pool() {
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> out;
    std::mt19937_64 rng(20240611);
    const int blocksizes[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
    for (int i = 0; i < 48; ++i) {
      // Mostly small and odd sizes; one tensor past the cpu backend's 1 Mi-element chunk, so its
      // worker threads run inside the stress threads too.
      const std::int64_t n = i == 0 ? (std::int64_t{1} << 20) + 4097 : 1 + static_cast<std::int64_t>(rng() % (i % 4 == 0 ? 40000 : 3000));
      Entry e;
      e.w = test::random_weight(n, rng() % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, blocksizes[rng() % 8], rng() % 2 == 0, rng());
      for (nf4_dtype d : test::kDTypes) {
        auto& buf = e.expected[d];
        buf.assign(n * nf4_dtype_size(d), 0);
        cpu::oracle_dequantize(e.w.describe(d, buf.data(), static_cast<std::int64_t>(buf.size())));
      }
      out.push_back(std::move(e));
    }
    return out;
  }();
  return entries;
}

struct Tally {
  std::atomic<long> calls{0}, mismatches{0}, bad_status{0}, wrong_message{0}, wrote_on_failure{0};
  std::mutex first_problem_mutex;
  std::string first_problem;
  void problem(const std::string& what) {
    std::lock_guard lock(first_problem_mutex);
    if (first_problem.empty()) first_problem = what;
  }
};

// One thread's work on `ctx`: single calls, grouped calls, and calls that must fail.
void work(nf4_context* ctx, int thread, int iters, Tally& tally) {
  const auto& p = pool();
  std::mt19937_64 rng(1000 + thread);
  std::vector<std::uint8_t> out[3];
  for (int i = 0; i < iters; ++i) {
    const int kind = static_cast<int>(rng() % 16);
    const std::size_t count = kind == 1 ? 2 + rng() % 2 : 1;
    std::size_t idx[3];
    nf4_dtype dt[3];
    nf4_tensor ts[3];
    for (std::size_t k = 0; k < count; ++k) {
      // The big tensor only rarely: it costs as much as a few hundred small ones.
      do idx[k] = rng() % p.size();
      while (idx[k] == 0 && rng() % 64 != 0);
      dt[k] = static_cast<nf4_dtype>(rng() % 3);
      const auto& e = p[idx[k]];
      out[k].assign(e.expected[dt[k]].size() + 8, static_cast<std::uint8_t>(0xA0 + thread));
      ts[k] = e.w.describe(dt[k], out[k].data(), static_cast<std::int64_t>(e.expected[dt[k]].size()));
    }
    if (kind == 0) {
      // Must fail: a per-thread, per-iteration out_bytes that the message has to quote back.
      const std::int64_t marker = -(std::int64_t{thread} * 1000000 + i) - 1;
      ts[0].out_bytes = marker;
      const nf4_status s = nf4_dequantize_host(ctx, &ts[0]);
      tally.calls++;
      if (s != NF4_ERR_OUTPUT_TOO_SMALL) {
        tally.bad_status++;
        tally.problem("bad call returned " + std::to_string(s));
      } else if (std::string(nf4_last_error(ctx)).find("got " + std::to_string(marker)) == std::string::npos) {
        tally.wrong_message++;
        tally.problem("thread " + std::to_string(thread) + " read another message: " + nf4_last_error(ctx));
      }
      for (auto b : out[0])
        if (b != static_cast<std::uint8_t>(0xA0 + thread)) {
          tally.wrote_on_failure++;
          break;
        }
      // Context-free failures keep their message per thread too.
      nf4_tensor bad = ts[0];
      bad.blocksize = 33 + thread;
      if (nf4_validate(&bad) != NF4_ERR_BLOCKSIZE ||
          std::string(nf4_last_error(nullptr)).find("got " + std::to_string(33 + thread)) == std::string::npos) {
        tally.wrong_message++;
        tally.problem("nf4_last_error(NULL) of thread " + std::to_string(thread) + ": " + nf4_last_error(nullptr));
      }
      continue;
    }
    const nf4_status s = count == 1 ? nf4_dequantize_host(ctx, ts) : nf4_dequantize_grouped_host(ctx, ts, count);
    tally.calls++;
    if (s != NF4_OK) {
      tally.bad_status++;
      tally.problem(std::string("call failed: ") + nf4_last_error(ctx));
      continue;
    }
    for (std::size_t k = 0; k < count; ++k) {
      const auto& exp = p[idx[k]].expected[dt[k]];
      bool tail_ok = true;
      for (std::size_t b = exp.size(); b < out[k].size(); ++b) tail_ok = tail_ok && out[k][b] == static_cast<std::uint8_t>(0xA0 + thread);
      if (std::memcmp(out[k].data(), exp.data(), exp.size()) != 0 || !tail_ok) {
        tally.mismatches++;
        tally.problem("mismatch: thread " + std::to_string(thread) + " tensor " + std::to_string(idx[k]) + " dtype " +
                      std::to_string(dt[k]) + " numel " + std::to_string(p[idx[k]].w.numel));
      }
    }
  }
}

std::vector<nf4_backend_kind> available_backends() {
  std::vector<nf4_backend_kind> kinds;
  for (std::size_t i = 0; i < nf4_backend_count(); ++i) {
    nf4_backend_info info{};
    if (nf4_backend_get_info(i, &info) != NF4_OK) continue;
    // NF4_STRESS_BACKENDS=cpu restricts the run (the TSan job: GPU drivers are not instrumented).
    if (const char* only = std::getenv("NF4_STRESS_BACKENDS"); only && std::string(only).find(info.name) == std::string::npos) {
      MESSAGE("backend '" << std::string(info.name) << "' skipped: not in NF4_STRESS_BACKENDS=" << std::string(only));
      continue;
    }
    if (info.available) kinds.push_back(info.kind);
    else MESSAGE("backend '" << std::string(info.name) << "' skipped: " << std::string(info.device_name));
  }
  return kinds;
}

void report(const char* mode, nf4_backend_kind kind, const Tally& t, long expected_calls) {
  MESSAGE(std::string(mode) << " on " << std::string(backend_name(kind)) << ": " << t.calls.load() << " calls by " << kThreads << " threads");
  CHECK_MESSAGE(t.first_problem.empty(), t.first_problem);
  CHECK(t.calls.load() == expected_calls);
  CHECK(t.mismatches.load() == 0);
  CHECK(t.bad_status.load() == 0);
  CHECK(t.wrong_message.load() == 0);
  CHECK(t.wrote_on_failure.load() == 0);
}

}  // namespace

// Whether this process's Vulkan contexts run under VK_LAYER_KHRONOS_validation, which the test
// binary turns on (tests/support/vulkan.h) and whose dispatch data has a race of its own: Debian
// 12's layer (1.3.239) keeps every instance's and device's data in one process-wide map that
// vkCreateDevice and vkDestroyDevice change without a lock while every other thread's Vulkan call
// reads it (KhronosGroup/Vulkan-ValidationLayers#4391). A plain Vulkan program without nf4 (two
// threads making and destroying devices, six calling on their own) crashes inside the layer in
// most one-minute runs with the layer on and never without it (docs/RELIABILITY.md section 2).
// NF4_VULKAN_VALIDATION is read by the backend's rule (env_enabled).
bool vulkan_layer_races(nf4_backend_kind kind) { return kind == NF4_BACKEND_VULKAN && env_enabled(EnvVar::kVulkanValidation); }

TEST_CASE("stress: 8 threads, each with its own context, every result equal to the oracle") {
  pool();  // built before the threads start
  for (nf4_backend_kind kind : available_backends()) {
    const int iters = stress_iters(kind);
    Tally tally;
    std::atomic<int> create_failures{0};
    // Contexts are created and destroyed inside the threads, concurrently with the others' work;
    // under the racing validation layer they are made before the threads start and destroyed
    // after they end (the work on them still runs at once).
    const bool outside = vulkan_layer_races(kind);
    std::vector<nf4_context*> made(kThreads, nullptr);
    if (outside)
      for (nf4_context*& ctx : made)
        if (nf4_context_create(kind, &ctx) != NF4_OK) create_failures++;
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th)
      threads.emplace_back([&, th] {
        nf4_context* ctx = made[th];
        if (!outside && nf4_context_create(kind, &ctx) != NF4_OK) {
          create_failures++;
          return;
        }
        if (!ctx) return;
        work(ctx, th, iters, tally);
        if (!outside) nf4_context_destroy(ctx);
      });
    for (auto& t : threads) t.join();
    for (nf4_context* ctx : made)
      if (ctx) nf4_context_destroy(ctx);
    CHECK(create_failures.load() == 0);
    report("own contexts", kind, tally, static_cast<long>(kThreads) * iters);
  }
}

TEST_CASE("stress: 8 threads sharing one context, every result equal to the oracle") {
  pool();
  for (nf4_backend_kind kind : available_backends()) {
    const int iters = stress_iters(kind);
    nf4_context* ctx = nullptr;
    REQUIRE(nf4_context_create(kind, &ctx) == NF4_OK);
    Tally tally;
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) threads.emplace_back([&, th] { work(ctx, th, iters, tally); });
    for (auto& t : threads) t.join();
    nf4_context_destroy(ctx);
    report("shared context", kind, tally, static_cast<long>(kThreads) * iters);
  }
}
