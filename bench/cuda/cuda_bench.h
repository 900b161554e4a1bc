// SPDX-License-Identifier: MIT
// The cuda runner's timing, shared with the tuner (lab/cuda_tune.cu). Plain C++.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

#include "backends/cuda/cuda_backend.h"
#include "bench/timing.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

// What each mode of bench/timing.h means here. In every mode two untimed warm-up runs come
// first, and run(i) must enqueue on `stream` only.
//   batch : K = clamp(iters, 8, 32) launches back to back between two events, repeated (at least
//           5 times); time per launch = span / K; median over the repeats. Everything is enqueued
//           behind a short spin kernel, so the GPU runs the launches back to back whatever the
//           host's launch rate. What a model pays per kernel when kernels run back to back; the
//           cost of an event pair around every call (about 3.3 us around an empty kernel on an
//           H200) stays out. The copy ceiling is measured the same way.
//   graph : the K launches captured in a CUDA graph and replayed (docs/DESIGN.md section 4,
//           mode (d)). A captured cudaMemcpyAsync becomes a
//           copy node that is much slower than the stream copy (2.7 vs 4.2 TB/s measured), so the
//           copy ceiling is not comparable in this mode.
//   events: an event pair around each run(i), i = 0..iters-1, enqueued behind the spin kernel;
//           median over iterations (per-call timing, as triton.testing.do_bench does).
const char* timing_name(bench::Timing t);
double time_median_us(cudaStream_t stream, int iters, const std::function<void(int)>& run,
                      bench::Timing timing = bench::timing_from_env());

// A non-blocking stream owned by the caller's scope.
class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Median time of one product, rotating over `rotations` device copies.
double time_gemv_us(const nf4_gemv_desc& host, int rotations, int iters, const DeviceInfo& device);

}  // namespace nf4::cuda
