// SPDX-License-Identifier: MIT
// The copy engine's bulk copies into shared memory and the mbarriers they complete on (sm_90):
// the fast product's split forms fill their x stages with them (gemv_mma_wgmma.cuh), and
// lab/wgmma_overlap times them. Below sm_90 they compile to nothing; no caller reaches them there.
#pragma once

#include <cuda_runtime.h>

namespace nf4::cuda {

// A bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared
// memory, completing on the mbarrier at `bar`, which this thread arms for them first.
__device__ __forceinline__ void bulk_copy_to_shared(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}
// Waits until the mbarrier at `bar` completes its phase of the given parity.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{ .reg .pred done;\n"
      "wait_%=: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=; }" ::"r"(bar),
      "r"(parity)
      : "memory");
#else
  (void)bar, (void)parity;
#endif
}
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}

}  // namespace nf4::cuda
