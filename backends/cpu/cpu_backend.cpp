// SPDX-License-Identifier: MIT
// The cpu backend: the oracle, spread over the host's cores by the dispatch plan's chunks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "core/bench_util.h"
#include "core/error.h"
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

// tensor(i) returns the description of the plan's tensor i.
template <typename TensorAt>
void run_plan(const Plan& plan, const TensorAt& tensor) {
  for (const Dispatch& d : plan.dispatches) {
    const unsigned workers = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), d.chunks.size());
    if (workers <= 1) {
      for (const Chunk& c : d.chunks) oracle_dequantize_range(tensor(c.tensor), c.first_element, c.element_count);
      continue;
    }
    std::atomic<std::size_t> next{0};
    const auto work = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < d.chunks.size();) {
        const Chunk& c = d.chunks[i];
        oracle_dequantize_range(tensor(c.tensor), c.first_element, c.element_count);
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
    std::vector<std::int64_t> numels;
    for (std::size_t i = 0; i < count; ++i) numels.push_back(host[i].numel);
    const Plan plan = make_plan(numels, cpu_plan_params());
    return median_us(iters, [&](int i) { run_plan(plan, [&](std::size_t t) -> const nf4_tensor& { return copies[i % rotations].tensors[t]; }); });
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
  void dequantize(std::span<const ValidTensor> tensors) override { dequantize_host(tensors); }
  void dequantize_host(std::span<const ValidTensor> tensors) override {
    run_plan(make_plan(tensors, cpu_plan_params()), [&](std::size_t i) -> const nf4_tensor& { return tensors[i].t; });
  }
  std::unique_ptr<PreparedLaunch> prepare(std::span<const ValidTensor> tensors) override;
  BenchRunner* bench_runner() override { return &bench_; }

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

// Host memory, run on the calling thread (and the workers): the plan is kept, the addresses are
// substituted per launch.
class CpuPrepared final : public PreparedLaunch {
 public:
  explicit CpuPrepared(std::span<const ValidTensor> tensors)
      : tensors_(tensors.begin(), tensors.end()), plan_(make_plan(tensors, cpu_plan_params())) {}
  void launch(void* const* outs, const nf4_buffers* buffers, void* stream) const override {
    if (stream) fail(NF4_ERR_INVALID_ARGUMENT, "the cpu backend has no streams: pass NULL");
    run_plan(plan_, [&](std::size_t i) { return with_buffers(tensors_[i], i, outs, buffers); });
  }

 private:
  std::vector<ValidTensor> tensors_;
  Plan plan_;
};

std::unique_ptr<PreparedLaunch> CpuBackend::prepare(std::span<const ValidTensor> tensors) { return std::make_unique<CpuPrepared>(tensors); }

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
