// SPDX-License-Identifier: MIT
// The fused matrix-vector product's fast kernel (sm_80 and later, k % 32 == 0, 16-byte aligned
// codes and x): the same tree as gemv.cu and the CPU oracle (docs/GEMV.md section 1), so the
// same bits, with the instruction count per weight cut to what a memory-bound kernel can afford.
//
// Why it is shaped this way (H100, 14336 x 4096 at m = 1: 10.1 us of DRAM traffic, and 445k
// weights per SM; at ~1.8 GHz that leaves ~18k cycles, i.e. ~5 warp instructions per weight):
//   - Decode, two weights per shared load: a 64 KB table holds, for every byte value b, the pair
//     (value[b >> 4], value[b & 15]) (element 2t is the high nibble of byte t), 32 copies side by
//     side. Lane L reads copy L, so a warp's 8-byte loads never share a bank; and the address is
//     b * 256 + 8 * L, which one byte permute builds from the code word and 8 * L. Per weight:
//     half a PRMT and half an LDS.64, against a nibble extraction and a 4-byte LDS.
//   - R rows per warp: the x values of a word are loaded and converted to fp32 once and used for
//     R rows. For 5..8 rows of x, x is staged once per CTA in shared memory where it fits, in a
//     layout where a warp's 16-byte reads are conflict-free: through L1 a lane's 64-byte stride
//     puts four cache lines in every quarter-warp (16 wavefronts per load instead of 4), which
//     dominates at m = 8; at m = 2..4 the staging's registers and shared memory cost more than
//     that, and at m = 1 it pays only where the CTAs have many rows to amortize the copy over.
//   - The five tree levels above the lanes: a transposed butterfly. With V = R * MM values per
//     lane, each of the first log2(V) levels halves the values a lane carries (a lane keeps one
//     half, its partner the other, and each adds the sibling subtree it receives), so a chunk costs
//     V - 1 + 5 - log2(V) shuffles instead of 5 V. Lane L < V ends with value index v(L) (the bits
//     of L select halves) and keeps that value's chunk stack.
//   - The codes of the warp's next (rows, chunk) item are loaded before the current one is
//     computed (two register stages used alternately), with L1::no_allocate and an L2
//     evict-first policy: W is read once. They are issued only after every register of the
//     current item has been used once (an ordered prefetch, below): otherwise a scoreboard shared
//     by all the loads makes the current item wait for the next one's DRAM loads.
//   - Work is spread over CTAs first (warp w of CTA b takes item groups b + w * grid, ...), so that
//     SMs, which share their issue slots and DRAM queue among their warps, get equal work.
// Every product and sum is __fmul_rn / __fadd_rn (and the library builds with --fmad=false).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "backends/cuda/device_util.cuh"
#include "backends/cuda/gemv_launch.h"
#include "core/gemv.h"

namespace nf4::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kChunk = 1024;       // leaves per warp per chunk (32 per lane)
constexpr int kStackDepth = 48;    // chunk-tree levels: 2^47 chunks > NF4_MAX_ELEMENTS / 1024
constexpr int kPairBytes = 65536;  // 256 byte values x 32 copies x (2 floats)
constexpr int kMaxThreads = 256;
// The widest k this kernel takes: its offsets inside a row group (up to 4 rows of k columns) and
// inside x (up to 8 rows of k fp32 values) stay below 2^31. Wider products run gemv.cu's kernel.
constexpr std::int64_t kFastMaxK = std::int64_t{1} << 26;

template <nf4_dtype XD>
__host__ __device__ constexpr int x_size() { return static_cast<int>(sizeof(typename DtypeCodec<XD>::Storage)); }
// 16-byte units of x per lane and chunk (32 elements).
template <nf4_dtype XD>
__host__ __device__ constexpr int x_units() { return 32 * x_size<XD>() / 16; }

