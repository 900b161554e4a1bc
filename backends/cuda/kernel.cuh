// SPDX-License-Identifier: MIT
// The dequantization kernel: one launch for a whole Dispatch (one tensor, or many tensors of a
// grouped call), nested or flat absmax, NF4 or FP4, fp16 / bf16 / fp32 out. Arithmetic follows
// docs/DESIGN.md section 2 exactly:
//   nested absmax = __fadd_rn(__fmul_rn(code2[q], absmax2), offset)   two roundings, never an FMA
//   out           = RNE_T(__fmul_rn(value(q), absmax))
// Included by kernels.cu (the library's instantiations) and cuda_tune.cu (the tuning sweep).
//
// Memory shape (the part that decides the speed; docs/DESIGN.md section 4, tuning.h):
//   A "unit" is what one thread writes with one store of at most 16 bytes: 8 halves (from 4
//   packed bytes), 4 floats (from 2 packed bytes) or 8 one-byte elements (8 bytes, from 4). A CTA
//   of T threads processes a "group" of T*U units per iteration; unit k of thread t is unit k*T + t
//   of the group, so every load instruction of a warp reads one contiguous 128-byte (64-byte for
//   fp32) run of codes and every store writes 512 (1-byte elements: 256) contiguous bytes. Each
//   thread first issues all U code loads and the absmax loads, then computes and stores: U
//   independent loads in flight per thread.
//   CTAs loop over the launch's groups with a grid stride, so the grid can be sized to the machine
//   (KernelConfig::grid) or be one CTA per group.
//   Groups that are partial (a tensor's tail) or whose pointers are not aligned for the vector
//   access take a scalar path with per-element bounds checks: no access outside the buffers for
//   any element count or pointer offset.
//   Tables: value(q) (16 floats) and, with kOptSmemCode, the nested code table (256 floats) are
//   loaded into shared memory when a CTA enters a chunk, after the group's own loads were issued,
//   so no load waits for another one.
//   On sm_90 the kernel starts with griddepcontrol.wait / launch_dependents, so that a launch made
//   with kOptPdl may be scheduled while the previous kernel drains (and still sees its writes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.h"
#include "core/half.h"

namespace nf4::cuda {

namespace detail {

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
  static_assert(E == 8 || E == 4, "a unit of this many elements (16 bytes of a dtype of another width) has no code load");
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
__device__ __forceinline__ void store8(void* p, std::uint32_t a, std::uint32_t b) {
  if constexpr (H & kHintStoreStream) {
    asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b));
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(a, b);
  }
}

template <int H>
__device__ __forceinline__ void store16(void* p, std::uint32_t a, std::uint32_t b, std::uint32_t c, std::uint32_t d) {
  if constexpr (H & kHintStoreStream) {
    asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
  } else {
    *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
  }
}

// One output element (scalar path); out is element-aligned (checked on the host).
template <nf4_dtype D>
__device__ __forceinline__ void store_one(void* out, std::uint32_t i, float v) {
  if constexpr (sizeof(typename DtypeCodec<D>::Storage) == 2) {
    static_cast<std::uint16_t*>(out)[i] = static_cast<std::uint16_t>(pack2<D>(v, 0.0f) & 0xffffu);  // the conversion instruction
  } else {
    store_element<D>(out, i, v);
  }
}

// One unit's 16 bytes from its E values of 2 or 4 bytes, the first at the lowest address (1-byte
// units are packed as their values are made, in dequantize_kernel).
template <nf4_dtype D, int E>
__device__ __forceinline__ uint4 pack_unit(const float (&v)[E]) {
  constexpr int kSize = static_cast<int>(sizeof(typename DtypeCodec<D>::Storage));
  static_assert(E * kSize == 16, "a unit is one 16-byte store");
  if constexpr (kSize == 4) {
    return make_uint4(encode<D>(v[0]), encode<D>(v[1]), encode<D>(v[2]), encode<D>(v[3]));
  } else {
    static_assert(kSize == 2, "a unit holds 1-, 2- or 4-byte elements");
    return make_uint4(pack2<D>(v[0], v[1]), pack2<D>(v[2], v[3]), pack2<D>(v[4], v[5]), pack2<D>(v[6], v[7]));
  }
}

