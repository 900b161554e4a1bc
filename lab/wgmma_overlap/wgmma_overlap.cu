// SPDX-License-Identifier: MIT
// wgmma_overlap: what a chunk of the fast product's warpgroup kernel costs, piece by piece (sm_90a).
//
// The warpgroup kernel (backends/cuda/gemv_mma_wgmma.cuh) decodes each 16-column step's A fragment in
// registers (four pair-table loads from shared memory, eight fp32 multiplies, four packs), feeds it
// to `wgmma m64nNk16` with x from shared memory, and stages x per chunk. This bench times the same
// loop over a chunk (128 rows x 128 columns x N tokens, two warpgroups of 64 rows, 8 steps) with the
// decode only, the MMAs only, both, the table's loads made ALU work, a barrier per chunk, x staged
// through registers as the kernel did, with half the L2 reads or CTAs apart in k, and x filled by a
// bulk copy from a laid-out image, with A through shared memory (decoded, stored, a warpgroup
// barrier, then an MMA reading both operands there), in pairs of steps, and with the roles apart (one warpgroup issuing every MMA, the other decoding), at N = 64, 128 and
// 256; the L2's read rate for x's pattern; and at 256 tokens the bulk copies moved toward the
// 256-token form's (a 14.7 MB image, copies of one step, from each warp, on 128-byte lines) and
// its codes read from device memory (a chunk ahead, with or without an L2 prefetch).
// One CTA per SM, as the kernel runs; values are arbitrary, the result only a sink. The findings
// are in docs/PERFORMANCE_LOG.md ("What a warpgroup chunk costs, piece by piece").
//
//   (from the repository's root)
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -o wgmma_overlap lab/wgmma_overlap/wgmma_overlap.cu
//   ./wgmma_overlap [chunks per CTA, 4000] [copies: the 256-token copy and codes factors only]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <cstdio>
#include <vector>

#include "backends/cuda/bulk_copy.cuh"
#include "lab/wgmma_overlap/wgmma_shapes.h"

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

constexpr int kThreads = 256;
constexpr int kTableBytes = 256 * 32 * 8;  // the kernel's pair table: 32 copies of 256 pairs
template <int N>
constexpr int kStepBytes = (N / 8) * 256 + 16;
template <int N>
constexpr int kStageBytes = 8 * kStepBytes<N>;
constexpr int kCodeWords = 4;  // uint4s of codes per lane in the emulated ring
constexpr int kXChunks = 32;   // x: 256 tokens by 32 chunks of 128 columns, read from L2

