// SPDX-License-Identifier: MIT
// Internals of the cuda backend shared by its sources, the cuda tests (tests/support/cuda.h) and
// bench/cuda (plain C++).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.h"
#include "core/plan.h"
#include "core/tensor.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

// Throws nf4::Error for a failed CUDA call: NF4_ERR_OUT_OF_MEMORY for allocations, else
// NF4_ERR_DEVICE with the CUDA error text.
void check(cudaError_t e, const char* what);

// cudaMalloc'd memory, freed on every path.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

struct DeviceInfo {
  int id = 0;
  int cc = 0;   // compute capability, major * 10 + minor
  int sms = 0;
  std::int64_t l2_bytes = 0;
  std::string name;
};
DeviceInfo query_device(int device);

// Makes CUDA device `device` current on the calling thread for the scope's life, then restores
// the thread's previous CUDA context (none, if it had none: restoring by ordinal would create a
// context on device 0 for a thread that never used it). A negative `device` changes nothing (a
// context without a chosen device works on the caller's current one). A context on a chosen
// device enters one around everything that touches the device.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  bool switched_ = false;
  void* previous_context_ = nullptr;  // the driver's CUcontext
  int previous_device_ = 0;
};

// Launches one dispatch (kernels.h's launch_dequantize, or the tuner's wider set of variants).
using Launcher = cudaError_t (*)(nf4_dtype, const KernelConfig&, const LaunchArgs&, int sms, cudaStream_t);

// One validated call planned for one device: per launch, the resolved kernel and its argument
// block, built once. enqueue() only substitutes addresses and launches: no allocation, device
// query or synchronization (the prepared launch of nf4.h). `forced` replaces the tuning table;
// tests pass a small `max_chunk_elements` to exercise chunks that start inside absmax blocks; a
// `launcher` (the tuner's) replaces the resolved kernels.
class PreparedCall {
 public:
  PreparedCall(std::span<const ValidTensor> tensors, const DeviceInfo& device, const std::optional<KernelConfig>& forced = std::nullopt,
               std::int64_t max_chunk_elements = kMaxChunkElements, Launcher launcher = nullptr);
  // Every launch on `stream`, with outs[i] or buffers[i] substituted when given (already checked
  // by core's check_launch_buffers; only the alignment rules of this backend are checked here).
  void enqueue(cudaStream_t stream, void* const* outs = nullptr, const nf4_buffers* buffers = nullptr) const;

 private:
  struct Launch {
    nf4_dtype dtype;
    KernelConfig config;
    KernelLaunch kernel;
    LaunchArgs args;
    std::vector<Chunk> chunks;  // Chunk::tensor indexes tensors_
  };
  std::vector<ValidTensor> tensors_;
  std::vector<Launch> launches_;
  Launcher launcher_;
  int sms_;
};

// Validates (core's validate_call) and enqueues one call; for tests and tools.
void enqueue(const nf4_tensor* tensors, std::size_t count, cudaStream_t stream, const DeviceInfo& device,
             const std::optional<KernelConfig>& forced = std::nullopt, std::int64_t max_chunk_elements = kMaxChunkElements,
             Launcher launcher = nullptr);

// Device copies of host tensors' inputs and outputs in one allocation (host staging, benchmarks).
class DeviceTensors {
 public:
  DeviceTensors(const nf4_tensor* host, std::size_t count);
  void upload(cudaStream_t stream);    // host inputs -> device
  void download(cudaStream_t stream);  // device outputs -> the host tensors' out (numel elements)
  const nf4_tensor* tensors() const { return device_.data(); }

 private:
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  std::vector<nf4_tensor> host_, device_;
  DeviceBuffer buffer_;
  std::vector<Copy> uploads_;
};

// Extension (Backend::extension<DeviceExtension>(), for tools/bench): the device this backend's
// calls run on now and the NF4_CUDA_CONFIG override of the tuning table, so a runner launches
// exactly what a call would.
class DeviceExtension {
 public:
  static constexpr std::string_view kId = "cuda.device";
  virtual const DeviceInfo& current_device() = 0;
  // The ordinal a context on a chosen device runs on (a runner enters a DeviceScope of it), or -1
  // where the backend follows the caller's current device.
  virtual int chosen_device() const = 0;
  virtual const std::optional<KernelConfig>& forced_config() const = 0;

 protected:
  ~DeviceExtension() = default;
};

}  // namespace nf4::cuda
