// SPDX-License-Identifier: MIT
// The cpu runner: a steady clock around each call. Dequantization goes through the backend's
// prepared launch (planned once, run on the backend's thread pool), as nf4_prepared_launch does.
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "bench/bench.h"
#include "bench/util.h"
#include "core/tensor.h"

namespace nf4::bench {
namespace {

class CpuRunner final : public BenchRunner {
 public:
  explicit CpuRunner(Backend& backend) : backend_(backend) {}

  double time_copy_us(std::int64_t bytes, int rotations, int iters) override {
    std::vector<std::vector<std::uint8_t>> src(rotations, std::vector<std::uint8_t>(bytes, 1)), dst(rotations, std::vector<std::uint8_t>(bytes));
    return median_us(iters, [&](int i) { std::memcpy(dst[i % rotations].data(), src[i % rotations].data(), bytes); });
  }

  double time_dequantize_us(const nf4_tensor* host, std::size_t count, int rotations, int iters) override {
    std::vector<HostTensorCopy> copies;
    std::vector<std::unique_ptr<PreparedLaunch>> launches;
    for (int r = 0; r < rotations; ++r) {
      copies.emplace_back(host, count);
      launches.push_back(backend_.prepare(validate_call(copies.back().tensors.data(), count)));
    }
    return median_us(iters, [&](int i) { launches[i % rotations]->launch(nullptr, nullptr, nullptr); });
  }

  std::int64_t cache_bytes() const override {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::int64_t kib = 0;
    if (f >> kib) return kib * 1024;
    return std::int64_t{32} << 20;
  }

 private:
  Backend& backend_;

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

}  // namespace

std::unique_ptr<BenchRunner> make_cpu_runner(Backend& backend) { return std::make_unique<CpuRunner>(backend); }

}  // namespace nf4::bench