[[maybe_unused]] __device__ __forceinline__ std::uint32_t word_of(const uint4& v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

// The variants with device code per architecture: none below sm_80 (the host launches this
// kernel from sm_80 on), and staged x at m = 5..8 only from sm_90 on (on sm_80-89 it needs more
// than 255 registers; their tuning entry does not stage x).
template <int MM, bool XS>
__host__ __device__ constexpr bool variant_has_code(int arch) {  // arch: 10 * compute capability
  return arch >= 900 || (arch >= 800 && !(XS && MM == 8));
}
template <int MM, bool XS>
__host__ __device__ constexpr bool variant_compiled() {
#if defined(__CUDA_ARCH__)
  return variant_has_code<MM, XS>(__CUDA_ARCH__);
#else
  return true;
#endif
}

// The evict-first L2 policy (device_util.cuh), created where an item's loads use it: ptxas builds
// the constant in uniform registers there, six uniform instructions per item. One created before
// the loop is held in two ordinary registers and moved into uniform ones for every code load (two
// per load). volatile keeps the front end from hoisting it back out of the loop.
__device__ __forceinline__ std::uint64_t item_evict_first_policy() {
  std::uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

template <int R>
struct Stage {
  uint4 codes[R];
  float scale[R];    // flat: the absmax; nested: the nested absmax of the block
  unsigned code[R];  // nested: the block's 8-bit absmax code
};

__host__ __device__ constexpr int ilog2(int v) { return v <= 1 ? 0 : 1 + ilog2(v / 2); }

// Variants held to 128 registers, for two CTAs (16 warps) per SM: they fit without spilling, and
// at m = 3-4 two rows of W per warp at 16 warps beat four rows at 8 by 2-14% (H100,
// docs/PERFORMANCE_LOG.md "kGemvFastTuning"). The others need more (m = 8; four rows at m = 3-4).
template <int MM, int R>
inline constexpr bool kTwoCtas = MM <= 2 || (MM == 4 && R == 2);

// MM: rows of X the kernel holds (args.m <= MM); XD: x dtype; R: rows of W per warp item;
// XS: x staged in shared memory.
template <int MM, nf4_dtype XD, int R, bool XS>
__global__ void __launch_bounds__(kMaxThreads, kTwoCtas<MM, R> ? 2 : 1) gemv_fast_kernel(const __grid_constant__ GemvArgs a) {
  constexpr int V = MM * R;
  constexpr int kLogV = ilog2(V);
  static_assert((V & (V - 1)) == 0 && V <= 32, "V values per lane, a power of two up to the warp");
  constexpr int XU = x_units<XD>();
  if constexpr (!variant_compiled<MM, XS>()) {
    (void)a;
    __trap();
  } else {
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, warps = blockDim.x / kWarp;
  float* code2 = reinterpret_cast<float*>(smem + kPairBytes);
  float* stacks = code2 + 256;
  uint4* xs = reinterpret_cast<uint4*>(stacks + warps * V * kStackDepth);
  const std::int64_t n = a.n;
  // k <= kFastMaxK (the host's rule): columns, chunks and the offsets inside a row group or a row
  // of x fit in 32 bits; only a group's first element and the row count need 64.
  const std::uint32_t k = static_cast<std::uint32_t>(a.k);
  const std::uint32_t chunks = (k + kChunk - 1) / kChunk;

  // One thread per byte value writes its 32 copies (16-byte stores, started at a different
  // offset per thread so that a quarter-warp's stores fall in distinct banks).
  for (unsigned b = tid; b < 256; b += blockDim.x) {
    const float hi = a.quant_map ? __ldg(a.quant_map + (b >> 4)) : a.fp4_table[b >> 4];
    const float lo = a.quant_map ? __ldg(a.quant_map + (b & 15)) : a.fp4_table[b & 15];
    const float4 v = make_float4(hi, lo, hi, lo);
    float4* row = reinterpret_cast<float4*>(smem + b * 256);
#pragma unroll
    for (unsigned j = 0; j < 16; ++j) row[(j + b) & 15] = v;
  }
  if (a.nested)
    for (unsigned i = tid; i < 256; i += blockDim.x) code2[i] = __ldg(a.nested_code + i);
  if constexpr (XS) {
    // xs[((m * chunks + c) * XU + j) * 32 + L]: unit j of lane L's 32 columns in chunk c. One pass
    // per row of x, so that no unit's position needs a division by the chunk count.
    const std::uint32_t row_units = chunks * XU * kWarp;
    for (int m = 0; m < a.m; ++m) {
      const unsigned char* xrow = static_cast<const unsigned char*>(a.x) + static_cast<std::uint64_t>(m) * k * x_size<XD>();
      for (std::uint32_t i = tid; i < row_units; i += blockDim.x) {
        const std::uint32_t col = (i / (XU * kWarp)) * kChunk + (i % kWarp) * 32 + (i / kWarp % XU) * (16 / x_size<XD>());
        uint4 v = make_uint4(0, 0, 0, 0);
        if (col < k) v = __ldg(reinterpret_cast<const uint4*>(xrow + col * x_size<XD>()));
        xs[m * row_units + i] = v;
      }
    }
  }
  __syncthreads();

  // A team of 2^log2_split consecutive warps shares each row group. Part p of the team computes
  // the subtree over chunks [p * span, (p + 1) * span) of the chunk tree padded to a power of two
  // (span is a power of two, so that subtree is a node of the contract's tree), and part 0 adds
  // the parts' roots level by level: the same tree, with more warps on a shape of few row groups.
  const unsigned split = 1u << a.log2_split, team = warp >> a.log2_split, part = warp & (split - 1);
  // gemv_padded_chunks(chunks) and the span's log2 from bit counts (chunks <= 2^16): the loops
  // they replace ran before the first load, a compare of 13 cycles and a branch a turn.
  const std::uint32_t padded = chunks <= 1 ? 1u : 2u << (31 - __clz(static_cast<int>(chunks - 1)));
  const std::uint32_t span = padded >> a.log2_split;  // >= 1: the host caps the split
  const std::uint32_t lo = part * span;
  const std::uint32_t hi = lo + span < chunks ? lo + span : chunks;  // real chunks of this part: [lo, hi)
  const int top = __ffs(static_cast<int>(span)) - 1;  // span == 2^top: a part's root is level top of its stack
  const std::int64_t groups = (n + R - 1) / R;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (warps >> a.log2_split);
  std::int64_t g = static_cast<std::int64_t>(team) * gridDim.x + blockIdx.x;
  if (g >= groups) return;  // the team's warps share g, so none of them waits at a barrier below
  std::uint32_t c = lo;
  float offset = 0.0f;  // nested: set after the first item's loads are issued (not needed before)
  const float pad = __uint_as_float(a.pad_bits);
  const std::uint32_t lane8 = lane * 8, lane32 = lane * 32;
  int my_v = 0;  // the value index lane L holds after the transposed butterfly
#pragma unroll
  for (int j = 0; j < kLogV; ++j) my_v += static_cast<int>((lane >> j) & 1u) * (V >> (j + 1));
  float* stack = stacks + (static_cast<std::size_t>(warp) * V + (lane < V ? lane : 0)) * kStackDepth;

  // The row group whose items are being loaded: 64-bit bases at its first element E, 32-bit
  // offsets inside it. With B the blocksize, NB the nested blocksize and Q = E >> lbs, row r's
  // element E + r k + col lies in block Q + d, d = (E % B + r k + col) >> lbs, and that block in
  // nested block (Q >> lnbs) + ((Q % NB + d) >> lnbs): the entries the element's 64-bit index
  // gives, with 32-bit adds and shifts per row.
  const unsigned lbs = a.log2_blocksize, lnbs = a.log2_nested_blocksize;
  const std::uint32_t row_bytes = k / 2;  // codes per row
  const std::uint8_t* gcodes = nullptr;   // E / 2 bytes into packed
  const unsigned char* gabs = nullptr;    // absmax entry of block E >> lbs (bytes nested, floats flat)
  const float* gnest = nullptr;           // nested: nested_absmax entry of that block
  std::uint32_t grem = 0, gnrem = 0;      // E % B; nested: (E >> lbs) % nested blocksize
  std::uint32_t glive = R;                // rows of the group that exist (>= 1)
  const auto set_group = [&](std::int64_t grp) {
    const std::uint64_t e = static_cast<std::uint64_t>(grp) * R * k, b = e >> lbs;
    gcodes = a.packed + (e >> 1);
    grem = static_cast<std::uint32_t>(e) & ((1u << lbs) - 1);
    if (a.nested) {
      gabs = static_cast<const unsigned char*>(a.absmax) + b;
      gnest = a.nested_absmax + (b >> lnbs);
      gnrem = static_cast<std::uint32_t>(b) & ((1u << lnbs) - 1);
    } else {
      gabs = reinterpret_cast<const unsigned char*>(static_cast<const float*>(a.absmax) + b);
    }
    const std::int64_t rows = n - grp * R;
    glive = rows < R ? static_cast<std::uint32_t>(rows) : R;
  };
  // A lane's first column in chunk `chunk`, kept inside the row: lanes past k (a partial last
  // chunk) load the row's last 32 columns instead, which compute never uses (it takes the
  // padding value for them). Loads need no predicate then.
  const std::uint32_t last_col = k - 32;
  const auto column = [&](std::uint32_t chunk) {
    const std::uint32_t col = chunk * kChunk + lane32;
    return col < last_col ? col : last_col;
  };
  // The codes and statistics of an item at column o of the group set_group last set. Rows past
  // n (the last group) load row glive - 1 again: their results are never stored, and each row's
  // sum depends on its own codes only. Straight-line loads, with the nested / flat and complete /
  // partial group choices made once per item (per row they cost about a sixth of the kernel's
  // instructions at m = 1, docs/PERFORMANCE_LOG.md "Where the product's time goes").
  const auto load_rows = [&](Stage<R>& s, std::uint32_t o, auto all_rows, auto nested) {
    const std::uint32_t t0 = grem + o;
    const std::uint8_t* cp = gcodes + (o >> 1);
    const std::uint64_t policy = item_evict_first_policy();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const std::uint32_t rr = decltype(all_rows)::value || static_cast<std::uint32_t>(r) < glive ? static_cast<std::uint32_t>(r) : glive - 1;
      s.codes[r] = load_stream16(cp + static_cast<std::uint64_t>(rr) * row_bytes, policy);
      const std::uint32_t b = (t0 + rr * k) >> lbs;
      if constexpr (decltype(nested)::value) {
        s.code[r] = __ldg(gabs + b);
        s.scale[r] = __ldg(gnest + ((gnrem + b) >> lnbs));
      } else {
        s.code[r] = 0;
        s.scale[r] = __ldg(reinterpret_cast<const float*>(gabs) + b);
      }
    }
  };
  using Yes = std::integral_constant<bool, true>;
  using No = std::integral_constant<bool, false>;
  const auto load = [&](Stage<R>& s, std::uint32_t o) {
    if (glive == R) {
      if (a.nested) load_rows(s, o, Yes{}, Yes{});
      else load_rows(s, o, Yes{}, No{});
    } else {
      if (a.nested) load_rows(s, o, No{}, Yes{});
      else load_rows(s, o, No{}, No{});
    }
  };

  const auto push = [&](float mine, std::uint32_t done) {
    if (lane < static_cast<unsigned>(V)) {
      float* at = stack;  // level 0, then one level up per merge
#pragma unroll 1
      for (std::uint32_t t = done; t & 1; t >>= 1, ++at) mine = __fadd_rn(*at, mine);
      *at = mine;
    }
  };

  // Ordered prefetch. ptxas gives the loop's global loads one scoreboard, and a wait on a
  // scoreboard is for all of its loads: a first use of this item's codes or x placed after the
  // next item's loads are issued also waits for those DRAM loads, which serialized the pipeline
  // (docs/PERFORMANCE_LOG.md, "The prefetch that waited for itself"). So every register loaded for
  // this item is used first, in a fold, and the next item's addresses depend on the fold through
  // a.opaque_zero, which ptxas cannot fold: the next loads issue after that wait, and nothing
  // before the next item waits on them. compute uses the fold too (its lane test): otherwise
  // ptxas sinks the fold into the branch that loads, and on the warp's last item, which loads
  // nothing, the first use of x or codes is in compute; the wait ptxas then puts there is in the
  // path that loads as well, after the next loads, and compute waits for the next item's DRAM
  // loads.
  constexpr int XR = (MM == 1 && !XS) ? x_units<XD>() : 0;  // 16-byte x units held per lane (m = 1)
  // fp32 x at m = 8 unstaged keeps the plain order: the registers the ordering holds would spill
  // there (sm_80 and sm_90).
  constexpr bool kOrdered = !(MM == 8 && XD == NF4_DTYPE_F32 && !XS);
  // The nested absmax is decoded in compute, after the next loads (its absmax code is in the fold
  // instead), so that the shared-table read and its two operations are not between this item's
  // data and the next item's loads. Not for fp32 x at m = 4 and 8: <4, f32, 2, false> spills.
  constexpr bool kLateScale = kOrdered && !(XD == NF4_DTYPE_F32 && MM >= 4);
  struct Ready {
    uint4 x[XR > 0 ? XR : 1];
    std::uint32_t after;  // 0, depending on every register loaded for this item
  };
  const auto scale_of = [&](const Stage<R>& s, int r) {
    return a.nested ? __fadd_rn(__fmul_rn(code2[s.code[r]], s.scale[r]), offset) : s.scale[r];
  };
  // The x of the item at `chunk` (m = 1, not staged). step issues it at the end of the step
  // before, so that it is in flight with that item's codes: one wait for both.
  const auto load_x = [&](Ready& q, std::uint32_t chunk) {
    if constexpr (XR > 0) {
      // Lanes past k read the row's last columns, never used.
      const uint4* p = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.x) + column(chunk) * x_size<XD>());
#pragma unroll
      for (int j = 0; j < XR; ++j) q.x[j] = __ldg(p + j);
    } else {
      (void)q, (void)chunk;
    }
  };
  // Ordered and not kLateScale: the rows' absmax replace s.scale (flat: it is the absmax already).
  const auto prepare = [&](Stage<R>& s, Ready& q) {
    std::uint32_t fold = 0;
    if constexpr (kOrdered) {
      if constexpr (kLateScale) {
#pragma unroll
        for (int r = 0; r < R; ++r) fold ^= s.codes[r].x ^ s.code[r] ^ __float_as_uint(s.scale[r]);
      } else {
        if (a.nested) {
#pragma unroll
          for (int r = 0; r < R; ++r) s.scale[r] = __fadd_rn(__fmul_rn(code2[s.code[r]], s.scale[r]), offset);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) fold ^= s.codes[r].x ^ __float_as_uint(s.scale[r]);
      }
    }
    if constexpr (XR > 0) {
#pragma unroll
      for (int j = 0; j < XR; ++j) fold ^= q.x[j].x;
    }
    q.after = kOrdered ? fold & a.opaque_zero : 0;
  };

  // Lanes past k (a partial last chunk) take the padding value. q.after (0) is in the lane test
  // (the fold's use on the path without next loads, above).
  const auto compute = [&](const Stage<R>& s, const Ready& q) {
    float node[V];
    if (c * kChunk + lane32 + q.after < k) {
      float am[R];
#pragma unroll
      for (int r = 0; r < R; ++r) am[r] = kOrdered && !kLateScale ? s.scale[r] : scale_of(s, r);
      float half[V], left[V];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float xv[MM][8];
#pragma unroll
        for (int m = 0; m < MM; ++m) {
          // Rows of x past a.m compute on row a.m - 1 (in memory, and their results are never
          // stored; each row's sums depend on its own x only): no predicated loads, no zeros.
          const int mx = MM == 1 || m == 0 ? m : m < a.m ? m : a.m - 1;
          uint4 u0, u1 = make_uint4(0, 0, 0, 0);
          if constexpr (XR > 0) {
            u0 = q.x[(XD == NF4_DTYPE_F32 ? 2 : 1) * w];
            if constexpr (XD == NF4_DTYPE_F32) u1 = q.x[2 * w + 1];
          } else if constexpr (XS) {
            const uint4* base = xs + ((mx * chunks + c) * XU) * kWarp + lane;
            if constexpr (XD == NF4_DTYPE_F32) {
              u0 = base[(2 * w) * kWarp];
              u1 = base[(2 * w + 1) * kWarp];
            } else {
              u0 = base[w * kWarp];
            }
          } else {
            const uint4* p = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(a.x) + (mx * k + c * kChunk + lane32) * x_size<XD>());
            u0 = __ldg(p + (XD == NF4_DTYPE_F32 ? 2 : 1) * w);
            if constexpr (XD == NF4_DTYPE_F32) u1 = __ldg(p + 2 * w + 1);
          }
          x_unpack8<XD>(u0, u1, xv[m]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const std::uint32_t cw = word_of(s.codes[r], w);
          float wt[8];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            // byte t of the word into bits 8..15, 8 * lane below it: the pair's byte address.
            const std::uint32_t off = __byte_perm(cw, lane8, 0x5504u | (static_cast<std::uint32_t>(t) << 4));
            const float2 pv = *reinterpret_cast<const float2*>(smem + off);
            wt[2 * t] = __fmul_rn(pv.x, am[r]);
            wt[2 * t + 1] = __fmul_rn(pv.y, am[r]);
          }
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            float p[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) p[e] = __fmul_rn(wt[e], xv[m][e]);
            const float t8 = tree8(p);
            const int v = r * MM + m;
            if (w == 0) half[v] = t8;
            else if (w == 1) left[v] = __fadd_rn(half[v], t8);
            else if (w == 2) half[v] = t8;
            else node[v] = __fadd_rn(left[v], __fadd_rn(half[v], t8));
          }
        }
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) node[v] = pad;
    }
    // The transposed butterfly: level j pairs lane L with L ^ 2^j, whose subtrees are siblings.
