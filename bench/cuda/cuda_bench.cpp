// SPDX-License-Identifier: MIT
// The cuda runner: device-to-device copies, dequantization and the product on the device this
// backend runs on (DeviceExtension), timed by time_median_us in the mode of bench/timing.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemv_backend.h"
#include "bench/bench.h"
#include "bench/cuda/bench_kernels.h"
#include "bench/cuda/cuda_bench.h"
#include "bench/util.h"
#include "core/error.h"

namespace nf4::cuda {

using bench::median;

const char* timing_name(bench::Timing t) {
  switch (t) {
    case bench::Timing::kBatch: return "batches of back-to-back launches between two events";
    case bench::Timing::kGraph: return "CUDA graph replays";
    case bench::Timing::kEvents: return "an event pair around every call";
  }
  return "?";
}

namespace {

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(std::size_t n) : ev(n, nullptr) {
    for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

struct GraphExec {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphExec() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

std::vector<double> elapsed_us(const Events& e, int pairs, double divide) {
  std::vector<double> t;
  for (int i = 0; i < pairs; ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e.ev[2 * i], e.ev[2 * i + 1]), "cudaEventElapsedTime");
    t.push_back(ms * 1e3 / divide);
  }
  return t;
}

}  // namespace

double time_median_us(cudaStream_t stream, int iters, const std::function<void(int)>& run, bench::Timing timing) {
  iters = std::max(iters, 1);
  run(0);  // warm-up: module load, first touch of the buffers
  run(1);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (timing == bench::Timing::kGraph) {
    const int k = std::clamp(iters, 8, 64);
    const int replays = std::clamp(2 * iters / k, 5, 20);
    GraphExec g;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int i = 0; i < k; ++i) run(i);
    } catch (...) {
      cudaStreamEndCapture(stream, &g.graph);
      throw;
    }
    check(cudaStreamEndCapture(stream, &g.graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&g.exec, g.graph, 0), "cudaGraphInstantiate");
    check(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");  // warm-up replay
    Events e(2 * static_cast<std::size_t>(replays));
    for (int r = 0; r < replays; ++r) {
      check(cudaEventRecord(e.ev[2 * r], stream), "cudaEventRecord");
      check(cudaGraphLaunch(g.exec, stream), "cudaGraphLaunch");
      check(cudaEventRecord(e.ev[2 * r + 1], stream), "cudaEventRecord");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return median(elapsed_us(e, replays, k));
  }
  if (timing == bench::Timing::kBatch) {
    const int k = std::clamp(iters, 8, 32);
    const int reps = std::max(5, iters / k);
    Events e(2 * static_cast<std::size_t>(reps));
    check(launch_spin(stream, 1000.0 + 25.0 * k * reps), "spin kernel");
    for (int r = 0; r < reps; ++r) {
      check(cudaEventRecord(e.ev[2 * r], stream), "cudaEventRecord");
      for (int j = 0; j < k; ++j) run(r * k + j);
      check(cudaEventRecord(e.ev[2 * r + 1], stream), "cudaEventRecord");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return median(elapsed_us(e, reps, k));
  }
  Events e(2 * static_cast<std::size_t>(iters));
  check(launch_spin(stream, 1000.0 + 20.0 * iters), "spin kernel");
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(e.ev[2 * i], stream), "cudaEventRecord");
    run(i);
    check(cudaEventRecord(e.ev[2 * i + 1], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return median(elapsed_us(e, iters, 1.0));
}

double time_gemv_us(const nf4_gemv_desc& host, int rotations, int iters, const DeviceInfo& dev) {
  rotations = std::max(rotations, 1);
  Stream s;
  // The contract core would run (nf4_gemv_mode_used), sliced as core slices it.
  ValidGemv valid = validate_gemv(host);
  if (!gemv_wants_fast(valid.desc) || !gemv_fast_supported(valid, dev)) valid.desc.mode = NF4_GEMV_EXACT;
  std::vector<std::unique_ptr<DeviceGemv>> copies;
  const std::int64_t workspace = gemv_workspace_bytes(valid, dev);  // the fastest plan's, as a caller that asks gives it
  for (int r = 0; r < rotations; ++r) {
    copies.push_back(std::make_unique<DeviceGemv>(valid, workspace));
    copies.back()->upload(s);
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return time_median_us(s, iters, [&](int i) {
    for_each_gemv_slice(copies[static_cast<std::size_t>(i % rotations)]->valid(),
                        [&](std::int32_t, const ValidGemv& slice) { enqueue_gemv(slice, s, dev); });
  });
}

namespace {

// Each timing runs on the backend's device: a context on a chosen device (nf4 bench --device)
// enters it, whatever the thread's current device.
class CudaRunner final : public bench::BenchRunner {
 public:
  explicit CudaRunner(DeviceExtension& device) : device_(device) {}

  double time_copy_us(std::int64_t bytes, int rotations, int iters) override {
    const DeviceScope scope(device_.chosen_device());
    std::fprintf(stderr, "cuda bench timing: %s (NF4_BENCH_TIMING)\n", timing_name(bench::timing_from_env()));
    rotations = std::max(rotations, 1);
    std::vector<DeviceBuffer> src, dst;
    for (int r = 0; r < rotations; ++r) {
      src.emplace_back(static_cast<std::size_t>(bytes));
      dst.emplace_back(static_cast<std::size_t>(bytes));
      check(cudaMemset(src.back().get(), r + 1, static_cast<std::size_t>(bytes)), "cudaMemset");
    }
    Stream s;
    return time_median_us(s, iters, [&](int i) {
      check(cudaMemcpyAsync(dst[i % rotations].get(), src[i % rotations].get(), static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync");
    });
  }

  double time_dequantize_us(const nf4_tensor* host, std::size_t count, int rotations, int iters) override {
    const DeviceScope scope(device_.chosen_device());
    rotations = std::max(rotations, 1);
    Stream s;
    std::vector<std::unique_ptr<DeviceTensors>> copies;
    for (int r = 0; r < rotations; ++r) {
      copies.push_back(std::make_unique<DeviceTensors>(host, count));
      copies.back()->upload(s);
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const DeviceInfo& dev = device_.current_device();
    return time_median_us(s, iters, [&](int i) { enqueue(copies[i % rotations]->tensors(), count, s, dev, device_.forced_config()); });
  }

  std::int64_t cache_bytes() const override {
    const DeviceScope scope(device_.chosen_device());
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) return 64 << 20;
    return l2;
  }

  double time_gemv_us(const nf4_gemv_desc& g, int rotations, int iters) override {
    const DeviceScope scope(device_.chosen_device());
    return cuda::time_gemv_us(g, rotations, iters, device_.current_device());
  }

 private:
  DeviceExtension& device_;
};

}  // namespace
}  // namespace nf4::cuda

std::unique_ptr<nf4::bench::BenchRunner> nf4::bench::make_cuda_runner(Backend& backend) {
  auto* device = backend.extension<cuda::DeviceExtension>();
  NF4_CHECK(device != nullptr);
  return std::make_unique<cuda::CudaRunner>(*device);
}
