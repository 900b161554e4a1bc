// SPDX-License-Identifier: MIT
// The fast product's pieces every tensor-core kernel shares: the geometry (chunks, tiles, parts of k:
// gemv_mma_model.h, with the cost models), the MMA and copy instructions, the decode tables, and
// the host's launch planning (plan_launch).
// Part of gemv_mma.cu's translation unit: the headers gemv_mma_common, _ring, _stream, _wide and
// _wgmma.cuh each include the one before, and only gemv_mma.cu includes the last (hence the
// unnamed namespace).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>

#include "backends/cuda/bulk_copy.cuh"
#include "backends/cuda/device_util.cuh"
#include "backends/cuda/gemv_launch.h"
#include "backends/cuda/gemv_mma_model.h"
#include "core/gemv.h"

namespace nf4::cuda {
namespace {

using namespace mma;  // the geometry and the models, shared with the host-only tests

constexpr int kCopies = 16;  // pair table copies: one per lane of a half-warp
// The pair table's bytes with `copies` copies: 256 entries of 8 bytes each, per copy.
__host__ __device__ constexpr int pair_table_bytes(int copies) { return 256 * copies * 8; }
constexpr int kPairTableBytes = pair_table_bytes(kCopies);

// Which architectures have code for a variant: bf16 MMAs from sm_80, fp16 from sm_75 (K8: two
// m16n8k8 per k16 step, the shape sm_75 has).
template <nf4_dtype XD, bool K8>
__host__ __device__ constexpr bool mma_has_code(int arch) {
  return K8 ? XD == NF4_DTYPE_F16 && arch >= 750 : arch >= 800;
}
template <nf4_dtype XD, bool K8>
__device__ constexpr bool mma_compiled() {
#if defined(__CUDA_ARCH__)
  return mma_has_code<XD, K8>(__CUDA_ARCH__);
#else
  return true;
#endif
}

// D += A B for one k16 step. a[0..3]: rows g / g + 8 at k slots 2t.. and 2t + 8..; b[0..1]: k slots
// 2t.. and 2t + 8.. of token g. K8: the same step as two m16n8k8 (slots 0-7, then 8-15).
template <nf4_dtype XD, bool K8>
__device__ __forceinline__ void mma16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  if constexpr (K8) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b1));
  } else if constexpr (XD == NF4_DTYPE_F16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  (void)d, (void)a, (void)b0, (void)b1;
#endif
}