// Nested absmax of the chunk-relative block rb: two roundings, never contracted into an FMA.
__device__ __forceinline__ std::uint64_t global_timer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace detail

// The kernel. D: output dtype; U: units per thread per group; H: Hint bits; O: the kernel-body
// Option bits (kKernelOptionMask); N: chunks the argument block holds.
template <nf4_dtype D, int U, int H, int O, int N>
__global__ void __launch_bounds__(1024) dequantize_kernel(const __grid_constant__ LaunchArgsN<N> args) {
  constexpr int E = kUnitElements<D>;
  constexpr bool kSmemCode = (O & kOptSmemCode) != 0;
  __shared__ float table[16];                   // value(q): the chunk's NF4 quant_map or the FP4 table
  __shared__ float code[kSmemCode ? 256 : 1];   // nested: the chunk's 256-entry code table
  const unsigned tid = threadIdx.x;
  const unsigned T = blockDim.x;
  const unsigned group_elems = T * (U * E);
  const unsigned total = args.total_groups;
  wait_for_previous_grid();  // programmatic dependent launch (kOptPdl)
  if constexpr ((O & kOptTimestamps) != 0) {
    if (tid == 0) atomicMin(args.timestamps, static_cast<unsigned long long>(detail::global_timer()));
  }
  const std::uint64_t policy = (H & kHintLoadStream) ? evict_first_policy() : 0;
  int cur = -1;  // chunk whose tables are in shared memory

  // Chunks are ordered by first_group and a CTA's g only grows: a forward scan finds the chunk.
  const auto advance = [&](unsigned& c, unsigned g) {
    while (c + 1 < args.chunk_count && g >= args.chunks[c + 1].first_group) ++c;
  };
  const auto is_fast = [&](unsigned c, unsigned g) {
    const ChunkArgs& ch = args.chunks[c];
    return (ch.align & kAlignVector) && ch.n - (g - ch.first_group) * group_elems >= group_elems;
  };
  // Loads the chunk's tables into shared memory when the CTA enters a new chunk. Block-uniform
  // (c depends on g only), so the barriers are reached by every thread.
  const auto ensure_tables = [&](unsigned c) {
    if (static_cast<int>(c) == cur) return;
    if (cur >= 0) __syncthreads();  // everyone is done with the previous chunk's tables
    const ChunkArgs& ch = args.chunks[c];
    if (tid < 16) table[tid] = ch.quant_map ? __ldg(ch.quant_map + tid) : args.fp4_table[tid];
    if constexpr (kSmemCode) {
      if (ch.nested)
        for (unsigned i = tid; i < 256; i += T) code[i] = __ldg(ch.nested_code + i);
    }
    __syncthreads();
    cur = static_cast<int>(c);
  };
  const auto offset_of = [&](const ChunkArgs& ch) { return ch.offset_ptr ? __ldg(ch.offset_ptr) : ch.offset_value; };
  // Nested absmax: two roundings, never contracted into an FMA.
  const auto nested_value = [&](const ChunkArgs& ch, unsigned q, float scale, float offset) {
    const float c2 = kSmemCode ? code[q] : __ldg(ch.nested_code + q);
    return __fadd_rn(__fmul_rn(c2, scale), offset);
  };

  // The fast path's loads for one group: the codes, and the absmax (flat), or its inputs (nested).
  struct Raw {
    std::uint32_t w[U];
    float a[U];          // flat: absmax; nested: nested_absmax (kSmemCode) or the final absmax
    std::uint32_t q[U];  // nested with kSmemCode: the uint8 absmax code
    float offset;
  };
  const auto load_raw = [&](unsigned c, unsigned g, Raw& r) {
    const ChunkArgs& ch = args.chunks[c];
    const unsigned base = (g - ch.first_group) * group_elems;
#pragma unroll
    for (int k = 0; k < U; ++k) r.w[k] = detail::load_codes<E, H>(ch.packed + (base + (k * T + tid) * E) / 2, policy);
    if (ch.nested) {
      r.offset = offset_of(ch);
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const unsigned rb = (ch.block_rem + base + (k * T + tid) * E) >> ch.log2_blocksize;
        const unsigned q = __ldg(static_cast<const std::uint8_t*>(ch.absmax) + rb);
        const float s = __ldg(ch.nested_absmax + ((ch.nested_rem + rb) >> ch.log2_nested_blocksize));
        if constexpr (kSmemCode) {
          r.q[k] = q;
          r.a[k] = s;
        } else {
          r.a[k] = nested_value(ch, q, s, r.offset);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < U; ++k)
        r.a[k] = __ldg(static_cast<const float*>(ch.absmax) + ((ch.block_rem + base + (k * T + tid) * E) >> ch.log2_blocksize));
    }
  };
  const auto finish = [&](unsigned c, unsigned g, const Raw& r) {
    const ChunkArgs& ch = args.chunks[c];
    const unsigned base = (g - ch.first_group) * group_elems;
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const unsigned e0 = base + (k * T + tid) * E;
      float am = r.a[k];
      if constexpr (kSmemCode) {
        if (ch.nested) am = nested_value(ch, r.q[k], r.a[k], r.offset);
      }
      char* dst = static_cast<char*>(ch.out) + static_cast<std::size_t>(e0) * sizeof(typename DtypeCodec<D>::Storage);
      // Element 2j is the high nibble of byte j: element e sits at bit 8*(e/2) + (e odd ? 0 : 4).
      const auto value = [&](int e) { return __fmul_rn(table[(r.w[k] >> (8 * (e / 2) + (e & 1 ? 0 : 4))) & 15u], am); };
      if constexpr (sizeof(typename DtypeCodec<D>::Storage) == 1) {
        // Each byte converted as its value is made: a codec without a conversion instruction
        // keeps fewer values live (the kernel has at most 64 registers a thread).
        std::uint32_t w[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < E; ++e) w[e / 4] |= static_cast<std::uint32_t>(encode<D>(value(e))) << (8 * (e & 3));
        detail::store8<H>(dst, w[0], w[1]);
      } else {
        float v[E];
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = value(e);
        const uint4 u = detail::pack_unit<D>(v);
        detail::store16<H>(dst, u.x, u.y, u.z, u.w);
      }
    }
  };
  // Scalar path: the chunk's last (partial) group, or pointers not aligned for vectors.
  const auto slow = [&](unsigned c, unsigned g) {
    const ChunkArgs& ch = args.chunks[c];
    const unsigned base = (g - ch.first_group) * group_elems;
    const float offset = offset_of(ch);
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const unsigned e0 = base + (k * T + tid) * E;
      if (e0 >= ch.n) continue;
      // A unit never straddles an absmax block (E divides every blocksize).
      const unsigned rb = (ch.block_rem + e0) >> ch.log2_blocksize;
      const float am = ch.nested ? nested_value(ch, __ldg(static_cast<const std::uint8_t*>(ch.absmax) + rb),
                                                __ldg(ch.nested_absmax + ((ch.nested_rem + rb) >> ch.log2_nested_blocksize)), offset)
                                 : __ldg(static_cast<const float*>(ch.absmax) + rb);
      const unsigned end = min(ch.n, e0 + E);
      for (unsigned i = e0; i < end; ++i) {
        const unsigned byte = __ldg(ch.packed + i / 2);
        const unsigned q = (i & 1u) ? (byte & 15u) : (byte >> 4);
        detail::store_one<D>(ch.out, i, __fmul_rn(table[q], am));
      }
    }
  };

  unsigned g = blockIdx.x, c = 0;
  if constexpr ((O & kOptPipeline) != 0) {
    // Software-pipelined grid stride: the next group's loads are in flight while this group is
    // computed and stored, so a persistent CTA never waits for memory with nothing to do.
    Raw r{};
    bool have = false;
    if (g < total) {
      advance(c, g);
      have = is_fast(c, g);
      if (have) load_raw(c, g, r);
    }
    while (g < total) {
      const unsigned gn = g + gridDim.x;
      unsigned cn = c;
      Raw rn{};
      bool have_next = false;
      if (gn < total) {
        advance(cn, gn);
        have_next = is_fast(cn, gn);
        if (have_next) load_raw(cn, gn, rn);
      }
      ensure_tables(c);
      if (have) finish(c, g, r);
      else slow(c, g);
      g = gn;
      c = cn;
      have = have_next;
      r = rn;
    }
  } else {
    for (; g < total; g += gridDim.x) {
      advance(c, g);
      if (is_fast(c, g)) {
        Raw r;
        load_raw(c, g, r);  // all loads first, then the tables (their loads overlap these)
        ensure_tables(c);
        finish(c, g, r);
      } else {
        ensure_tables(c);
        slow(c, g);
      }
    }
  }
  if constexpr ((O & kOptTimestamps) != 0) {
    if (tid == 0) atomicMax(args.timestamps + 1, static_cast<unsigned long long>(detail::global_timer()));
  }
}