// What the loop does, as bits: DECODE the A fragments (four pair-table loads, eight multiplies,
// four packs per step), run the MMAs, NO_TABLE (the table's loads replaced by two ALU operations
// each: what their shared-memory traffic costs), STAGE_X (x for the next chunk loaded into
// registers and stored into the other of two stages in the warpgroup kernel's layout, a barrier
// per chunk, as the kernel stages x), SYNC (only the barrier per chunk), HALF_X (with STAGE_X:
// half the units loaded, each stored twice: the stage filled with half the reads from L2, as two
// CTAs sharing x would), SPREAD_X (with STAGE_X: each CTA reads another chunk than its neighbours
// at a time, as CTAs on different parts of k do, instead of all the same lines at once), BULK_X
// (x's next chunk copied as one block by the copy engine, cp.async.bulk completing on an mbarrier,
// from an x laid out beforehand as the stage's image: no registers, no stores; a barrier per chunk.
// The copy goes to the other of two stages, which the other warpgroup's last MMAs of the chunk
// before may still read: a race on the values, which a timing does not care about), SMEM_A (the
// MMAs take A from shared memory: each step's decoded fragment is stored there, four words per
// thread, and the warpgroup meets at a named barrier before its MMA reads them; whether the decode
// then overlaps the MMAs, which it does not with A from registers at 64 tokens), PAIRS (with
// DECODE and MMA, RING 4: two steps' fragments decoded, then one fence, their two MMAs and one
// commit, waiting for the pair before last: fewer fences and waits, more independent decode;
// without the fence ptxas injects the warpgroup arrive itself, C7519: an MMA that reads registers
// written since the last one needs it), ROLES (N <= 128: warpgroup 0
// issues both warpgroups' MMAs, two accumulator sets, with fragments it does not decode;
// warpgroup 1 decodes both warpgroups' fragments and keeps only their bits; no barrier between
// them: whether the decode overlaps MMAs that other warps issue; without MMA, warpgroup 0 idles:
// the decode on four warps alone), BIG_X (with BULK_X: the copies' source walks an image of
// kBigChunks chunks, 14.7 MB at 256 tokens, as the 256-token form's at 8192x28672, where BULK_X
// alone cycles over 4 chunks), STEP_X (with BULK_X: each chunk as eight copies of one k16 step,
// 8 KB at 256 tokens, as the 256-token form copies them, instead of one), WARP_X (with STEP_X: step
// s's copy issued by warp s's first lane instead of all eight by thread 0: whether issuing the
// copies is what the one warp's MMAs wait for), ALIGN_X (with STEP_X: the copies 8 KB apart in
// the image and the stage, each on 128-byte lines, where the stage's 16-byte pads put step s's copy
// 16 s bytes past one; the MMAs read the padded steps as before: a timing only), DRAM_CODES (the
// codes from a weight of 8192 rows by 28672 columns in device memory, as the 256-token form reads
// them at 8192x28672: each lane 16 bytes of two rows a chunk, loaded a chunk ahead with a streaming
// hint, CTA b on row block b % 64 from chunk 112 (b / 64) on, where the other modes read a ring in
// shared memory), PREFETCH_CODES (with DRAM_CODES: each lane also asks the L2 for its rows' lines
// three chunks ahead).
enum Mode : int {
  kDecode = 1, kMma = 2, kNoTable = 4, kStageX = 8, kSync = 16, kHalfX = 32, kSpreadX = 64, kBulkX = 128, kSmemA = 256, kPairs = 512, kRoles = 1024,
  kBigX = 2048, kStepX = 4096, kWarpX = 8192, kAlignX = 16384, kDramCodes = 32768, kPrefetchCodes = 65536
};
constexpr int kBigChunks = 224;  // 28672 columns
// DRAM_CODES's weight: 8192 rows of 28672 codes (14336 bytes), 64 blocks of 128 rows.
constexpr int kWRowBytes = 28672 / 2, kWRowBlocks = 64;
constexpr std::size_t kWBytes = std::size_t{kWRowBlocks} * 128 * kWRowBytes;
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

template <int N>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint32_t desc_lo, std::uint32_t desc_hi) {
  if constexpr (N == 64) WGMMA_N64("bf16");
  if constexpr (N == 128) WGMMA_N128("bf16");
  if constexpr (N == 256) WGMMA_N256("bf16");
}
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], std::uint32_t a_lo, std::uint32_t a_hi, std::uint32_t desc_lo, std::uint32_t desc_hi) {
  if constexpr (N == 64) WGMMA_SS_N64("bf16");
  if constexpr (N == 128) WGMMA_SS_N128("bf16");
  if constexpr (N == 256) WGMMA_SS_N256("bf16");
}
template <int W>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(W) : "memory");
}

struct Pairs {
  float2 p0, p1, q0, q1;
};
template <bool kTable>
__device__ __forceinline__ float2 entry(const unsigned char* table, std::uint32_t address) {
  if constexpr (kTable) return *reinterpret_cast<const float2*>(table + address);
  return make_float2(__uint_as_float((address << 4) | 0x3F000000u), __uint_as_float((address << 7) ^ 0xBF000000u));
}
template <bool kTable = true>
__device__ __forceinline__ Pairs lookup(const unsigned char* table, const uint4& lo, const uint4& hi, std::uint32_t lane_off, int s) {
  const std::uint32_t wl = s < 2 ? lo.x : s < 4 ? lo.y : s < 6 ? lo.z : lo.w;
  const std::uint32_t wh = s < 2 ? hi.x : s < 4 ? hi.y : s < 6 ? hi.z : hi.w;
  const unsigned b0 = (s & 1) * 2, sel0 = 0x5504u | (b0 << 4), sel1 = 0x5504u | ((b0 + 1) << 4);
  Pairs e;
  e.p0 = entry<kTable>(table, __byte_perm(wl, lane_off, sel0));
  e.p1 = entry<kTable>(table, __byte_perm(wl, lane_off, sel1));
  e.q0 = entry<kTable>(table, __byte_perm(wh, lane_off, sel0));
  e.q1 = entry<kTable>(table, __byte_perm(wh, lane_off, sel1));
  return e;
}
__device__ __forceinline__ void finish(const Pairs& e, float al, float ah, std::uint32_t (&f)[4]) {
  f[0] = pack_bf16(__fmul_rn(e.p0.x, al), __fmul_rn(e.p0.y, al));
  f[1] = pack_bf16(__fmul_rn(e.q0.x, ah), __fmul_rn(e.q0.y, ah));
  f[2] = pack_bf16(__fmul_rn(e.p1.x, al), __fmul_rn(e.p1.y, al));
  f[3] = pack_bf16(__fmul_rn(e.q1.x, ah), __fmul_rn(e.q1.y, ah));
}