#pragma unroll
    for (int j = 0; j < kLogV; ++j) {
      const int cnt = V >> j;
      const bool upper = (lane >> j) & 1u;
#pragma unroll
      for (int i = 0; i < cnt / 2; ++i) {
        const float keep = upper ? node[i + cnt / 2] : node[i];
        const float send = upper ? node[i] : node[i + cnt / 2];
        node[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 1 << j));
      }
    }
#pragma unroll
    for (int j = kLogV; j < 5; ++j) node[0] = __fadd_rn(node[0], __shfl_xor_sync(0xffffffffu, node[0], 1 << j));
    push(node[0], c - lo);
  };

  const auto finish = [&]() {
#pragma unroll 1
    for (std::uint32_t done = hi > lo ? hi - lo : 0; done < span; ++done) push(pad, done);
    const int r = my_v / MM, m = my_v % MM;
    const std::int64_t row = g * R + r;
    const bool writes = lane < static_cast<unsigned>(V) && m < a.m && row < n;
    if (split == 1) {
      if (writes) store_value(stack[top], a.y, static_cast<std::int64_t>(m) * n + row, a.y_dtype);
    } else {
      team_barrier(team, split);  // every part's root is on its stack
      if (part == 0 && writes) {
        float root[kGemvMaxSplit];
#pragma unroll
        for (int q = 0; q < kGemvMaxSplit; ++q)
          if (q < static_cast<int>(split)) root[q] = stack[static_cast<std::size_t>(q) * V * kStackDepth + top];
#pragma unroll
        for (int w = 1; w < kGemvMaxSplit; w <<= 1)
#pragma unroll
          for (int q = 0; q < kGemvMaxSplit; q += 2 * w)
            if (q < static_cast<int>(split) && w < static_cast<int>(split)) root[q] = __fadd_rn(root[q], root[q + w]);
        store_value(root[0], a.y, static_cast<std::int64_t>(m) * n + row, a.y_dtype);
      }
      team_barrier(team, split);  // part 0 has read the roots before the stacks are reused
    }
    __syncwarp();  // the stacks are reused by the next group
  };

  // One item: load the next item's codes, compute this one; the two stages alternate roles.
  // What the next step needs before its loads is done at the end of this one, while the next
  // item's codes are in flight: its x (m = 1, not staged) and, where the item after it starts a
  // row group, whether there is one (more) and its bases (set_group). A step thus goes from its
  // item's data to the next item's loads through the fold (and, without kLateScale, the absmax
  // decode) and 32-bit offsets only, also where the next item is the first of a row group.
  Ready q;
  bool more = true;  // whether the step about to run loads a next item
  const auto advance = [&]() {
    if (c + 1 == hi) {
      more = g + stride < groups;
      if (more) set_group(g + stride);
    }
  };
  const auto step = [&](Stage<R>& now, Stage<R>& next) {
    const bool last = c + 1 == hi, loads = more;
    const std::uint32_t nc = last ? lo : c + 1;
    prepare(now, q);
    if (loads) load(next, column(nc) + q.after);
    compute(now, q);
    if (last) {
      finish();
      g += stride;
    }
    c = nc;
    if (loads) {
      load_x(q, c);
      advance();
    }
    return loads;
  };

  if (lo >= chunks) {  // a part of padding chunks only: its root is the padding value, no loads
#pragma unroll 1
    for (; g < groups; g += stride) finish();
    return;
  }
  Stage<R> s0, s1;
  set_group(g);
  load(s0, column(lo));
  load_x(q, lo);
  if (a.nested) offset = a.offset_ptr ? __ldg(a.offset_ptr) : a.offset_value;
  advance();