// ---- host side (included by .cu files only) ---------------------------------------------------

// Resolves one variant for a launch of `total_groups` groups: the kernel, its grid (the groups,
// capped by the config's Grid) and how its arguments are passed. Done once per prepared launch.
template <nf4_dtype D, int U, int H, int O, int N>
cudaError_t resolve_kernel(const KernelConfig& c, std::uint32_t total_groups, int sms, KernelLaunch* out) {
  const void* fn = reinterpret_cast<const void*>(&dequantize_kernel<D, U, H, O, N>);
  unsigned grid = total_groups;
  if (c.grid.shape != Grid::kPerGroup) {
    int per_sm = c.grid.factor;
    if (c.grid.shape == Grid::kPerOccupancy) {
      // Resident CTAs per SM of this variant, per threads / 32; computed once (every writer
      // stores the same value).
      static std::atomic<int> resident[33] = {};
      int r = resident[c.threads / 32].load(std::memory_order_relaxed);
      if (r == 0) {
        int n = 0;
        const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, c.threads, 0);
        if (e != cudaSuccess) return e;
        r = n > 0 ? n : 1;
        resident[c.threads / 32].store(r, std::memory_order_relaxed);
      }
      per_sm *= r;
    }
    grid = min(grid, static_cast<unsigned>(sms) * static_cast<unsigned>(per_sm));
  }
  out->fn = fn;
  out->grid = grid;
  out->threads = static_cast<unsigned>(c.threads);
  out->one_chunk_args = N == 1;
  static std::atomic<signed char> waits[64] = {};
  out->pdl = (c.options & kOptPdl) != 0 && code_waits_for_previous_grid(fn, waits);
  return cudaSuccess;
}

template <nf4_dtype D, int U, int H, int O, bool SingleChunkArgs>
cudaError_t resolve_variant(const KernelConfig& c, std::uint32_t chunk_count, std::uint32_t total_groups, int sms, KernelLaunch* out) {
  // A one-tensor launch passes a ~150-byte argument block instead of ~1.4 KB.
  if (SingleChunkArgs && chunk_count == 1) return resolve_kernel<D, U, H, O, 1>(c, total_groups, sms, out);
  return resolve_kernel<D, U, H, O, kMaxChunksPerLaunch>(c, total_groups, sms, out);
}

template <nf4_dtype D, int U, int H, int O, bool SingleChunkArgs>
cudaError_t launch_variant(const KernelConfig& c, const LaunchArgs& args, int sms, cudaStream_t stream) {
  KernelLaunch k;
  const cudaError_t e = resolve_variant<D, U, H, O, SingleChunkArgs>(c, args.chunk_count, args.total_groups, sms, &k);
  return e != cudaSuccess ? e : launch_resolved(k, args, stream);
}

}  // namespace nf4::cuda