// RING: A fragments in registers (the MMAs queued: wait until at most RING - 1 are in flight).
template <int N, int MODE, int RING>
__global__ void __launch_bounds__(kThreads, 1) overlap_kernel(int chunks, const unsigned short* x, const unsigned short* big, const unsigned char* wcodes,
                                                                float* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* table = smem;
  unsigned char* xs = smem + kTableBytes;
  uint4* codes = reinterpret_cast<uint4*>(xs + 2 * kStageBytes<N>);
  const unsigned tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  std::uint32_t seed = tid * 2654435761u + blockIdx.x;
  for (unsigned i = tid; i < kTableBytes / 4; i += kThreads) reinterpret_cast<float*>(table)[i] = static_cast<float>((i * 37u) % 16) * 0.125f - 1.0f;
  for (unsigned i = tid; i < 2 * kStageBytes<N> / 4; i += kThreads) reinterpret_cast<std::uint32_t*>(xs)[i] = 0x3F803F80u ^ (i & 0x00070007u);
  for (unsigned i = tid; i < kCodeWords * 2 * kThreads; i += kThreads) {
    seed = seed * 1664525u + 1013904223u;
    codes[i] = make_uint4(seed, seed * 3u, seed * 5u, seed * 7u);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const std::uint32_t lane_off = 8 * lane;
  const unsigned xs_addr = static_cast<unsigned>(__cvta_generic_to_shared(xs));
  const std::uint32_t desc0 = ((xs_addr & 0x3FFFFu) >> 4) | ((128u >> 4) << 16), desc_hi = 256 >> 4;
  float acc[N / 2];
  [[maybe_unused]] float acc2[(MODE & kRoles) != 0 ? N / 2 : 1];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  if constexpr ((MODE & kRoles) != 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc2[i] = 0.0f;
  }
  std::uint32_t af[RING][4];
#pragma unroll
  for (int r = 0; r < RING; ++r) af[r][0] = af[r][1] = af[r][2] = af[r][3] = 0x3F803F80u ^ (tid + r);
  std::uint32_t sink_bits = 0;
  float al = 0.5f + tid * 1e-3f, ah = 0.25f + tid * 1e-3f;
  constexpr bool kDo = MODE & kDecode, kMm = MODE & kMma, kTable = !(MODE & kNoTable), kX = MODE & kStageX;
  // STAGE_X: this thread's 16-byte units of x (column 8u .. 8u + 7 of token rows tid / 16 + 16 i),
  // each stored as four words at the places the kernel's layout gives them.
  constexpr int kUnits = N * 16 / kThreads;
  const unsigned my_u = tid % 16, ut = my_u / 4, uq = my_u % 4;
  uint4 xr[kX ? kUnits : 1];
  constexpr int kLoaded = MODE & kHalfX ? kUnits / 2 : kUnits;
  const auto load_x = [&](int c) {
    if constexpr (kX) {
      const int base = ((MODE & kSpreadX ? c + 5 * static_cast<int>(blockIdx.x) : c) % kXChunks) * 128;
#pragma unroll
      for (int i = 0; i < kLoaded; ++i) xr[i] = __ldg(reinterpret_cast<const uint4*>(x + (tid / 16 + 16 * i) * (kXChunks * 128) + base + 8 * my_u));
    }
  };
  const auto store_x = [&](int stage) {
    if constexpr (kX) {
#pragma unroll
      for (int i = kLoaded; i < kUnits; ++i) xr[i] = xr[i - kLoaded];
      unsigned char* st = xs + stage * kStageBytes<N>;
#pragma unroll
      for (int i = 0; i < kUnits; ++i) {
        const unsigned r = tid / 16 + 16 * i;
        unsigned char* q = st + (2 * uq) * kStepBytes<N> + (r / 8) * 256 + (r % 8) * 16 + 4 * ut;
        *reinterpret_cast<std::uint32_t*>(q) = xr[i].x;
        *reinterpret_cast<std::uint32_t*>(q + 128) = xr[i].y;
        *reinterpret_cast<std::uint32_t*>(q + kStepBytes<N>) = xr[i].z;
        *reinterpret_cast<std::uint32_t*>(q + kStepBytes<N> + 128) = xr[i].w;
      }
    }
  };
  constexpr bool kBulk = MODE & kBulkX;
  const unsigned bar = static_cast<unsigned>(__cvta_generic_to_shared(codes + kCodeWords * 2 * kThreads));
  // SMEM_A: per warpgroup RING slots of a step's A (64 rows x 16 k, 2 KB), 256-byte aligned.
  constexpr bool kSs = MODE & kSmemA;
  const unsigned a_region = (bar + 16 + 255) & ~255u, wg = tid / 128;
  const auto bulk_copy = [&](int c, int stage) {
    const unsigned short* src = (MODE & kBigX) != 0 ? big + static_cast<std::size_t>(c % kBigChunks) * (kStageBytes<N> / 2)
                                                     : x + static_cast<std::size_t>(c % 4) * (kStageBytes<N> / 2);
    constexpr unsigned kStride = (MODE & kAlignX) != 0 ? kStepBytes<N> - 16 : kStepBytes<N>;  // between step copies
    static_assert((MODE & (kWarpX | kAlignX)) == 0 || (MODE & kStepX) != 0, "warp and aligned copies: one step each");
    // STEP_X: step s's 8 KB, kStride apart in the image and the stage.
    const auto copy_step = [&](unsigned s) {
      nf4::cuda::bulk_copy_to_shared(xs_addr + stage * kStageBytes<N> + s * kStride, src + s * (kStride / 2), kStepBytes<N> - 16, bar);
    };
    if constexpr ((MODE & kWarpX) != 0) {
      if (tid % 32 == 0) copy_step(tid / 32);
    } else if (tid == 0) {
      if constexpr ((MODE & kStepX) != 0) {
        for (unsigned s = 0; s < 8; ++s) copy_step(s);
      } else {
        nf4::cuda::bulk_copy_to_shared(xs_addr + stage * kStageBytes<N>, src, kStageBytes<N>, bar);
      }
    }
  };
  if constexpr (kBulk) {
    if (tid == 0) {
      nf4::cuda::mbarrier_init(bar, (MODE & kStepX) != 0 ? 8 : 1);  // one arrival per copy
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    bulk_copy(0, 0);
  }
  // DRAM_CODES: the lane's 16 bytes of row h (0: g, 1: g + 8 of its warp's 16) in chunk c.
  const std::size_t w_row = (static_cast<std::size_t>(blockIdx.x % kWRowBlocks) * 128 + 16 * warp + lane / 4) * kWRowBytes;
  const int w_c0 = static_cast<int>(blockIdx.x / kWRowBlocks) * 112;
  const auto w_at = [&](int c, int h) {
    return reinterpret_cast<const uint4*>(wcodes + w_row + static_cast<std::size_t>(h) * 8 * kWRowBytes + ((w_c0 + c) % kBigChunks) * 64 + 16 * (lane % 4));
  };
  [[maybe_unused]] uint4 w_lo = make_uint4(0, 0, 0, 0), w_hi = w_lo;
  if constexpr ((MODE & kDramCodes) != 0) w_lo = __ldcs(w_at(0, 0)), w_hi = __ldcs(w_at(0, 1));
  load_x(0);
  for (int c = 0; c < chunks; ++c) {
    const int stage = kX || kBulk ? c % 2 : 0;
    if constexpr (kBulk) {
      // Chunk c's stage has landed (phase c of the barrier); every thread sees it before the
      // barrier below, after which chunk c + 1's copy starts (so no thread waits for a phase that
      // has come round again).
      nf4::cuda::mbarrier_wait(bar, static_cast<unsigned>(c & 1));
    }
    if constexpr (MODE & (kStageX | kSync | kBulkX)) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
    }
    if constexpr (kBulk) {
      if (c + 1 < chunks) bulk_copy(c + 1, stage ^ 1);
    }
    const unsigned slot = (c % kCodeWords) * 2 * kThreads + warp * 64 + lane;
    uint4 lo, hi;
    if constexpr ((MODE & kDramCodes) != 0) {
      lo = w_lo, hi = w_hi;
      if (c + 1 < chunks) w_lo = __ldcs(w_at(c + 1, 0)), w_hi = __ldcs(w_at(c + 1, 1));
      if constexpr ((MODE & kPrefetchCodes) != 0) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w_at(c + 3, 0)));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w_at(c + 3, 1)));
      }
    } else {
      lo = codes[slot], hi = codes[slot + 32];
    }
    [[maybe_unused]] uint4 lo2, hi2;  // ROLES: the other warpgroup's codes
    if constexpr ((MODE & kRoles) != 0) {
      const unsigned other = (slot + 4 * 64) % (kCodeWords * 2 * kThreads);
      lo2 = codes[other], hi2 = codes[other + 32];
    }
    Pairs ahead0, ahead1;
    if constexpr (kDo) ahead0 = lookup<kTable>(table, lo, hi, lane_off, 0), ahead1 = lookup<kTable>(table, lo, hi, lane_off, 1);
    load_x(c + 1);
    const std::uint32_t desc_stage = desc0 + stage * (kStageBytes<N> >> 4);
    if constexpr ((MODE & kRoles) != 0) {
      static_assert(N <= 128 && kDo, "roles: two accumulator sets of N / 2, the decode in warpgroup 1");
      if (wg == 0) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          if constexpr (kMm) {
            wgmma_wait<RING - 1>();
            std::uint32_t(&f)[4] = af[s % RING];
            f[0] ^= static_cast<std::uint32_t>(c);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wgmma<N>(acc, f, desc_stage + s * (kStepBytes<N> >> 4), desc_hi);
            wgmma<N>(acc2, f, desc_stage + s * (kStepBytes<N> >> 4), desc_hi);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          }
        }
      } else {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          std::uint32_t f[4], g[4];
          const Pairs e = ahead0;
          ahead0 = ahead1;
          if (s + 2 < 8) ahead1 = lookup<kTable>(table, lo, hi, lane_off, s + 2);
          finish(e, al, ah, f);
          // The other warpgroup's fragment: its rows' codes (the next slot's), the same work.
          const Pairs e2 = lookup<kTable>(table, lo2, hi2, lane_off, s);
          finish(e2, ah, al, g);
          sink_bits ^= f[0] ^ f[1] ^ f[2] ^ f[3] ^ g[0] ^ g[1] ^ g[2] ^ g[3];
        }
      }
    }
    if constexpr ((MODE & kPairs) != 0) {
      static_assert(RING == 4 && kDo && kMm, "pairs of steps: decode and MMA, four fragments");
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const Pairs e0 = ahead0, e1 = ahead1;
        if (q < 3) ahead0 = lookup<kTable>(table, lo, hi, lane_off, 2 * q + 2), ahead1 = lookup<kTable>(table, lo, hi, lane_off, 2 * q + 3);
        wgmma_wait<1>();  // the pair before last (the same fragments) is done
        std::uint32_t(&f0)[4] = af[(2 * q) % 4];
        std::uint32_t(&f1)[4] = af[(2 * q + 1) % 4];
        finish(e0, al, ah, f0);
        finish(e1, al, ah, f1);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wgmma<N>(acc, f0, desc_stage + (2 * q) * (kStepBytes<N> >> 4), desc_hi);
        wgmma<N>(acc, f1, desc_stage + (2 * q + 1) * (kStepBytes<N> >> 4), desc_hi);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      }
    }
