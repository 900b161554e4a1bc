// SPDX-License-Identifier: MIT
// Device helpers the dequantization kernel (kernel.cuh) and the product kernels (gemv.cu,
// gemv_fast.cu, gemv_mma.cu) share: the streaming cache policy and load, the rounding of two fp32
// values to a packed 16-bit pair, exact conversions of x to fp32, the 8-leaf subtree of the exact
// product's reduction and the store of a product's result (docs/GEMV.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/gemv.h"
#include "nf4/nf4.h"

namespace nf4::cuda {

// Programmatic dependent launch (sm_90+): wait until the previous kernel in the stream has
// completed and its writes are visible, then let the next kernel launched that way be scheduled as
// this one's CTAs retire. Called before a kernel's first access to global memory; both are no-ops
// for a plain launch. Only code compiled for sm_90 or later has them, so a launch is programmatic
// only where the kernel's PTX version is 90 or more (pdl.h, ptx_waits_for_previous_grid).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// An L2 eviction policy for streamed data (sm_80+): evict first, so a tensor read or written
// once does not push out what the caller keeps in L2.
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

// 16 bytes read once: L1::no_allocate and the policy above on sm_80+ (worth 4-11% to the
// dequantization kernel, tuning.h), a plain non-coherent load before.
__device__ __forceinline__ uint4 load_stream16(const std::uint8_t* p, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
#else
  (void)policy;
  return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

// Two outputs packed into 32 bits, the first (lower address) in the low half. Round to nearest
// even. The hardware conversions give the same bits as core/half.h's integer functions for every
// value a product can take (the exhaustive check in tests/test_cuda.cpp runs all 2^32 inputs);
// sm_75 has no bf16 conversion instruction, so bf16 is rounded with integer operations there.
template <nf4_dtype D>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  static_assert(sizeof(typename DtypeCodec<D>::Storage) == 2, "pack2 packs two 16-bit elements");
  if constexpr (D == NF4_DTYPE_F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    const __half2_raw r = h;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
  } else if constexpr (D == NF4_DTYPE_BF16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    const __nv_bfloat162_raw r = b;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
#else
    return static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(lo))) |
           (static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(hi))) << 16);
#endif
  } else {  // a 16-bit dtype without a conversion instruction: its codec
    return static_cast<std::uint32_t>(encode<D>(lo)) | (static_cast<std::uint32_t>(encode<D>(hi)) << 16);
  }
}

// 8 consecutive x values as exact fp32: one 16-byte unit of a 16-bit dtype (u0), or two of fp32.
template <nf4_dtype XD>
__device__ __forceinline__ void x_unpack8(const uint4& u0, const uint4& u1, float out[8]) {
  if constexpr (XD == NF4_DTYPE_F32) {
    out[0] = __uint_as_float(u0.x), out[1] = __uint_as_float(u0.y), out[2] = __uint_as_float(u0.z), out[3] = __uint_as_float(u0.w);
    out[4] = __uint_as_float(u1.x), out[5] = __uint_as_float(u1.y), out[6] = __uint_as_float(u1.z), out[7] = __uint_as_float(u1.w);
  } else {
    // The product kernels load x in 16-byte units of 8 (16-bit) or 4 (32-bit) elements; a dtype of
    // another width needs its own loads there.
    static_assert(sizeof(typename DtypeCodec<XD>::Storage) == 2, "x of this width has no loads in the product kernels");
    (void)u1;
    const std::uint32_t w[4] = {u0.x, u0.y, u0.z, u0.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (XD == NF4_DTYPE_BF16) {
        out[2 * j] = __uint_as_float(w[j] << 16);
        out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      } else if constexpr (XD == NF4_DTYPE_F16) {
        out[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[j] & 0xffffu)));
        out[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[j] >> 16)));
      } else {
        out[2 * j] = DtypeCodec<XD>::to_float(static_cast<std::uint16_t>(w[j] & 0xffffu));
        out[2 * j + 1] = DtypeCodec<XD>::to_float(static_cast<std::uint16_t>(w[j] >> 16));
      }
    }
  }
}

// The complete tree over 8 leaves, one rounding per addition.
__device__ __forceinline__ float tree8(const float p[8]) {
  return __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3])), __fadd_rn(__fadd_rn(p[4], p[5]), __fadd_rn(p[6], p[7])));
}

// Stores a product's result as y[at] in y's dtype (core/gemv.h's output rule).
// Written as a two-way branch on the width, not core/gemv.h's gemv_store: the product kernels sit at
// their register limit, and the longer switch spills there (sm_90). Correct for every row the
// product takes by the check below: such a row of another width does not build.
__device__ __forceinline__ void store_value(float v, void* y, std::int64_t at, std::int32_t y_dtype) {
  const std::uint32_t bits = gemv_out_bits(v, static_cast<nf4_dtype>(y_dtype));
  if (y_dtype == NF4_DTYPE_F32) static_cast<std::uint32_t*>(y)[at] = bits;
  else static_cast<unsigned short*>(y)[at] = static_cast<unsigned short>(bits);
}
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product)                     \
  static_assert(!(product) || sizeof(DtypeCodec<value>::Storage) == ((value) == NF4_DTYPE_F32 ? 4 : 2), \
                "store_value writes fp32 as a word and every other dtype the product takes as 16 bits");
NF4_DTYPES(NF4_X)
#undef NF4_X
// Stores the root of a chunk stack that holds `chunks` (a power of two) chunk nodes, merged by
// the binary counter.
__device__ __forceinline__ void store_root(const float* stack, std::int64_t chunks, void* y, std::int64_t at, std::int32_t y_dtype) {
  int top = 0;
  while ((std::int64_t{1} << top) < chunks) ++top;
  store_value(stack[top], y, at, y_dtype);
}

// A barrier among `warps` consecutive warps of a CTA (named barrier 1 + team; 0 is
// __syncthreads), which also orders their shared-memory accesses.
__device__ __forceinline__ void team_barrier(unsigned team, unsigned warps) {
  asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "r"(warps * 32) : "memory");
}

}  // namespace nf4::cuda