#pragma unroll 1
  for (;;) {
    if (!step(s0, s1)) break;
    if (!step(s1, s0)) break;
  }
  }  // variant_compiled
}

// Per kernel and device: the dynamic shared memory allowance is raised once; the occupancy of a
// (threads, shared bytes) shape is computed once.
struct LaunchCache {
  std::mutex mu;
  bool raised[64] = {};
  struct Entry {
    int device, threads;
    std::size_t smem;
    int blocks;
    bool waits;  // the code waits for the previous grid (pdl.h)
  } entries[16];
  int count = 0;
};

template <int MM, nf4_dtype XD, int R, bool XS>
std::size_t shared_bytes(const GemvArgs& a, const GemvFastTuning& t) {
  const std::int64_t chunks = (a.k + kChunk - 1) / kChunk;
  std::size_t smem = kPairBytes + 256 * sizeof(float) + static_cast<std::size_t>(t.threads / kWarp) * MM * R * kStackDepth * sizeof(float);
  if (XS) smem += static_cast<std::size_t>(a.m) * chunks * kChunk * x_size<XD>();
  return smem;
}

template <int MM, nf4_dtype XD, int R, bool XS>
cudaError_t plan_fast(GemvArgs& a, const GemvFastTuning& t, int sms, GemvKernelLaunch* out) {
  static LaunchCache cache;
  const void* fn = reinterpret_cast<const void*>(&gemv_fast_kernel<MM, XD, R, XS>);
  const int warps = t.threads / kWarp;
  const std::size_t smem = shared_bytes<MM, XD, R, XS>(a, t);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  int blocks = 0;
  bool pdl = false;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    for (int i = 0; i < cache.count; ++i) {
      const auto& en = cache.entries[i];
      if (en.device == device && en.threads == t.threads && en.smem == smem) blocks = en.blocks, pdl = en.waits;
    }
    if (blocks == 0) {
      if (device >= 64) return cudaErrorInvalidDevice;
      // The code the driver runs for this device was compiled for attr.ptxVersion: below sm_80
      // (a build of compute_75 PTX only, JIT-compiled for a newer GPU) this variant is the trap
      // stub, so the plan falls back to gemv.cu's kernel.
      cudaFuncAttributes attr{};
      if (cudaError_t e = cudaFuncGetAttributes(&attr, fn); e != cudaSuccess) return e;
      if (attr.ptxVersion < 80) return cudaErrorInvalidConfiguration;
      if (!cache.raised[device]) {
        int optin = 0;
        if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device); e != cudaSuccess) return e;
        if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin); e != cudaSuccess) return e;
        cache.raised[device] = true;
      }
      if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, t.threads, smem); e != cudaSuccess) return e;
      if (blocks < 1) return cudaErrorInvalidConfiguration;
      pdl = ptx_waits_for_previous_grid(attr.ptxVersion);
      if (cache.count < 16) cache.entries[cache.count++] = {device, t.threads, smem, blocks, pdl};
    }
  }
  const std::int64_t groups = (a.n + R - 1) / R;
  const int split = gemv_split(groups, (a.k + kChunk - 1) / kChunk, warps, static_cast<std::int64_t>(blocks) * sms * warps, t.split, kGemvMaxSplit);
  a.log2_split = static_cast<std::uint8_t>(ilog2(split));
  const int teams = warps / split;
  std::int64_t grid = std::min<std::int64_t>((groups + teams - 1) / teams, static_cast<std::int64_t>(blocks) * sms);
  grid = std::max<std::int64_t>(grid, 1);
  *out = GemvKernelLaunch{fn, static_cast<unsigned>(grid), static_cast<unsigned>(t.threads), smem};
  out->pdl = pdl;
  return cudaSuccess;
}