#pragma unroll
    for (int s = 0; s < ((MODE & (kPairs | kRoles)) != 0 ? 0 : 8); ++s) {
      std::uint32_t(&f)[4] = af[s % RING];
      if constexpr (kDo) {
        const Pairs e = ahead0;
        ahead0 = ahead1;
        if (s + 2 < 8) ahead1 = lookup<kTable>(table, lo, hi, lane_off, s + 2);
        if constexpr (kMm) wgmma_wait<RING - 1>();
        finish(e, al, ah, f);
      } else {
        wgmma_wait<RING - 1>();
        f[0] ^= static_cast<std::uint32_t>(c);
      }
      if constexpr (kMm && kSs) {
        const unsigned a_slot = a_region + (wg * RING + s % RING) * 2048;
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a_slot + (tid % 128) * 16), "r"(f[0]), "r"(f[1]), "r"(f[2]), "r"(f[3]) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wgmma_ss<N>(acc, ((a_slot & 0x3FFFFu) >> 4) | ((128u >> 4) << 16), 256 >> 4, desc_stage + s * (kStepBytes<N> >> 4), desc_hi);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      } else if constexpr (kMm) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wgmma<N>(acc, f, desc_stage + s * (kStepBytes<N> >> 4), desc_hi);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      } else {
        sink_bits ^= f[0] ^ f[1] ^ f[2] ^ f[3];
      }
    }
    // The other stage was read by the last chunk's MMAs, all complete by the waits above.
    store_x(stage ^ 1);
    al = al * 1.0000001f;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc[i])::"memory");  // reads after the wait
  float total = __uint_as_float(sink_bits & 0x007FFFFFu);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) total += acc[i];
  if constexpr ((MODE & kRoles) != 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc2[i])::"memory");
