// SPDX-License-Identifier: MIT
// The fused matrix-vector product Y[m, n] = sum_k X[m, k] * W[n, k] (nf4.h, docs/GEMV.md), for
// m <= 8 activation rows, bit-identical to the CPU oracle (backends/cpu/gemv_oracle.cpp).
//
// How the contract's tree maps onto the GPU (the leaves of row r are its k products, padded):
//   - A warp owns one row of W at a time (grid stride over rows). Its rows' columns are cut into
//     chunks of 1024; in chunk c, lane L owns the 32 leaves [1024c + 32L, 1024c + 32L + 32): an
//     aligned power-of-two range, whose subtree the lane computes itself (8-leaf subtrees per
//     32-bit word of codes, then the four of them).
//   - An xor butterfly over the 32 lanes (offsets 1..16) evaluates the five levels above: at each
//     level a lane adds its partner's subtree of the same size; fl32 addition is commutative, so
//     both lanes hold the parent node. After five levels every lane holds the chunk's node.
//   - The chunks' nodes are combined in order by a binary counter (lane j keeps row j's stack in
//     shared memory): with c chunks done, chunk c's node is merged with the stack top while c has
//     trailing one bits, which builds the complete tree over the chunks.
//   - Leaves at or past k, and chunks past the last one up to a power of two, take the value
//     gemv_pad_bits(k) (core/gemv.h): the root then equals the contract's root over bit_ceil(k)
//     leaves even where this tree is larger (k < 1024, or a chunk count that is not a power of two).
// Every product and addition is __fmul_rn / __fadd_rn (never contracted into an FMA; the library
// is also compiled with --fmad=false), so the result cannot depend on m, on the other rows, on the
// launch shape or on the GPU.
//
// Memory shape: with k % 32 == 0 and 16-byte aligned codes and x (args.vector), a lane's 32 codes
// are one 16-byte load (a warp reads 512 contiguous bytes of W), issued for `U` chunks before any
// is used, with L1::no_allocate and an L2 evict-first policy (W is read once; x, read by every
// warp, stays in L1/L2); a lane's 32 leaves then lie in one quantization block (blocksize >= 32),
// so one absmax per chunk and lane. Other shapes (blocks straddling rows at odd offsets, k not a
// multiple of 32, misaligned pointers) take a per-element path with the same tree. All indices
// are 64-bit: any n * k up to NF4_MAX_ELEMENTS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/gemv_launch.h"
#include "core/gemv.h"

namespace nf4::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kChunk = 1024;     // leaves per warp per chunk
constexpr int kStackDepth = 48;  // chunk-tree levels: 2^47 chunks > NF4_MAX_ELEMENTS / 1024

// Exact fp32 value of activation element i.
template <nf4_dtype XD>
__device__ __forceinline__ float x_scalar(const void* x, std::int64_t i) {
  if constexpr (XD == NF4_DTYPE_F32) return __ldg(static_cast<const float*>(x) + i);
  else if constexpr (XD == NF4_DTYPE_BF16) return __uint_as_float(static_cast<std::uint32_t>(__ldg(static_cast<const unsigned short*>(x) + i)) << 16);
  else if constexpr (XD == NF4_DTYPE_F16) return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(x) + i)));
  else return DtypeCodec<XD>::to_float(__ldg(static_cast<const typename DtypeCodec<XD>::Storage*>(x) + i));
}

// The 8 activations x[i .. i + 8) (i a multiple of 8, the row 16-byte aligned) as fp32.
template <nf4_dtype XD>
__device__ __forceinline__ void x_vector8(const void* x, std::int64_t i, float out[8]) {
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(x) + i * sizeof(typename DtypeCodec<XD>::Storage));
  x_unpack8<XD>(__ldg(p), XD == NF4_DTYPE_F32 ? __ldg(p + 1) : make_uint4(0, 0, 0, 0), out);
}

