// SPDX-License-Identifier: MIT
// nf4_bench: the measuring side of nf4, built for the `nf4` CLI's `bench` command, the tests and
// the lab (lab/: nf4_lab, the CUDA tuner), never part of the shipped library (libnf4). A runner times one backend's
// operations on buffers it owns; each backend that offers one adds a line to bench/bench.cpp.
// Runners may use their backend's internal headers (to launch a kernel with a given
// configuration) and reach a live backend only through Backend::extension<T>().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/backend.h"
#include "nf4/nf4.h"

namespace nf4::bench {

// Times are medians in microseconds of `iters` runs after warm-up, measured with device timers
// (CUDA events, Vulkan timestamps; the mode is bench/timing.h's) or, on the CPU, a steady clock.
class BenchRunner {
 public:
  virtual ~BenchRunner() = default;
  // Device-to-device copy of `bytes`, rotating among `rotations` source/destination pairs.
  virtual double time_copy_us(std::int64_t bytes, int rotations, int iters) = 0;
  // Uploads `rotations` copies of the tensors (host pointers; out/out_bytes are ignored, the runner
  // allocates outputs) and times one grouped dequantization of all `count` tensors per iteration,
  // cycling through the copies. Returns the median.
  virtual double time_dequantize_us(const nf4_tensor* host_tensors, std::size_t count, int rotations, int iters) = 0;
  // Largest cache in bytes a rotation must defeat (last-level cache / L2).
  virtual std::int64_t cache_bytes() const = 0;
  // (optional) Uploads `rotations` copies of the weight and x (host pointers; y is the runner's)
  // and returns the median time of one product; < 0 where not offered.
  virtual double time_gemv_us(const nf4_gemv_desc& /*host*/, int /*rotations*/, int /*iters*/) { return -1.0; }
};

// One line per backend that has a runner (bench/bench.cpp).
struct BenchEntry {
  nf4_backend_kind kind;
  std::unique_ptr<BenchRunner> (*create)(Backend& backend);  // the backend outlives the runner
};

// The runner of `backend`, or nullptr where its kind has none.
std::unique_ptr<BenchRunner> make_bench_runner(Backend& backend);

// The runners, one factory per backend (bench/<backend>...).
std::unique_ptr<BenchRunner> make_cpu_runner(Backend& backend);
#if defined(NF4_HAVE_CUDA)
std::unique_ptr<BenchRunner> make_cuda_runner(Backend& backend);
#endif
#if defined(NF4_HAVE_VULKAN)
std::unique_ptr<BenchRunner> make_vulkan_runner(Backend& backend);
#endif

}  // namespace nf4::bench