#pragma unroll
    for (int i = 0; i < N / 2; ++i) total += acc2[i];
  }
  if (total == 12345.678f) sink[blockIdx.x * kThreads + tid] = total;  // never true; keeps the work
}

std::string mode_name(int mode) {
  std::string s = mode & kDecode ? (mode & kNoTable ? "alu-decode" : "decode") : "";
  if (mode & kMma) s += s.empty() ? "mma" : "+mma";
  if (mode & kStageX) s += "+x";
  if (mode & kSync) s += "+sync";
  if (mode & kHalfX) s += "(half)";
  if (mode & kSpreadX) s += "(spread)";
  if (mode & kBulkX) s += "+x by bulk copy";
  if (mode & kBigX) s += "(14.7 MB image)";
  if (mode & kStepX) s += mode & kWarpX ? "(8 copies, one a warp)" : "(8 copies)";
  if (mode & kAlignX) s += "(on 128-byte lines)";
  if (mode & kDramCodes) s += mode & kPrefetchCodes ? "+codes from DRAM, L2 prefetch 3 ahead" : "+codes from DRAM";
  if (mode & kSmemA) s += " (A from shared memory)";
  if (mode & kPairs) s += " (pairs of steps)";
  if (mode & kRoles) s += " (roles: MMAs in warpgroup 0, decode in 1)";
  return s;
}