// A lane's 32-leaf subtree for rows j < a.m, element by element (any k, any alignment, blocks
// straddling rows): the same tree as the vector path. The rare path: a kernel of its own
// (Vector = false, compiled for MM = 8 only), so it costs the vector kernels no registers.
template <int MM, nf4_dtype XD>
__device__ __forceinline__ void lane_subtree_scalar(const GemvArgs& a, const float* table, const float* code2, float offset, float pad,
                                                 std::int64_t row_first, std::int64_t col0, float* node) {
  float half[MM], left[MM];
#pragma unroll 1
  for (int w = 0; w < 4; ++w) {
    float wt[8];
    std::int64_t b_cached = -1;
    float am = 0.0f;
#pragma unroll 1
    for (int e = 0; e < 8; ++e) {
      const std::int64_t col = col0 + 8 * w + e;
      wt[e] = 0.0f;
      if (col < a.k) {
        const std::int64_t i = row_first + col;
        const std::int64_t b = i >> a.log2_blocksize;
        if (b != b_cached) {
          if (a.nested) {
            const unsigned q = __ldg(static_cast<const std::uint8_t*>(a.absmax) + b);
            am = __fadd_rn(__fmul_rn(code2[q], __ldg(a.nested_absmax + (b >> a.log2_nested_blocksize))), offset);
          } else {
            am = __ldg(static_cast<const float*>(a.absmax) + b);
          }
          b_cached = b;
        }
        const unsigned byte = __ldg(a.packed + i / 2);
        wt[e] = __fmul_rn(table[(i & 1) ? (byte & 15u) : (byte >> 4)], am);
      }
    }
#pragma unroll
    for (int j = 0; j < MM; ++j) {
      float p[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const std::int64_t col = col0 + 8 * w + e;
        p[e] = col < a.k ? (j < a.m ? __fmul_rn(wt[e], x_scalar<XD>(a.x, j * a.k + col)) : 0.0f) : pad;
      }
      const float t = tree8(p);
      if ((w & 1) == 0) half[j] = t;
      else if (w == 1) left[j] = __fadd_rn(half[j], t);
      else node[j] = __fadd_rn(left[j], __fadd_rn(half[j], t));
    }
  }
}

// MM: rows of X the kernel holds (args.m <= MM); XD: x dtype; U: chunks whose codes are in flight.
template <int MM, nf4_dtype XD, int U, bool Vector>
__global__ void __launch_bounds__(256, MM >= 8 ? 1 : 2) gemv_kernel(const __grid_constant__ GemvArgs a) {
  __shared__ float table[16];
  __shared__ float code2[256];
  extern __shared__ float stacks[];  // [warps][MM][kStackDepth]
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, warps = blockDim.x / kWarp;
  if (tid < 16) table[tid] = a.quant_map ? __ldg(a.quant_map + tid) : a.fp4_table[tid];
  if (a.nested)
    for (unsigned i = tid; i < 256; i += blockDim.x) code2[i] = __ldg(a.nested_code + i);
  __syncthreads();

  const std::int64_t k = a.k, n = a.n;
  const float pad = __uint_as_float(a.pad_bits);
  const float offset = a.nested ? (a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value) : 0.0f;
  const std::int64_t chunks = (k + kChunk - 1) / kChunk;
  const std::uint64_t policy = Vector ? evict_first_policy() : 0;
  float* stack = stacks + static_cast<std::size_t>(warp) * MM * kStackDepth + (lane < MM ? lane : 0) * kStackDepth;

  // absmax of flat block b.
  const auto absmax_of = [&](std::int64_t b) {
    if (a.nested) {
      const unsigned q = __ldg(static_cast<const std::uint8_t*>(a.absmax) + b);
      return __fadd_rn(__fmul_rn(code2[q], __ldg(a.nested_absmax + (b >> a.log2_nested_blocksize))), offset);
    }
    return __ldg(static_cast<const float*>(a.absmax) + b);
  };

#pragma unroll 1
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * warps + warp; row < n;
       row += static_cast<std::int64_t>(gridDim.x) * warps) {
    const std::int64_t row_first = row * k;  // flat index of W[row, 0]
    std::int64_t done = 0;                   // chunks merged into the stack
    const auto push = [&](const float (&v)[MM]) {
      // Lane j < m merges row j's node; the stack is its own, so no synchronization.
      float mine = v[0];
#pragma unroll
      for (int j = 1; j < MM; ++j)
        if (lane == static_cast<unsigned>(j)) mine = v[j];
      if (lane < static_cast<unsigned>(a.m)) {
        int level = 0;
#pragma unroll 1
        for (std::int64_t c = done; c & 1; c >>= 1, ++level) mine = __fadd_rn(stack[level], mine);
        stack[level] = mine;
      }
      ++done;
    };

#pragma unroll 1
    for (std::int64_t c0 = 0; c0 < chunks; c0 += U) {
      // Issue the codes (and absmax) of U chunks first.
      uint4 codes[U];
      float am[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const std::int64_t col = (c0 + u) * kChunk + lane * 32;
        codes[u] = make_uint4(0, 0, 0, 0);
        am[u] = 0.0f;
        if (Vector && c0 + u < chunks && col < k) {
          const std::int64_t e = row_first + col;
          codes[u] = load_stream16(a.packed + e / 2, policy);
          am[u] = absmax_of(e >> a.log2_blocksize);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c0 + u >= chunks) break;  // warp-uniform
        const std::int64_t col0 = (c0 + u) * kChunk + lane * 32;
        float node[MM];
#pragma unroll
        for (int j = 0; j < MM; ++j) node[j] = pad;
        if (col0 < k) {
          if constexpr (Vector) {
            // Words in order, rolled (all rows' x of a word in registers at once, not of four):
            // tree((w0 + w1) + (w2 + w3)) built as the words come.
            float half[MM], left[MM];
            std::uint32_t cw = codes[u].x, next1 = codes[u].y, next2 = codes[u].z, next3 = codes[u].w;
#pragma unroll 1
            for (int w = 0; w < 4; ++w) {
              // Element 2t is the high nibble of byte t of the word. The byte offsets into the
              // value table (4 * code) of all even and all odd elements, four to a register, so
              // that each element costs one byte permute and one shared load.
              const std::uint32_t even4 = (cw >> 2) & 0x3c3c3c3cu, odd4 = (cw << 2) & 0x3c3c3c3cu;
              float wt[8];
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                const std::uint32_t off = __byte_perm(e & 1 ? odd4 : even4, 0u, 0x4440u + e / 2);
                wt[e] = __fmul_rn(*reinterpret_cast<const float*>(reinterpret_cast<const char*>(table) + off), am[u]);
              }
#pragma unroll
              for (int j = 0; j < MM; ++j) {
                float xv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                if (j < a.m) x_vector8<XD>(a.x, j * k + col0 + 8 * w, xv);
                float p[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) p[e] = __fmul_rn(wt[e], xv[e]);
                const float t = tree8(p);
                if ((w & 1) == 0) half[j] = t;
                else if (w == 1) left[j] = __fadd_rn(half[j], t);
                else node[j] = __fadd_rn(left[j], __fadd_rn(half[j], t));
              }
              cw = next1;
              next1 = next2;
              next2 = next3;
            }
          } else {
            lane_subtree_scalar<MM, XD>(a, table, code2, offset, pad, row_first, col0, node);
          }
        }
        // The five levels above the lanes' subtrees.
#pragma unroll
        for (int off = 1; off < kWarp; off *= 2)
#pragma unroll
          for (int j = 0; j < MM; ++j) node[j] = __fadd_rn(node[j], __shfl_xor_sync(0xffffffffu, node[j], off));
        push(node);
      }
    }
    // Pad chunks up to a power of two; then the root is the top of the stack.
