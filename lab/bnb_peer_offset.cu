// SPDX-License-Identifier: MIT
#include <algorithm>

#include "lab/bnb_peer.h"

namespace nf4::lab {
namespace {

__global__ void add_offset_kernel(float* absmax, std::int64_t n, const float* offset_ptr) {
  const float offset = *offset_ptr;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    absmax[i] = __fadd_rn(absmax[i], offset);
}

}  // namespace

cudaError_t launch_add_offset(float* absmax, std::int64_t n, const float* offset_ptr, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 4096));
  add_offset_kernel<<<blocks, 256, 0, stream>>>(absmax, n, offset_ptr);
  return cudaGetLastError();
}

}  // namespace nf4::lab