template <int N, int MODE, int RING>
float time_us_per_chunk(int sms, int chunks, const unsigned short* x, float* sink, const unsigned short* big = nullptr,
                        const unsigned char* wcodes = nullptr) {
  const auto kernel = overlap_kernel<N, MODE, RING>;
  const int smem = kTableBytes + 2 * kStageBytes<N> + kCodeWords * 2 * kThreads * 16 + 16 + (MODE & kSmemA ? 256 + 2 * RING * 2048 : 0);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  kernel<<<sms, kThreads, smem>>>(chunks, x, big, wcodes, sink);  // warm-up
  CHECK(cudaGetLastError());
  std::vector<float> t;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    kernel<<<sms, kThreads, smem>>>(chunks, x, big, wcodes, sink);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f / chunks);
  }
  std::sort(t.begin(), t.end());
  cudaFuncAttributes attr{};
  CHECK(cudaFuncGetAttributes(&attr, kernel));
  std::printf("N=%3d ring=%d %-12s %7.3f us/chunk  (regs %d, local %zu B)\n", N, RING,
              mode_name(MODE).c_str(), t[2], attr.numRegs, attr.localSizeBytes);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return t[2];
}

// The L2's read ceiling for x's pattern: every CTA reads 16-byte units of the L2-resident x, its
// own sequence of chunks, nothing else.
__global__ void __launch_bounds__(kThreads, 1) l2_read_kernel(int chunks, const unsigned short* x, float* sink) {
  uint4 v = make_uint4(0, 0, 0, 0);
  for (int c = 0; c < chunks; ++c) {
    const int base = ((c + 5 * static_cast<int>(blockIdx.x)) % kXChunks) * 128;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(x + (threadIdx.x / 16 + 16 * i) * (kXChunks * 128) + base + 8 * (threadIdx.x % 16)));
      v.x ^= u.x, v.y ^= u.y, v.z ^= u.z, v.w ^= u.w;
    }
  }
  if ((v.x ^ v.y ^ v.z ^ v.w) == 0x12345678u) sink[blockIdx.x * kThreads + threadIdx.x] = 1.0f;
}