template <nf4_dtype XD, int MM, int R>
cudaError_t plan_xs(GemvArgs& a, const GemvFastTuning& t, int sms, GemvKernelLaunch* out) {
  // x in shared memory when the tuning allows its size and the device the CTA's total.
  const std::int64_t chunks = (a.k + kChunk - 1) / kChunk;
  const std::int64_t x_bytes = static_cast<std::int64_t>(a.m) * chunks * kChunk * x_size<XD>();
  int device = 0, optin = 0, major = 0, minor = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device); e != cudaSuccess) return e;
  const int bucket = MM == 1 ? 0 : MM == 2 ? 1 : MM == 4 ? 2 : 3;
  // Staging costs every CTA one pass over x before its first row. At m = 1 that pays only where
  // each warp of two CTAs per SM has at least one row group to walk (H100: 5-10% at 14336x4096
  // and 28672x8192, 4% lost at 4096x4096; docs/PERFORMANCE_LOG.md, "kGemvFastTuning").
  const bool rows_to_amortize = MM > 1 || (a.n + R - 1) / R >= static_cast<std::int64_t>(sms) * 2 * (t.threads / kWarp);
  if (rows_to_amortize && x_bytes <= t.x_shared_max[bucket] && variant_has_code<MM, true>(100 * major + 10 * minor) &&
      shared_bytes<MM, XD, R, true>(a, t) <= static_cast<std::size_t>(optin))
    return plan_fast<MM, XD, R, true>(a, t, sms, out);
  if (shared_bytes<MM, XD, R, false>(a, t) > static_cast<std::size_t>(optin)) return cudaErrorInvalidConfiguration;
  return plan_fast<MM, XD, R, false>(a, t, sms, out);
}

