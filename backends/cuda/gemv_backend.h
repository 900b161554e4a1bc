// SPDX-License-Identifier: MIT
// Host side of the cuda backend's matrix-vector product (plain C++; the kernel is gemv.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemv_launch.h"
#include "core/gemv.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

// Which kernel and shape a product uses: by default the tables (gemv_launch.h) for the device,
// replaced by NF4_GEMV_CONFIG (experiments, A/B: "legacy" for gemv.cu's kernel everywhere, or
// "threads,rows_m1,rows_m2,rows_m4,rows_m8,xs_m1,xs_m2,xs_m4,xs_m8[,split]" for the fast kernel,
// xs_*: the largest x staged in shared memory per m bucket; split: warps per row group, 0 = per
// shape), or by a test.
struct GemvChoice {
  bool legacy = false;                  // gemv.cu's kernel even where the fast one applies
  std::optional<GemvTuning> tuning;     // gemv.cu's kernel shape
  std::optional<GemvFastTuning> fast;   // the fast kernel's shape (sm_80+, vector shapes)
  GemvMmaChoice mma;                    // the fast contract's kernel (NF4_GEMV_MMA: kernel[,schedule])
};

// Whether the fast contract has a kernel for `g` (which asks for it) on `device`.
bool gemv_fast_supported(const ValidGemv& g, const DeviceInfo& device);

// Checks the backend's alignment rules (device pointers: validate_gemv checked their values), then
// enqueues one launch on `stream`: no allocation, no synchronization. `forced` replaces the tuning
// table (tests: every compiled variant).
void enqueue_gemv(const ValidGemv& g, cudaStream_t stream, const DeviceInfo& device, const GemvChoice& forced = {});

// A product planned once (nf4_gemv_prepare): its kernel arguments, x and y as given, and the
// launch. plan_product checks the backend's alignment rules; enqueue_gemv_prepared only checks the
// alignment of the new x and y (core has checked the rest), patches them in and enqueues.
struct GemvPlan {
  GemvArgs args;
  GemvKernelLaunch kernel;
  std::uint8_t x_size;  // bytes per element of x
};
GemvPlan plan_product(const ValidGemv& g, const DeviceInfo& device, const GemvChoice& forced = {});
// The workspace bytes the fastest plan for `g` takes (nf4_gemv_workspace_size): 0 where none does.
std::int64_t gemv_workspace_bytes(const ValidGemv& g, const DeviceInfo& device, const GemvChoice& forced = {});
void enqueue_gemv_prepared(const GemvPlan& plan, const void* x, void* y, cudaStream_t stream);

// A device copy of a host product's weight and x, and room for y and a workspace of
// `workspace_bytes` (the description's own is not used), in one allocation.
class DeviceGemv {
 public:
  explicit DeviceGemv(const ValidGemv& host, std::int64_t workspace_bytes = 0);
  DeviceGemv(const DeviceGemv&) = delete;  // dev_ points to dev_weight_
  DeviceGemv& operator=(const DeviceGemv&) = delete;
  void upload(cudaStream_t stream);
  void download_y(cudaStream_t stream, void* host_y) const;
  // The staged copies are fresh, aligned and disjoint: valid by construction, with the host's sizes.
  const ValidGemv& valid() const { return dev_; }

 private:
  nf4_tensor host_weight_{}, dev_weight_{};
  ValidGemv dev_{};
  DeviceBuffer buffer_;
  struct Copy {
    std::size_t offset;
    const void* src;
    std::size_t bytes;
  };
  Copy copies_[8]{};
  int copy_count_ = 0;
  std::size_t y_offset_ = 0, y_bytes_ = 0;
};

// nf4_gemv_host on the cuda backend: stage, launch, download, synchronize.
void gemv_host(const ValidGemv& g, cudaStream_t stream, const DeviceInfo& device);

}  // namespace nf4::cuda