void l2_ceiling(int sms, int chunks, const unsigned short* x, float* sink) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  l2_read_kernel<<<sms, kThreads>>>(chunks, x, sink);
  std::vector<float> t;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    l2_read_kernel<<<sms, kThreads>>>(chunks, x, sink);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  const double bytes = double(sms) * chunks * 256 * 128 * 2;
  std::printf("L2 reads of x's pattern (256 tokens x 128 columns a chunk per CTA): %.2f TB/s\n\n", bytes / (t[2] * 1e-3) / 1e12);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
}

template <int N, int RING>
void row(int sms, int chunks, const unsigned short* x, float* sink) {
  const float both = time_us_per_chunk<N, kDecode | kMma, RING>(sms, chunks, x, sink);
  const float mma = time_us_per_chunk<N, kMma, RING>(sms, chunks, x, sink);
  const float dec = time_us_per_chunk<N, kDecode, RING>(sms, chunks, x, sink);
  const float both_alu = time_us_per_chunk<N, kDecode | kMma | kNoTable, RING>(sms, chunks, x, sink);
  const float sync = time_us_per_chunk<N, kDecode | kMma | kSync, RING>(sms, chunks, x, sink);
  const float staged = time_us_per_chunk<N, kDecode | kMma | kStageX, RING>(sms, chunks, x, sink);
  const float mma_staged = time_us_per_chunk<N, kMma | kStageX, RING>(sms, chunks, x, sink);
  const float half = time_us_per_chunk<N, kDecode | kMma | kStageX | kHalfX, RING>(sms, chunks, x, sink);
  const float spread = time_us_per_chunk<N, kDecode | kMma | kStageX | kSpreadX, RING>(sms, chunks, x, sink);
  const float bulk = time_us_per_chunk<N, kDecode | kMma | kBulkX, RING>(sms, chunks, x, sink);
  const float mma_bulk = time_us_per_chunk<N, kMma | kBulkX, RING>(sms, chunks, x, sink);
  float both_ss = 0, mma_ss = 0, pairs = 0, roles = 0, roles_decode = 0;
  if constexpr (RING == 4) pairs = time_us_per_chunk<N, kDecode | kMma | kPairs, RING>(sms, chunks, x, sink);
  if constexpr (N <= 128) {
    roles = time_us_per_chunk<N, kDecode | kMma | kRoles, RING>(sms, chunks, x, sink);
    roles_decode = time_us_per_chunk<N, kDecode | kRoles, RING>(sms, chunks, x, sink);
  }
  if constexpr (N <= 128) {  // (256 tokens: no shared memory left for A)
    both_ss = time_us_per_chunk<N, kDecode | kMma | kSmemA, RING>(sms, chunks, x, sink);
    mma_ss = time_us_per_chunk<N, kMma | kSmemA, RING>(sms, chunks, x, sink);
  }
  std::printf("  N=%d ring=%d: decode+mma %.3f (mma %.3f, decode %.3f: sum %.3f); table loads as ALU %.3f; +barrier %.3f; +x staged %.3f (mma+x %.3f; "
              "half the reads %.3f; CTAs on other chunks %.3f); +x by bulk copy %.3f (mma+x %.3f); A through shared memory: decode+mma %.3f "
              "(mma %.3f); in pairs of steps %.3f; roles apart: decode+mma %.3f (the decode on four warps alone %.3f)\n\n",
              N, RING, both, mma, dec, mma + dec, both_alu, sync, staged, mma_staged, half, spread, bulk, mma_bulk, both_ss, mma_ss, pairs, roles,
              roles_decode);
}