// Asynchronous copies into shared memory (sm_80+): each lane copies its own codes and absmax
// words into its own slots of a ring and later reads back only those, so waiting for its own copy
// groups (cp.async.wait_group) is the only synchronization. Below sm_80 the copy is a plain load
// and store (no pipelining; sm_75 runs this kernel for fp16 only).
// copy16_at takes the slot as a shared-window address (an immediate added to it stays the copy's
// own), copy16 as a pointer.
__device__ __forceinline__ void copy16_at(unsigned dst, const void* src, bool live, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // src-size 0 fills the slot with zeros without reading (rows past n, columns past k).
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(live ? 16 : 0), "l"(policy));
#else
  (void)policy;
  *static_cast<uint4*>(__cvta_shared_to_generic(dst)) = live ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void copy16(void* dst, const void* src, bool live, std::uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  copy16_at(static_cast<unsigned>(__cvta_generic_to_shared(dst)), src, live, policy);
#else
  (void)policy;
  *static_cast<uint4*>(dst) = live ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void copy4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
#else
  *static_cast<std::uint32_t*>(dst) = __ldg(static_cast<const std::uint32_t*>(src));
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

constexpr int kStages = 3;  // chunks of codes in flight per warp (ring slots)

// Which decode a token-tile count uses (the same weights either way): register lookup tables
// (true) or the pair table in shared memory (false).
template <int NT>
inline constexpr bool kMmaLut = NT >= 4;

// The register decode: per row and chunk, the 16 weights a code can give (value(q) * absmax,
// rounded to x's dtype exactly as nf4_dequantize writes it) as byte planes, lb[i] the low bytes and
// hb[i] the high bytes of weights 4i .. 4i + 3; four codes are then looked up with byte permutes alone.
struct Lut {
  std::uint32_t lb[4], hb[4];
};
template <nf4_dtype XD>
__device__ __forceinline__ Lut build_lut(const float (&v)[16], float am) {
  std::uint32_t tw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) tw[i] = pack2<XD>(__fmul_rn(v[2 * i], am), __fmul_rn(v[2 * i + 1], am));
  Lut lt;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lt.lb[i] = __byte_perm(tw[2 * i], tw[2 * i + 1], 0x6420);
    lt.hb[i] = __byte_perm(tw[2 * i], tw[2 * i + 1], 0x7531);
  }
  return lt;
}
// The codes of half-word h (nibbles: element 4s + 1, 4s, 4s + 3, 4s + 2, low first) to the A
// fragment's pairs (4s, 4s + 1) and (4s + 2, 4s + 3). A permute takes a 3-bit index per byte:
// entries 0-7 and 8-15 are looked up apart, then bit 3 of each code picks (4 + k for byte k).
__device__ __forceinline__ void lut_pairs(const Lut& lt, std::uint32_t h, std::uint32_t& p01, std::uint32_t& p23) {
  const std::uint32_t s1 = h & 0x7777u, s2 = ((h >> 1) & 0x4444u) | 0x3210u;
  const std::uint32_t lr = __byte_perm(__byte_perm(lt.lb[0], lt.lb[1], s1), __byte_perm(lt.lb[2], lt.lb[3], s1), s2);
  const std::uint32_t hr = __byte_perm(__byte_perm(lt.hb[0], lt.hb[1], s1), __byte_perm(lt.hb[2], lt.hb[3], s1), s2);
  p01 = __byte_perm(lr, hr, 0x4051);
  p23 = __byte_perm(lr, hr, 0x6273);
}

// One lane's ring slots, [stage][row][lane] so that a warp's reads of one field are contiguous.
struct Ring {
  uint4 codes[kStages][2][kWarp];
  std::uint32_t absmax[kStages][2][kWarp];  // flat: the absmax's bits; nested: the 4-byte word holding the code
  float nested[kStages][2][kWarp];          // nested: the block's nested absmax
};

// How a CTA's `warps` warps share k, in every kernel: S parts (S from k alone) of `span`
// consecutive chunks, part p being chunks [p span, (p + 1) span). Split: the S warps of a row group
// take a part each, R = warps / S groups per CTA; else each warp takes every part in turn, R = warps
// groups.
struct PartPlan {
  unsigned S, R, group, part;  // parts, row groups per CTA, this warp's group and part
  std::int64_t chunks, span;
};
__device__ __forceinline__ PartPlan part_plan(const GemvArgs& a, unsigned warp, bool split, unsigned warps = kWarps) {
  PartPlan p;
  p.S = 1u << a.log2_split;
  const unsigned warps_per_group = split ? p.S : 1u;
  p.R = warps / warps_per_group;
  p.group = warp / warps_per_group;
  p.part = warp % warps_per_group;
  p.chunks = chunk_count(a.k);
  p.span = (p.chunks + p.S - 1) / p.S;
  return p;
}

// Per kernel: the dynamic shared memory allowance raised once per device, the occupancy once.
struct MmaLaunchCache {
  std::mutex mu;
  bool raised[64] = {};
  int blocks[64] = {};
  int clusters[64][4] = {};  // clusters of 2^i CTAs resident at once (0: not asked yet)
  bool waits[64] = {};       // the code waits for the previous grid (pdl.h)
};

