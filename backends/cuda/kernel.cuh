// SPDX-License-Identifier: MIT
// The dequantization kernel: one launch for a whole Dispatch (one tensor, or many tensors of a
// grouped call), nested or flat absmax, NF4 or FP4, fp16 / bf16 / fp32 out. Arithmetic follows
// DESIGN.md section 2 exactly:
//   nested absmax = __fadd_rn(__fmul_rn(code2[q], absmax2), offset)   two roundings, never an FMA
//   out           = RNE_T(__fmul_rn(value(q), absmax))
// Included by kernels.cu (the library's instantiations) and tune.cu (the tuning sweep).
//
// Memory shape (the part that decides the speed; DESIGN.md section 4, tuning.h):
//   A "unit" is what one thread writes with one 16-byte store: 8 halves (from 4 packed bytes) or
//   4 floats (from 2 packed bytes). A CTA of T threads processes a "group" of T*U units per
//   iteration; unit k of thread t is unit k*T + t of the group, so every load instruction of a warp
//   reads one contiguous 128-byte (64-byte for fp32) run of codes and every store writes 512
//   contiguous bytes. Each thread first issues all U code loads and the absmax loads, then
//   computes and stores: U independent loads in flight per thread.
//   CTAs loop over the launch's groups with a grid stride, so the grid can be sized to the machine
//   (KernelConfig::ctas_per_sm) or be one CTA per group.
//   Groups that are partial (a tensor's tail) or whose pointers are not aligned for the vector
//   access take a scalar path with per-element bounds checks: no access outside the buffers for
//   any element count or pointer offset.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/launch.h"
#include "core/half.h"

namespace nf4::cuda {

// Cache-hint bits of KernelConfig::hints (A/B numbers in docs/PERFORMANCE.md).
enum Hint : int {
  kHintLoadStream = 1,   // codes: ld.global.nc.L1::no_allocate + L2 evict-first policy (read once)
  kHintStoreStream = 2,  // outputs: st.global.cs (streamed, evict first)
  kHintPrefetch256 = 4,  // codes: .L2::256B prefetch size (a sequential stream)
};

namespace detail {

// An L2 eviction policy for streamed data (sm_80+): evict first, so a tensor read or written
// once does not push out what the caller keeps in L2.
__device__ __forceinline__ std::uint64_t evict_first_policy() {
  std::uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

// The codes of one unit: 4 packed bytes (8 elements) for 16-bit outputs, 2 packed bytes (4
// elements) for fp32 outputs. Read-only for the kernel's lifetime: the non-coherent path.
#define NF4_LD_CODES(QUAL, TYPE, CONS, VAR)                                                          \
  if constexpr ((H & (kHintLoadStream | kHintPrefetch256)) == (kHintLoadStream | kHintPrefetch256)) \
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B." TYPE " %0, [%1], %2;" : CONS(VAR) : "l"(p), "l"(policy)); \
  else if constexpr (H & kHintLoadStream)                                                             \
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint." TYPE " %0, [%1], %2;" : CONS(VAR) : "l"(p), "l"(policy)); \
  else                                                                                                \
    asm("ld.global.nc.L2::256B." TYPE " %0, [%1];" : CONS(VAR) : "l"(p));

template <int E, int H>
__device__ __forceinline__ std::uint32_t load_codes(const std::uint8_t* p, std::uint64_t policy) {
  (void)policy;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr ((H & (kHintLoadStream | kHintPrefetch256)) != 0) {
    if constexpr (E == 8) {
      std::uint32_t v;
#define NF4_CONS(x) "=r"(x)
      NF4_LD_CODES(, "b32", NF4_CONS, v)
#undef NF4_CONS
      return v;
    } else {
      unsigned short v;
#define NF4_CONS(x) "=h"(x)
      NF4_LD_CODES(, "b16", NF4_CONS, v)
#undef NF4_CONS
      return v;
    }
  }
#endif
  if constexpr (E == 8) return __ldg(reinterpret_cast<const unsigned int*>(p));
  else return __ldg(reinterpret_cast<const unsigned short*>(p));
}
#undef NF4_LD_CODES

template <int H>
__device__ __forceinline__ void store16(void* p, std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) {
  if constexpr (H & kHintStoreStream) {
    asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
  } else {
    *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
  }
}

// Two outputs packed into 32 bits, the first (lower address) in the low half. Round to nearest
// even. The hardware conversions give the same bits as core/half.h's integer functions for every
// value a product can take (the exhaustive check in tests/test_cuda.cpp runs all 2^32 inputs);
// sm_75 has no bf16 conversion instruction, so bf16 is rounded with integer operations there.
template <nf4_dtype D>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (D == NF4_DTYPE_F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    const __half2_raw r = h;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    const __nv_bfloat162_raw r = b;
    return static_cast<std::uint32_t>(r.x) | (static_cast<std::uint32_t>(r.y) << 16);
#else
    return static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(lo))) |
           (static_cast<std::uint32_t>(bf16_from_bits(__float_as_uint(hi))) << 16);
#endif
  }
}

