// SPDX-License-Identifier: MIT
// The cpu backend: the oracle, spread over the host's cores by the dispatch plan's chunks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "core/bench_util.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/plan.h"

namespace nf4::cpu {
namespace {

// Chunks of 1 Mi elements; all chunks of a call form one "dispatch" that worker threads share.
PlanParams cpu_plan_params() {
  PlanParams p;
  p.elements_per_item = 2;
  p.items_per_group = 1 << 19;
  p.max_elements_per_chunk = std::int64_t{1} << 20;
  p.max_chunks_per_dispatch = static_cast<std::size_t>(-1);
  return p;
}

void run_plan(const nf4_tensor* tensors, const Plan& plan) {
  for (const Dispatch& d : plan.dispatches) {
    const unsigned workers = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), d.chunks.size());
    if (workers <= 1) {
      for (const Chunk& c : d.chunks) oracle_dequantize_range(tensors[c.tensor], c.first_element, c.element_count);
      continue;
    }
    std::atomic<std::size_t> next{0};
    const auto work = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < d.chunks.size();) {
        const Chunk& c = d.chunks[i];
        oracle_dequantize_range(tensors[c.tensor], c.first_element, c.element_count);
      }
    };
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  }
}

class CpuBench final : public BenchRunner {
 public:
  double time_copy_us(std::int64_t bytes, int rotations, int iters) override {
    std::vector<std::vector<std::uint8_t>> src(rotations, std::vector<std::uint8_t>(bytes, 1)), dst(rotations, std::vector<std::uint8_t>(bytes));
    return median_us(iters, [&](int i) { std::memcpy(dst[i % rotations].data(), src[i % rotations].data(), bytes); });
  }

  double time_dequantize_us(const nf4_tensor* host, std::size_t count, int rotations, int iters) override {
    std::vector<HostTensorCopy> copies;
    for (int r = 0; r < rotations; ++r) copies.emplace_back(host, count);
    const Plan plan = make_plan(copies[0].tensors.data(), count, cpu_plan_params());
    return median_us(iters, [&](int i) { run_plan(copies[i % rotations].tensors.data(), plan); });
  }

  std::int64_t cache_bytes() const override {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::int64_t kib = 0;
    if (f >> kib) return kib * 1024;
    return std::int64_t{32} << 20;
  }

 private:
  template <typename F>
  static double median_us(int iters, F&& f) {
    f(0);  // warm-up
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      const auto a = std::chrono::steady_clock::now();
      f(i);
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
    }
    return median(t);
  }
};

class CpuBackend final : public Backend {
 public:
  nf4_backend_kind kind() const override { return NF4_BACKEND_CPU; }
  std::string device_name() const override { return host_cpu_name(); }
  void dequantize(const nf4_tensor* tensors, std::size_t count) override { dequantize_host(tensors, count); }
  void dequantize_host(const nf4_tensor* tensors, std::size_t count) override {
    run_plan(tensors, make_plan(tensors, count, cpu_plan_params()));
  }
  BenchRunner* bench_runner() override { return &bench_; }

  // The product: the oracle, rows spread over the host's cores.
  void gemv(const nf4_gemv_desc& g) override { gemv_host(g); }
  void gemv_host(const nf4_gemv_desc& g) override {
    validate_gemv(g);
    const std::int64_t per = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / g.k);  // rows per piece: ~1 Mi weights
    const std::int64_t pieces = ceil_div(g.n, per);
    const unsigned workers = static_cast<unsigned>(std::min<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()), pieces));
    std::atomic<std::int64_t> next{0};
    const auto work = [&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < pieces;) oracle_gemv_rows(g, i * per, std::min(per, g.n - i * per));
    };
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  }

  static std::string host_cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) return line.substr(std::min(line.size(), colon + 2));
      }
    return "host CPU";
  }

 private:
  CpuBench bench_;
};

}  // namespace
}  // namespace nf4::cpu

nf4::BackendEntry nf4::cpu_backend_entry() {
  return BackendEntry{"cpu", NF4_BACKEND_CPU, 10,
                      [](std::string* device) {
                        *device = cpu::CpuBackend::host_cpu_name() + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
                        return true;
                      },
                      [] { return std::unique_ptr<Backend>(new cpu::CpuBackend()); }};
}
