// SPDX-License-Identifier: MIT
#include "bench/cuda/bench_kernels.h"

namespace nf4::cuda {
namespace {

__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

cudaError_t launch_spin(cudaStream_t stream, double microseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds * 1e3));
  return cudaGetLastError();
}

}  // namespace nf4::cuda