// One output element (scalar path); out is element-aligned (checked on the host).
template <nf4_dtype D>
__device__ __forceinline__ void store_one(void* out, std::uint32_t i, float v) {
  if constexpr (D == NF4_DTYPE_F32) {
    static_cast<float*>(out)[i] = v;
  } else {
    static_cast<std::uint16_t*>(out)[i] = static_cast<std::uint16_t>(pack2<D>(v, 0.0f) & 0xffffu);
  }
}

// Nested absmax of the chunk-relative block rb: two roundings, never contracted into an FMA.
__device__ __forceinline__ float nested_absmax(const ChunkArgs& ch, std::uint32_t rb, float offset) {
  const unsigned q = __ldg(static_cast<const std::uint8_t*>(ch.absmax) + rb);
  const std::uint32_t nb = (ch.nested_rem + rb) >> ch.log2_nested_blocksize;
  const float scaled = __fmul_rn(__ldg(ch.nested_code + q), __ldg(ch.nested_absmax + nb));
  return __fadd_rn(scaled, offset);
}

__device__ __forceinline__ float absmax_of(const ChunkArgs& ch, std::uint32_t rb, float offset) {
  return ch.nested ? nested_absmax(ch, rb, offset) : __ldg(static_cast<const float*>(ch.absmax) + rb);
}

}  // namespace detail

template <nf4_dtype D, int U, int H>
__global__ void __launch_bounds__(1024) dequantize_kernel(const __grid_constant__ LaunchArgs args) {
  constexpr int E = unit_elements(D);
  __shared__ float table[16];  // value(q): the chunk's NF4 quant_map or the FP4 table
  const unsigned tid = threadIdx.x;
  const unsigned T = blockDim.x;
  const unsigned group_elems = T * (U * E);

  const std::uint64_t policy = (H & kHintLoadStream) ? detail::evict_first_policy() : 0;
  int cur = -1;   // chunk whose table is in shared memory
  unsigned c = 0;
  for (unsigned g = blockIdx.x; g < args.total_groups; g += gridDim.x) {
    // Chunks are ordered by first_group and g only grows, so a forward scan finds the chunk.
    while (c + 1 < args.chunk_count && g >= args.chunks[c + 1].first_group) ++c;
    const ChunkArgs& ch = args.chunks[c];
    const unsigned base = (g - ch.first_group) * group_elems;  // < n (a chunk has ceil(n / group_elems) groups)
    const float offset = ch.offset_ptr ? __ldg(ch.offset_ptr) : ch.offset_value;

    // Loads its table when the CTA enters a new chunk. Block-uniform (c depends on g only).
    const auto ensure_table = [&] {
      if (static_cast<int>(c) != cur) {
        if (cur >= 0) __syncthreads();  // everyone is done with the previous chunk's table
        if (tid < 16) table[tid] = ch.quant_map ? __ldg(ch.quant_map + tid) : args.fp4_table[tid];
        __syncthreads();
        cur = static_cast<int>(c);
      }
    };

    if ((ch.align & kAlignVector) && ch.n - base >= group_elems) {
      // Fast path: a whole group, aligned. All loads first, then compute and store.
      std::uint32_t w[U];
      float a[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const unsigned e0 = base + (k * T + tid) * E;
        w[k] = detail::load_codes<E, H>(ch.packed + e0 / 2, policy);
      }
      if (ch.nested) {
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const unsigned e0 = base + (k * T + tid) * E;
          a[k] = detail::nested_absmax(ch, (ch.block_rem + e0) >> ch.log2_blocksize, offset);
        }
      } else {
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const unsigned e0 = base + (k * T + tid) * E;
          a[k] = __ldg(static_cast<const float*>(ch.absmax) + ((ch.block_rem + e0) >> ch.log2_blocksize));
        }
      }
      ensure_table();
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const unsigned e0 = base + (k * T + tid) * E;
        char* dst = static_cast<char*>(ch.out) + static_cast<std::size_t>(e0) * (D == NF4_DTYPE_F32 ? 4 : 2);
        // Element 2j is the high nibble of byte j: element e sits at bit 8*(e/2) + (e odd ? 0 : 4).
        float v[E];
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = __fmul_rn(table[(w[k] >> (8 * (e / 2) + (e & 1 ? 0 : 4))) & 15u], a[k]);
        if constexpr (D == NF4_DTYPE_F32) {
          detail::store16<H>(dst, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
        } else {
          detail::store16<H>(dst, detail::pack2<D>(v[0], v[1]), detail::pack2<D>(v[2], v[3]), detail::pack2<D>(v[4], v[5]),
                             detail::pack2<D>(v[6], v[7]));
        }
      }
    } else {
      // Scalar path: the chunk's last (partial) group, or pointers not aligned for vectors.
      ensure_table();
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const unsigned e0 = base + (k * T + tid) * E;
        if (e0 >= ch.n) continue;
        // A unit never straddles an absmax block (E divides every blocksize).
        const float am = detail::absmax_of(ch, (ch.block_rem + e0) >> ch.log2_blocksize, offset);
        const unsigned end = min(ch.n, e0 + E);
        for (unsigned i = e0; i < end; ++i) {
          const unsigned byte = __ldg(ch.packed + i / 2);
          const unsigned q = (i & 1u) ? (byte & 15u) : (byte >> 4);
          detail::store_one<D>(ch.out, i, __fmul_rn(table[q], am));
        }
      }
    }
  }
}

}  // namespace nf4::cuda
