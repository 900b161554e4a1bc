// SPDX-License-Identifier: MIT
// Programmatic dependent launch (sm_90), host side: when a launch may let its kernel be scheduled
// while the previous kernel in the stream drains. The kernel must wait for the previous grid before
// its first access to global memory (device_util.cuh, wait_for_previous_grid), which only code
// compiled for sm_90 or later does; and only streams the caller created take it (the legacy
// default stream and cudaStreamPerThread keep plain launches).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace nf4::cuda {

// Whether code compiled for this PTX version (cudaFuncAttributes::ptxVersion of the code the device
// runs) waits for the previous grid: 90 or more (a build of compute_80 PTX JIT-compiled for an H100
// does not).
inline constexpr bool ptx_waits_for_previous_grid(int ptx_version) { return ptx_version >= 90; }

// The same for `fn` on the current device, for a caller that does not query its attributes anyway.
// `cache` holds the answer per device (0: not asked, 1: no, 2: yes); an error answers no.
inline bool code_waits_for_previous_grid(const void* fn, std::atomic<signed char> (&cache)[64]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  signed char known = cache[device].load(std::memory_order_relaxed);
  if (known == 0) {
    cudaFuncAttributes attr{};
    known = cudaFuncGetAttributes(&attr, fn) == cudaSuccess && ptx_waits_for_previous_grid(attr.ptxVersion) ? 2 : 1;
    cache[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

inline bool stream_takes_pdl(cudaStream_t stream) { return reinterpret_cast<std::uintptr_t>(stream) > 2; }

// The launch attribute that makes a launch programmatic.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

}  // namespace nf4::cuda
