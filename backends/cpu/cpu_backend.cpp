// SPDX-License-Identifier: MIT
// The cpu backend: the oracle's arithmetic on the widest vector unit the CPU has
// (backends/cpu/cpu_kernels.h), spread over a persistent per-context thread pool by the dispatch
// plan's chunks.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>
#include <unistd.h>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cpu/gemv_oracle.h"
#include "backends/cpu/oracle.h"
#include "core/backend.h"
#include "core/env.h"
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

// Precedence: the context option, then NF4_CPU_THREADS, then every hardware thread.
unsigned resolve_threads(int option) {
  if (option > 0) return static_cast<unsigned>(option);
  if (const char* env = env_value(EnvVar::kCpuThreads); env && *env) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(env, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > kMaxCpuThreads)
      fail(NF4_ERR_INVALID_ARGUMENT, "NF4_CPU_THREADS='{}' is not a thread count from 1 to {}", env, kMaxCpuThreads);
    return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

// tensor(i) returns the description of the plan's tensor i.
template <typename TensorAt>
void run_plan(ThreadPool& pool, const Plan& plan, const TensorAt& tensor) {
  const Isa isa = best_isa();
  for (const Dispatch& d : plan.dispatches)
    pool.run(d.chunks.size(), [&](std::size_t i) {
      const Chunk& c = d.chunks[i];
      dequantize_range(isa, tensor(c.tensor), c.first_element, c.element_count);
    });
}

// A valid product on `pool`: pieces of about 1 Mi weights (whole rows), each the oracle's.
void run_gemv(ThreadPool& pool, const nf4_gemv_desc& g) {
  const std::int64_t per = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / g.k);
  const std::int64_t pieces = ceil_div(g.n, per);
  pool.run(static_cast<std::size_t>(pieces), [&](std::size_t i) {
    const std::int64_t first = static_cast<std::int64_t>(i) * per;
    oracle_gemv_rows(g, first, std::min(per, g.n - first));
  });
}

constexpr BackendCaps kCpuCaps{.device_pointers = true, .device_pointers_are_host = true, .prepared_launch = true, .prepared_gemv = true,
                                .gemv_fast = GemvFastSupport::whenever};

class CpuBackend final : public Backend {
 public:
  nf4_backend_kind kind() const override { return NF4_BACKEND_CPU; }
  std::string device_name() const override { return host_cpu_name(); }
  std::optional<std::size_t> device_index() const override { return 0; }  // the host is the one device
  BackendCaps capabilities() const override { return kCpuCaps; }
  void dequantize(std::span<const ValidTensor> tensors) override { dequantize_host(tensors); }
  void dequantize_host(std::span<const ValidTensor> tensors) override {
    run_plan(pool(), make_plan(tensors, cpu_plan_params()), [&](std::size_t i) -> const nf4_tensor& { return tensors[i].t; });
  }
  std::unique_ptr<PreparedLaunch> prepare(std::span<const ValidTensor> tensors) override;
  void configure(const BackendOptions& options) override { pool_ = std::make_unique<ThreadPool>(resolve_threads(options.cpu_threads)); }
  unsigned host_threads() const override { return pool_ ? pool_->size() : 0; }

  // The product: the oracle, rows spread over the context's pool.
  void gemv(const ValidGemv& g) override { gemv_host(g); }
  void gemv_host(const ValidGemv& g) override { run_gemv(pool(), g.desc); }
  std::unique_ptr<PreparedGemv> prepare_gemv(const ValidGemv& g) override;

  static std::string host_cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) return line.substr(std::min(line.size(), colon + 2));
      }
    return "host CPU";
  }
  static std::string host_description() { return host_cpu_name() + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)"; }

 private:
  // Contexts configure the backend at creation; a backend made without a context (tests, tools)
  // gets the defaults on first use.
  ThreadPool& pool() {
    if (!pool_) configure(BackendOptions{});
    return *pool_;
  }

  std::unique_ptr<ThreadPool> pool_;
};

// Host memory, run on the calling thread and the context's pool (launches from several threads
// take turns on it): the plan is kept, the addresses are substituted per launch.
class CpuPrepared final : public PreparedLaunch {
 public:
  CpuPrepared(std::span<const ValidTensor> tensors, ThreadPool& pool)
      : tensors_(tensors.begin(), tensors.end()), plan_(make_plan(tensors, cpu_plan_params())), pool_(pool) {}
  void launch(void* const* outs, const nf4_buffers* buffers, void* stream) const override {
    if (stream) fail(NF4_ERR_INVALID_ARGUMENT, "the cpu backend has no streams: pass NULL");
    run_plan(pool_, plan_, [&](std::size_t i) { return with_buffers(tensors_[i], i, outs, buffers); });
  }

 private:
  std::vector<ValidTensor> tensors_;
  Plan plan_;
  ThreadPool& pool_;
};

// The pool is made here (under the context's mutex) if no call made it yet: launches only use it.
std::unique_ptr<PreparedLaunch> CpuBackend::prepare(std::span<const ValidTensor> tensors) {
  return std::make_unique<CpuPrepared>(tensors, pool());
}

// The product with x and y substituted (the description lives in the nf4_gemv_prepared).
class CpuPreparedGemv final : public PreparedGemv {
 public:
  CpuPreparedGemv(const ValidGemv& g, ThreadPool& pool) : g_(g), pool_(pool) {}
  void launch(const void* x, void* y, void* stream) const override {
    if (stream) fail(NF4_ERR_INVALID_ARGUMENT, "the cpu backend has no streams: pass NULL");
    nf4_gemv_desc g = g_.desc;
    g.x = x;
    g.y = y;
    run_gemv(pool_, g);
  }

 private:
  const ValidGemv& g_;
  ThreadPool& pool_;
};

std::unique_ptr<PreparedGemv> CpuBackend::prepare_gemv(const ValidGemv& g) { return std::make_unique<CpuPreparedGemv>(g, pool()); }

}  // namespace
}  // namespace nf4::cpu

nf4::BackendEntry nf4::cpu_backend_entry() {
  return BackendEntry{"cpu", NF4_BACKEND_CPU, 10,
                      [](std::string* device) {
                        *device = cpu::CpuBackend::host_description();
                        return true;
                      },
                      [] {
                        DeviceDescription d;
                        d.name = cpu::CpuBackend::host_cpu_name();
                        d.description = cpu::CpuBackend::host_description();
                        d.type = NF4_DEVICE_TYPE_CPU;
                        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
                        d.memory_bytes = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
                        d.caps = cpu::kCpuCaps;
                        return std::vector<DeviceDescription>{d};
                      },
                      [](DeviceChoice) { return std::unique_ptr<Backend>(new cpu::CpuBackend()); }};
}
