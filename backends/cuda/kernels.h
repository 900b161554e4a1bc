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

// Enqueues one launch on `stream` (grid from the config and the device's SM count). Never
// synchronizes or allocates. Returns the launch error (cudaErrorInvalidValue for a variant that is
// not compiled in).
cudaError_t launch_dequantize(nf4_dtype dtype, const KernelConfig& config, const LaunchArgs& args, int sms, cudaStream_t stream);

// Succeeds when the binary holds code the current device can run (cudaErrorNoKernelImageForDevice
// otherwise, e.g. a build without the device's architecture or PTX).
cudaError_t check_kernel_image();

// For the bitsandbytes peer timing (tools' `nf4 bench --peer-bnb`): absmax[i] += offset, the
// PyTorch `absmax += offset` step between bitsandbytes' two launches.
cudaError_t launch_add_offset(float* absmax, std::int64_t n, const float* offset_ptr, cudaStream_t stream);

// A single-thread kernel that spins for `microseconds` (device clock), so a benchmark can enqueue
// its timed iterations behind it and have them run back to back.
cudaError_t launch_spin(cudaStream_t stream, double microseconds);

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