#pragma unroll 1
    while ((done & (done - 1)) != 0) {
      float node[MM];
#pragma unroll
      for (int j = 0; j < MM; ++j) node[j] = pad;
      push(node);
    }
    if (lane < static_cast<unsigned>(a.m)) store_root(stack, done, a.y, static_cast<std::int64_t>(lane) * n + row, a.y_dtype);
    __syncwarp();  // the stack is reused by the next row
  }
}

template <int MM, nf4_dtype XD, int U, bool Vector>
cudaError_t plan(const GemvArgs& a, const GemvTuning& t, int sms, GemvKernelLaunch* out) {
  const void* fn = reinterpret_cast<const void*>(&gemv_kernel<MM, XD, U, Vector>);
  const int warps = t.threads / kWarp;
  std::int64_t grid = (a.n + warps - 1) / warps;
  if (t.ctas_per_sm > 0) grid = std::min<std::int64_t>(grid, static_cast<std::int64_t>(sms) * t.ctas_per_sm);
  grid = std::min<std::int64_t>(grid, 0x7fffffff);
  const std::size_t smem = static_cast<std::size_t>(warps) * MM * kStackDepth * sizeof(float);
  *out = GemvKernelLaunch{fn, static_cast<unsigned>(grid), static_cast<unsigned>(t.threads), smem};
  return cudaSuccess;
}

template <nf4_dtype XD, int U>
cudaError_t plan_rows(const GemvArgs& a, const GemvTuning& t, int sms, GemvKernelLaunch* out) {
  if (!a.vector) return plan<8, XD, 1, false>(a, t, sms, out);
  if (a.m <= 1) return plan<1, XD, U, true>(a, t, sms, out);
  if (a.m <= 2) return plan<2, XD, 2 * U, true>(a, t, sms, out);
  if (a.m <= 4) return plan<4, XD, U, true>(a, t, sms, out);
  return plan<8, XD, U, true>(a, t, sms, out);
}

}  // namespace

bool gemv_has_variant(const GemvTuning& t) {
  return t.chunks_in_flight == 2 && t.threads >= 32 && t.threads <= 256 && t.threads % 32 == 0;
}

cudaError_t plan_gemv(const GemvArgs& a, nf4_dtype x_dtype, const GemvTuning& t, int sms, GemvKernelLaunch* out) {
  if (!gemv_has_variant(t) || a.m < 1 || a.m > 8) return cudaErrorInvalidValue;
  if (!find_dtype(static_cast<std::int32_t>(x_dtype))) return cudaErrorInvalidValue;
  return dispatch_product_dtype(x_dtype, [&](auto d) { return plan_rows<decltype(d)::value, 2>(a, t, sms, out); });
}

}  // namespace nf4::cuda
