// SPDX-License-Identifier: MIT
// Kernels only the measuring side launches (bench_kernels.cu). Plain C++ callers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nf4::cuda {

// A single-thread kernel that spins for `microseconds` (device clock), so a benchmark can enqueue
// its timed iterations behind it and have them run back to back.
cudaError_t launch_spin(cudaStream_t stream, double microseconds);

}  // namespace nf4::cuda
