// SPDX-License-Identifier: MIT
// Host entry points of the CUDA kernels (kernels.cu). Callable from plain C++ (the backend, the
// tests): no device code or CUDA C++ extensions in this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/launch.h"

namespace nf4::cuda {

// Whether the library holds the kernel variant (dtype, units, hints, options): the tuning table
// may only name variants that exist (checked by the tests).
bool has_variant(nf4_dtype dtype, const KernelConfig& config);

// A resolved launch: which kernel, its grid and block, and how its arguments are passed.
struct KernelLaunch {
  const void* fn = nullptr;
  unsigned grid = 0;
  unsigned threads = 0;
  bool one_chunk_args = false;  // the kernel takes a one-chunk argument block (LaunchArgsN<1>)
  bool pdl = false;             // programmatic dependent launch on streams the caller created
};

// Resolves the variant of `config` for a launch of `chunk_count` chunks and `total_groups` groups
// on a device with `sms` SMs (cudaErrorInvalidValue for a variant that is not compiled in). May
// query the occupancy once per variant; never synchronizes or allocates.
cudaError_t resolve_dequantize(nf4_dtype dtype, const KernelConfig& config, std::uint32_t chunk_count, std::uint32_t total_groups,
                               int sms, KernelLaunch* launch);
// Enqueues a resolved launch on `stream`: no device query, allocation or synchronization.
// Returns this launch's own error.
cudaError_t launch_resolved(const KernelLaunch& launch, const LaunchArgs& args, cudaStream_t stream);

// resolve_dequantize + launch_resolved.
cudaError_t launch_dequantize(nf4_dtype dtype, const KernelConfig& config, const LaunchArgs& args, int sms, cudaStream_t stream);

// Succeeds when the binary holds code the current device can run (cudaErrorNoKernelImageForDevice
// otherwise, e.g. a build without the device's architecture or PTX).
cudaError_t check_kernel_image();

namespace testing {

// Every float bit pattern (NaNs: the canonical one, which is what a product of NaN yields on the
// device) through the kernel's fp16 / bf16 conversions against core/half.h's integer functions.
struct ConversionReport {
  unsigned long long checked;
  unsigned long long f16_mismatches;
  unsigned long long bf16_mismatches;
  unsigned int first_f16_mismatch;   // input bits of the first mismatch (0 if none)
  unsigned int first_bf16_mismatch;
  unsigned int fmul_nan_bits;        // bits of __fmul_rn(NaN with a payload, 1.0f)
};
// Runs on the current device and waits for the result.
cudaError_t exhaustive_conversion_check(ConversionReport* report);

}  // namespace testing
}  // namespace nf4::cuda