// A kernel's launch: `items` work items over at most the resident CTAs, `cluster` CTAs per item
// where a cluster shares one. has_code: whether the kernel's PTX version can run it (a build whose
// code for this device is a trap stub, compute_75 PTX run on a newer GPU for a bf16 variant, has
// nothing to run: the caller reports the exact contract instead).
cudaError_t plan_launch(MmaLaunchCache& cache, const void* fn, std::size_t smem, bool (*has_code)(int), std::int64_t items, int sms,
                        GemvKernelLaunch* out, unsigned cluster = 1, unsigned threads = kThreads) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device >= 64) return cudaErrorInvalidDevice;
  int log2 = 0;
  while ((1u << log2) < cluster) ++log2;
  if (log2 >= 4) return cudaErrorInvalidConfiguration;
  std::int64_t resident = 0;  // CTAs, or clusters, that run at once
  bool pdl = false;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (!cache.raised[device]) {
      cudaFuncAttributes attr{};
      if (cudaError_t e = cudaFuncGetAttributes(&attr, fn); e != cudaSuccess) return e;
      if (!has_code(attr.ptxVersion * 10)) return cudaErrorInvalidConfiguration;
      cache.waits[device] = ptx_waits_for_previous_grid(attr.ptxVersion);
      int optin = 0;
      if (cudaError_t e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device); e != cudaSuccess) return e;
      if (smem > static_cast<std::size_t>(optin)) return cudaErrorInvalidConfiguration;  // sm_86/89: 99 KB
      if (cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)); e != cudaSuccess) return e;
      if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache.blocks[device], fn, static_cast<int>(threads), smem); e != cudaSuccess) return e;
      if (cache.blocks[device] < 1) return cudaErrorInvalidConfiguration;
      cache.raised[device] = true;
    }
    pdl = cache.waits[device];
    if (cluster <= 1) {
      resident = std::max<std::int64_t>(static_cast<std::int64_t>(cache.blocks[device]) * sms, 1);
    } else {
      // Clusters resident at once: fewer than SMs / cluster, as a cluster's CTAs share one GPC. A
      // grid of more would leave the clusters past them to run their items after the others.
      int& clusters = cache.clusters[device][log2];
      if (clusters == 0) {
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t config = cluster_launch_config(cluster, kThreads, smem, nullptr, cluster, attr);
        if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, fn, &config); e != cudaSuccess) return e;
        if (clusters < 1) return cudaErrorInvalidConfiguration;
      }
      resident = clusters;
    }
  }
  out->fn = fn;
  out->threads = threads;
  out->smem = smem;
  out->grid = static_cast<unsigned>((items < resident ? items : resident) * cluster);
  out->cluster = cluster;
  out->pdl = pdl;
  return cudaSuccess;
}

// The CTAs of `fn` resident at once (without clusters): a launch planned for more items than fit.
cudaError_t resident_ctas(MmaLaunchCache& cache, const void* fn, std::size_t smem, bool (*has_code)(int), int sms, std::int64_t* resident) {
  GemvKernelLaunch l;
  const cudaError_t e = plan_launch(cache, fn, smem, has_code, std::numeric_limits<std::int64_t>::max(), sms, &l);
  if (e == cudaSuccess) *resident = l.grid;
  return e;
}

// Which warps take a row block's parts (the sums and their order are the same either way):
// split: one part per warp, so few row blocks still fill the device; single: one warp takes all
// parts in turn, which reads x once per CTA step for eight row blocks. Automatic: single where
// that gives every SM at least 16 warps.
GemvMmaSchedule resolve_schedule(const GemvArgs& a, GemvMmaSchedule schedule, std::int64_t rows, int nt, int sms) {
  if (schedule != GemvMmaSchedule::automatic) return schedule;
  const std::int64_t warps = item_grid(a.n, a.m, 1, rows, nt).items;  // a warp per row tile and token tile
  return warps >= 16 * static_cast<std::int64_t>(sms) ? GemvMmaSchedule::single : GemvMmaSchedule::split;
}

}  // namespace
}  // namespace nf4::cuda