template <nf4_dtype XD, int MM, int... Rs>
cudaError_t plan_r(GemvArgs& a, const GemvFastTuning& t, int r, int sms, GemvKernelLaunch* out) {
  cudaError_t result = cudaErrorInvalidValue;
  ((r == Rs ? (result = plan_xs<XD, MM, Rs>(a, t, sms, out), true) : false) || ...);
  return result;
}

template <nf4_dtype XD>
cudaError_t plan_dtype(GemvArgs& a, const GemvFastTuning& t, int sms, GemvKernelLaunch* out) {
  if (a.m <= 1) return plan_r<XD, 1, GEMV_FAST_ROWS_M1>(a, t, t.rows[0], sms, out);
  if (a.m <= 2) return plan_r<XD, 2, GEMV_FAST_ROWS_M2>(a, t, t.rows[1], sms, out);
  if (a.m <= 4) return plan_r<XD, 4, GEMV_FAST_ROWS_M4>(a, t, t.rows[2], sms, out);
  return plan_r<XD, 8, GEMV_FAST_ROWS_M8>(a, t, t.rows[3], sms, out);
}

template <int... Rs>
constexpr bool has_rows(int r) {
  return ((r == Rs) || ...);
}

}  // namespace

bool gemv_fast_has_variant(const GemvFastTuning& t) {
  const bool split_ok = t.split >= 0 && t.split <= kGemvMaxSplit && (t.split & (t.split - 1)) == 0;
  return split_ok && t.threads >= 32 && t.threads <= kMaxThreads && t.threads % kWarp == 0 && has_rows<GEMV_FAST_ROWS_M1>(t.rows[0]) &&
         has_rows<GEMV_FAST_ROWS_M2>(t.rows[1]) && has_rows<GEMV_FAST_ROWS_M4>(t.rows[2]) && has_rows<GEMV_FAST_ROWS_M8>(t.rows[3]);
}

cudaError_t plan_gemv_fast(GemvArgs& a, nf4_dtype x_dtype, const GemvFastTuning& t, int sms, GemvKernelLaunch* out) {
  if (!a.vector || !gemv_fast_has_variant(t) || a.m < 1 || a.m > 8) return cudaErrorInvalidValue;
  if (!find_dtype(static_cast<std::int32_t>(x_dtype))) return cudaErrorInvalidValue;
  if (a.k > kFastMaxK) return cudaErrorInvalidConfiguration;
  return dispatch_product_dtype(x_dtype, [&](auto d) { return plan_dtype<decltype(d)::value>(a, t, sms, out); });
}

}  // namespace nf4::cuda