// The 256-token form's x against the bulk-copy mode, one factor at a time: the image's size and
// copies of one step, issued by one thread or one a warp, 16 bytes off a line or on one.
void copy_factors(int sms, int chunks, const unsigned short* x, const unsigned short* big, const unsigned char* wcodes, float* sink) {
  constexpr int M = kDecode | kMma | kBulkX;
  const float base = time_us_per_chunk<256, M, 4>(sms, chunks, x, sink, big);
  const float image = time_us_per_chunk<256, M | kBigX, 4>(sms, chunks, x, sink, big);
  const float steps = time_us_per_chunk<256, M | kStepX, 4>(sms, chunks, x, sink, big);
  const float both = time_us_per_chunk<256, M | kBigX | kStepX, 4>(sms, chunks, x, sink, big);
  const float warps = time_us_per_chunk<256, M | kBigX | kStepX | kWarpX, 4>(sms, chunks, x, sink, big);
  const float aligned = time_us_per_chunk<256, M | kBigX | kStepX | kAlignX, 4>(sms, chunks, x, sink, big);
  constexpr int kKernelX = M | kBigX | kStepX | kWarpX | kAlignX;  // as the 256-token form copies x
  const float aligned_warps = time_us_per_chunk<256, kKernelX, 4>(sms, chunks, x, sink, big);
  const float dram = time_us_per_chunk<256, kKernelX | kDramCodes, 4>(sms, chunks, x, sink, big, wcodes);
  const float prefetch = time_us_per_chunk<256, kKernelX | kDramCodes | kPrefetchCodes, 4>(sms, chunks, x, sink, big, wcodes);
  std::printf("  N=256 x by bulk copy: one 64 KB copy a chunk from 4 chunks %.3f; from a 14.7 MB image %.3f; eight 8 KB copies %.3f; both %.3f; "
              "both, each warp issuing one copy %.3f; both, the copies on 128-byte lines %.3f, and one a warp %.3f\n",
              base, image, steps, both, warps, aligned, aligned_warps);
  std::printf("  N=256 codes, x as the 256-token form copies it: from shared memory %.3f; from DRAM a chunk ahead %.3f; and an L2 prefetch "
              "three chunks ahead %.3f\n\n",
              aligned_warps, dram, prefetch);
}

int main(int argc, char** argv) {
  int dev = 0, sms = 0, clock_khz = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  const int chunks = argc > 1 ? std::atoi(argv[1]) : 4000;
  const bool copies_only = argc > 2 && std::string(argv[2]) == "copies";
  float* sink = nullptr;
  CHECK(cudaMalloc(&sink, sms * kThreads * sizeof(float)));
  unsigned short* x = nullptr;
  const std::size_t x_elems = std::size_t{256} * kXChunks * 128;
  CHECK(cudaMalloc(&x, x_elems * 2));
  CHECK(cudaMemset(x, 0x3F, x_elems * 2));
  std::printf("%d SMs, %d chunks per CTA; a chunk: 128 rows x 128 columns x N tokens (two warpgroups of 64 rows, 8 steps of k16)\n", sms, chunks);
  std::printf("ideal MMA time per chunk at 2048 dense bf16 MAC/clk per SM and %.0f MHz: N=64 %.3f, N=128 %.3f, N=256 %.3f us\n\n", clock_khz / 1e3,
              128.0 * 128 * 64 / 2048 / (clock_khz * 1e3) * 1e6, 128.0 * 128 * 128 / 2048 / (clock_khz * 1e3) * 1e6,
              128.0 * 128 * 256 / 2048 / (clock_khz * 1e3) * 1e6);
  unsigned short* big = nullptr;  // BIG_X's image
  const std::size_t big_bytes = std::size_t{kBigChunks} * kStageBytes<256>;
  CHECK(cudaMalloc(&big, big_bytes));
  CHECK(cudaMemset(big, 0x3F, big_bytes));
  unsigned char* wcodes = nullptr;  // DRAM_CODES's weight
  CHECK(cudaMalloc(&wcodes, kWBytes));
  CHECK(cudaMemset(wcodes, 0x5A, kWBytes));
  l2_ceiling(sms, chunks, x, sink);
  copy_factors(sms, chunks, x, big, wcodes, sink);
  if (!copies_only) {
    row<64, 4>(sms, chunks, x, sink);
    row<128, 4>(sms, chunks, x, sink);
    row<256, 4>(sms, chunks, x, sink);
  }
  CHECK(cudaFree(sink));
  CHECK(cudaFree(x));
  CHECK(cudaFree(big));
  CHECK(cudaFree(wcodes));
  return 0;
}
