// SPDX-License-Identifier: MIT
// The warpgroup kernels (sm_90a): the warpgroup kernel with its cluster and split forms, the x image
// and the parts' addition, their plans and the models that price them.
// Part of gemv_mma.cu's translation unit: the headers gemv_mma_common, _ring, _stream, _wide and
// _wgmma.cuh each include the one before, and only gemv_mma.cu includes the last (hence the
// unnamed namespace).
#pragma once

#include "backends/cuda/gemv_mma_wide.cuh"

namespace nf4::cuda {
namespace {

// The warpgroup kernel (sm_90a, vector shapes, many tokens): the wide kernel's decode, with each
// 16-column step of a chunk one wgmma for all the item's tokens instead of one mma.sync per 8, so
// B never passes through registers and the MMAs run asynchronously to the next step's decode.
// wgmma m64nNk16 with A from registers gives the bits of mma.sync m16n8k16 on the same operands
// (checked on the H100, every kernel against the others in the tests), so this kernel is one more
// with the same MMAs in the same order. The CTA's two warpgroups take 64 rows each (a warp's A
// fragment is its 16-row tile, as in mma.sync), and x's chunk is staged per CTA in the layout
// wgmma reads: for step s, core matrices of 8 tokens by 8 k slots (16 bytes a row), the slots in
// the order the A fragments use (slots 2t, 2t + 1 <- columns 32 t + 4 s + {0, 1}; 2t + 8, 2t + 9 <-
// 32 t + 4 s + {2, 3}), so each 4-byte column pair of x lands at its own place: loaded 16 bytes at
// a time into registers a chunk ahead, stored as four words.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF4_WGMMA_CODE 1
#endif
// Whether the build holds sm_90a code, on the host: the CUDA backend's CMake defines it.
#if defined(NF4_CUDA_SM90A)
constexpr bool kWgmmaBuilt = true;
#else
constexpr bool kWgmmaBuilt = false;
#endif

// FOUR: the cluster form with four parts per CTA, which holds two of its parts' sums beside the
// stages while it sums the next ones. GLOBAL: the split form, whose stages are filled by bulk
// copies that complete on one mbarrier per stage (8 bytes each, past the code rings).
template <int NT, int D, bool FOUR = false, bool GLOBAL = false>
constexpr std::size_t wgmma_shared_bytes() {
  return kStreamTableBytes + (256 + 16) * sizeof(float) + std::size_t{D + 1} * kWgStageBytes<NT> +
         std::size_t{kWarps} * (D + 1) * 2 * kWarp * sizeof(uint4) + (FOUR ? 2 * kWgPartBytes<NT> : 0) + (GLOBAL ? 8 * (D + 1) : 0);
}

// Where x's image starts in the workspace: after the part sums (the layout: gemv_mma_model.h).
template <int NT>
__device__ __forceinline__ unsigned char* x_image(const GemvArgs& a) {
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  return reinterpret_cast<unsigned char*>(a.workspace) + split_sums_bytes<NT>(grid.items, a.log2_split, a.log2_part_group);
}

// The x image (vector shapes: k % 32 == 0, x 16-byte aligned): 16-byte rows of core matrices,
// row (token tile, chunk, step s, token block b, k half h, token i) holding columns
// 32 t + 4 s + 2 h + {0, 1} of token 8 b + i for t = 0..3 (the k slots the A fragments use, as
// the warpgroup kernel's own staging places them); tokens past m and columns past k are zeros.
// The 16 bytes after each step (NT < 32) are not written: no descriptor reaches them.
// A CTA takes two token blocks of one chunk at a time: it reads their 16 rows of x whole (16-byte
// loads, each x byte once, where gathering each image row's four column pairs from x would fetch
// every sector four to eight times) into shared memory, then writes the image's rows in order (a
// warp's stores 512 consecutive bytes). Two blocks, not more: larger units leave too few CTAs where
// x is short (64 tokens of 32 chunks are 32 units of eight blocks).
constexpr int kImageBlocks = 2;                   // token blocks a CTA stages at once
constexpr int kImageRowWords = kChunkCols / 2 + 4;  // a chunk's column pairs, padded: 2-way bank conflicts at most
template <int NT>
__global__ void __launch_bounds__(kThreads) gemv_mma_x_image_kernel(const __grid_constant__ GemvArgs a) {
  static_assert(NT % kImageBlocks == 0, "whole groups of token blocks per tile");
  constexpr int kGroups = NT / kImageBlocks, kTokens = 8 * kImageBlocks, kPieces = kChunkCols / 8;
  constexpr int kLoads = kTokens * kPieces / kThreads, kRows = 8 * kImageBlocks * 2 * 8 / kThreads;
  static_assert(kTokens * kPieces % kThreads == 0 && 8 * kImageBlocks * 2 * 8 % kThreads == 0, "whole loads and rows per thread");
  __shared__ __align__(16) std::uint32_t staged[kTokens][kImageRowWords];  // [token][column pair]
  wait_for_previous_grid();  // x may be the previous kernel's output (pdl.h)
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  // Units and chunks in 32 bits (an image of 2^32 units would be 16 TB): a unit's place is two
  // divisions, where in 64 bits each was a call of ~70 instructions.
  const unsigned chunks = static_cast<unsigned>(chunk_count(a.k)), units = static_cast<unsigned>(grid.token_tiles) * chunks * kGroups;
  unsigned char* image = x_image<NT>(a);
  const auto* x = static_cast<const unsigned char*>(a.x);
  // Unit u's loads into v (zeros past m and k).
  const auto load_unit = [&](unsigned u, uint4 (&v)[kLoads]) {
    const unsigned group = u % kGroups, tile_chunk = u / kGroups, c = tile_chunk % chunks, tt = tile_chunk / chunks;
    const std::int64_t token0 = std::int64_t{tt} * 8 * NT + kTokens * group;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const unsigned p = threadIdx.x + j * kThreads, token = p / kPieces, piece = p % kPieces;
      const std::int64_t col = std::int64_t{c} * kChunkCols + 8 * piece;
      v[j] = make_uint4(0, 0, 0, 0);
      if (token0 + token < a.m && col < a.k) v[j] = __ldg(reinterpret_cast<const uint4*>(x + ((token0 + token) * a.k + col) * 2));
    }
  };
  // The next unit's loads are issued before this one's stores: each CTA has one unit's x in
  // flight while it writes the other's image.
  uint4 v[kLoads];
  if (blockIdx.x < units) load_unit(blockIdx.x, v);
  for (unsigned u = blockIdx.x; u < units; u += gridDim.x) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const unsigned p = threadIdx.x + j * kThreads;
      *reinterpret_cast<uint4*>(&staged[p / kPieces][4 * (p % kPieces)]) = v[j];
    }
    if (u + gridDim.x < units) load_unit(u + gridDim.x, v);
    __syncthreads();
    const unsigned group = u % kGroups, tile_chunk = u / kGroups;
    unsigned char* const chunk_image = image + static_cast<std::size_t>(tile_chunk) * kWgStageBytes<NT> + group * kImageBlocks * 256;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const unsigned r = threadIdx.x + j * kThreads, i = r % 8, h = r / 8 % 2, b = r / 16 % kImageBlocks, s = r / (16 * kImageBlocks);
      const std::uint32_t* src = &staged[8 * b + i][2 * s + h];
      *reinterpret_cast<uint4*>(chunk_image + s * kWgStepBytes<NT> + b * 256 + h * 128 + i * 16) = make_uint4(src[0], src[16], src[32], src[48]);
    }
    __syncthreads();  // the next unit restages
  }
}

// The shared-memory descriptor of a step's B: no swizzle, the next 8 k slots 128 bytes on (the
// leading offset), the next 8 tokens 256 bytes on (the stride offset). Low word: the address in
// 16-byte units (bits 0-13) and the leading offset; high word: the stride offset.
[[maybe_unused]] __device__ __forceinline__ std::uint32_t wgmma_desc_lo(unsigned shared_addr) { return ((shared_addr & 0x3FFFFu) >> 4) | ((128u >> 4) << 16); }
[[maybe_unused]] constexpr std::uint32_t kWgmmaDescHi = 256 >> 4;

// One instruction per shape, its operand types spelled by TY ("bf16" or "f16"); scale-d is 1 (D += A B).
#define NF4_WGMMA_M64N64K16(TY) \
  asm volatile("{ .reg .pred p; .reg .b64 desc; setp.ne.b32 p, %38, 0; mov.b64 desc, {%36, %37};\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, desc, p, 1, 1, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_lo), "r"(desc_hi), "r"(1))
#define NF4_WGMMA_M64N128K16(TY) \
  asm volatile("{ .reg .pred p; .reg .b64 desc; setp.ne.b32 p, %70, 0; mov.b64 desc, {%68, %69};\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, desc, p, 1, 1, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_lo), "r"(desc_hi), "r"(1))

#define NF4_WGMMA_M64N256K16(TY) \
  asm volatile("{ .reg .pred p; .reg .b64 desc; setp.ne.b32 p, %134, 0; mov.b64 desc, {%132, %133};\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, desc, p, 1, 1, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_lo), "r"(desc_hi), "r"(1))
// D (the warpgroup's 64 rows by N tokens; this lane's N / 2 values in the mma.sync C order per
// 8-token block) += A (this warp's 16-row fragment) B (the descriptor's N tokens by 16 k slots).
// The descriptor comes in its two words: the high one (the offsets) is the same for every step, so
// a step's descriptor costs one 32-bit add.
template <nf4_dtype XD, int N>
__device__ __forceinline__ void wgmma_step(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint32_t desc_lo, std::uint32_t desc_hi) {
#if defined(NF4_WGMMA_CODE)
  static_assert(N == 64 || N == 128 || N == 256, "the shapes written below");
  if constexpr (N == 64 && XD == NF4_DTYPE_BF16) NF4_WGMMA_M64N64K16("bf16");
  if constexpr (N == 64 && XD == NF4_DTYPE_F16) NF4_WGMMA_M64N64K16("f16");
  if constexpr (N == 128 && XD == NF4_DTYPE_BF16) NF4_WGMMA_M64N128K16("bf16");
  if constexpr (N == 128 && XD == NF4_DTYPE_F16) NF4_WGMMA_M64N128K16("f16");
  if constexpr (N == 256 && XD == NF4_DTYPE_BF16) NF4_WGMMA_M64N256K16("bf16");
  if constexpr (N == 256 && XD == NF4_DTYPE_F16) NF4_WGMMA_M64N256K16("f16");
#else
  (void)d, (void)a, (void)desc_lo, (void)desc_hi;
#endif
}
#undef NF4_WGMMA_M64N64K16
#undef NF4_WGMMA_M64N128K16
#undef NF4_WGMMA_M64N256K16
[[maybe_unused]] __device__ __forceinline__ void wgmma_fence() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
[[maybe_unused]] __device__ __forceinline__ void wgmma_commit() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Orders a register after the asynchronous MMAs' completion (a wait above it): reads of the
// accumulators must not move before their wait.
[[maybe_unused]] __device__ __forceinline__ void register_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Makes this thread's generic shared-memory stores visible to the MMAs' reads (the async proxy).
[[maybe_unused]] __device__ __forceinline__ void async_proxy_fence() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Four outputs' part sums added in part order, ((v0 + v1) + v2) + ..., the additions every kernel
// makes; present(i): whether value i exists (value 0 always does; absent ones add nothing).
template <unsigned N, class Present>
__device__ __forceinline__ void add_in_part_order(const float4 (&v)[N], Present present, float (&sum)[4]) {
  sum[0] = v[0].x, sum[1] = v[0].y, sum[2] = v[0].z, sum[3] = v[0].w;
#pragma unroll
  for (unsigned i = 1; i < N; ++i)
    if (present(i)) {
      sum[0] = __fadd_rn(sum[0], v[i].x);
      sum[1] = __fadd_rn(sum[1], v[i].y);
      sum[2] = __fadd_rn(sum[2], v[i].z);
      sum[3] = __fadd_rn(sum[3], v[i].w);
    }
}

// Thread-block clusters (sm_90): this CTA's rank and the cluster's size, a barrier of the whole
// cluster that orders shared memory (release / acquire), and the address of the same shared
// variable in the cluster's CTA `rank` (distributed shared memory, read with generic loads).
struct ClusterPlace {
  unsigned rank = 0, size = 1;
};
[[maybe_unused]] __device__ __forceinline__ ClusterPlace cluster_place() {
  ClusterPlace p;
#if defined(NF4_WGMMA_CODE)
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(p.rank), "=r"(p.size));
#endif
  return p;
}
[[maybe_unused]] __device__ __forceinline__ void cluster_sync() {
#if defined(NF4_WGMMA_CODE)
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
template <class T>
__device__ __forceinline__ const T* cluster_map(const T* p, unsigned rank) {
#if defined(NF4_WGMMA_CODE)
  std::uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(reinterpret_cast<std::uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const T*>(out);
#else
  (void)rank;
  return p;
#endif
}

// What a chunk's decode starts from: the lane's code words of its two rows, the rows' scales and
// the table entries of the first kAhead steps.
template <int kAhead>
struct ChunkStart {
  uint4 lo, hi;
  float am[2];
  TablePairs e[kAhead > 0 ? kAhead : 1];
};

// CLUSTER: the S parts of k are summed by the C CTAs of a thread-block cluster (S / C = 1, 2 or, with
// FOUR, 4 consecutive parts each, for weights of few rows, whose row blocks alone leave SMs idle)
// instead of in turn by one CTA. Each CTA leaves each of its parts' sums in its shared memory (with
// FOUR, CTA 0 adds its four in turn first, the kernel's own additions); then CTA r adds, for its
// NT / C token blocks, every part's sums in part order over distributed shared memory,
// ((p0 + p1) + p2) + ..., as the kernel adds them in turn (the same additions, so the same bits),
// and stores them.
// GLOBAL: the parts over the CTAs of an ordinary grid instead (2^log2_part_group consecutive parts
// per CTA, 1 to S), each part's sums stored in its slot of a.workspace ([item][part][token
// block][thread] float4s) for gemv_mma_split_reduce_kernel, which adds them in part order. With
// FOLD the CTA of an item's first parts (rank 0) adds them in turn and stores their sum in slot 0,
// which the addition starts from; where it holds every part it stores the output itself and no
// addition runs. FOLD's total costs registers (the 128-token form 139 -> 230 on sm_90a), which slow
// its chunks, so the host takes it only where that pays (split_folds). Its x comes from
// the image gemv_mma_x_image_kernel lays out, one bulk copy per stage, so x takes no registers.
template <nf4_dtype XD, int NT, int D, bool CLUSTER, bool FOUR = false, bool GLOBAL = false, bool FOLD = false>
__global__ void __launch_bounds__(kThreads, 1) gemv_mma_wgmma_kernel(const __grid_constant__ GemvArgs a) {
#if !defined(NF4_WGMMA_CODE)
  (void)a;
  __trap();
#else
  // kRing: steps whose A fragments are in registers (as many as the accumulators leave room for);
  // kAhead: steps whose table loads are in flight ahead of the one being finished (two: on the
  // H100 one or three were up to 3% slower in the cluster form, docs/PERFORMANCE_LOG.md).
  constexpr int kTokens = 8 * NT, kSlots = D + 1, kAcc = kTokens / 2, kRing = NT >= 16 && !GLOBAL ? 2 : 4;
  constexpr int kAhead = NT < 16 || GLOBAL ? 2 : 0;
  // kEarly: a chunk's decode starts ahead of the barrier that opens it (its codes are the lane's own
  // copies and its scales come from registers: nothing the barrier orders), so that the chain of
  // two shared loads in turn (code words, then table entries) runs while the warps are still
  // apart, rather than in every warp at once after the barrier, before any of them can issue an
  // MMA. Where the registers allow (the forms with table loads ahead).
  constexpr bool kEarly = kAhead > 0;
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* xs = WideCta::after_table(smem);  // [stage][step][token block][k half][token][16 bytes]
  uint4* rings = reinterpret_cast<uint4*>(xs + kSlots * kWgStageBytes<NT>);  // [warp][stage][row][lane]
  // GLOBAL: stage st's bulk copies complete on the mbarrier at bars + 8 st (initialized before the
  // table's barriers in WideCta make it visible to every thread).
  const unsigned bars = static_cast<unsigned>(__cvta_generic_to_shared(rings + std::size_t{kWarps} * kSlots * 2 * kWarp));
  if (GLOBAL && threadIdx.x == 0) {
    for (int st = 0; st < kSlots; ++st) mbarrier_init(bars + 8 * st, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const WideCta cta(a, smem, NT);
  const unsigned tid = cta.tid;
  const int chunks = cta.chunks, span = cta.span;
  const auto* x = static_cast<const unsigned short*>(a.x);
  uint4* my_ring = rings + cta.warp * (kSlots * 2 * kWarp) + cta.lane;
  const unsigned xs_addr = static_cast<unsigned>(__cvta_generic_to_shared(xs));

  // This thread's 16-byte units of x per chunk: unit u = tid % 16 (columns 8u .. 8u + 7: t = u / 4,
  // q = u % 4) of token rows tid / 16 + 16 i. Its four words are the column pairs (4s, 4s + 1) and
  // (4s + 2, 4s + 3) of t's range for s = 2q, 2q + 1: k halves 0 and 1 of steps 2q and 2q + 1.
  constexpr int kMyUnits = kTokens * 16 / kThreads;
  static_assert(kTokens * 16 % kThreads == 0, "whole units per thread");
  const unsigned my_u = tid % 16, ut = my_u / 4, uq = my_u % 4;
  // The chunks this CTA sums: every part in turn, or its cluster rank's (GLOBAL: its work unit's)
  // `per` parts (none where they are empty: an empty part adds nothing, not even a zero).
  const ClusterPlace place = CLUSTER ? cluster_place() : ClusterPlace{};
  const unsigned cluster = place.size;
  // Parts per CTA: 1 or 2, or with FOUR 4 (the host launches it for S = 8 on clusters of 2 only).
  const unsigned per_log2 = GLOBAL ? a.log2_part_group : FOUR ? 2 : CLUSTER && (1u << a.log2_split) > cluster ? 1 : 0;
  // GLOBAL: work units of one item's part group each, `groups` per item.
  const unsigned groups = GLOBAL ? (1u << a.log2_split) >> per_log2 : 1u;
  // FOUR: where CTA 1 keeps its part q's sums: q = 3 in acc, q = 2 in total (both stored into the x
  // stages after the last chunk), q = 0 and 1 in `held` past the code rings.
  [[maybe_unused]] float4* const held = reinterpret_cast<float4*>(reinterpret_cast<unsigned char*>(rings) + std::size_t{kWarps} * kSlots * 2 * kWarp * sizeof(uint4));
  // (The 128-token form's cluster variant spills: 64 accumulators and their totals leave no room.)
  static_assert(!CLUSTER || NT == 8, "the cluster form for 64 tokens only");
  static_assert(!GLOBAL || ((NT == 8 || NT == 16) && !CLUSTER), "the split form for 64 or 128 tokens, without a cluster");
  static_assert(!FOUR || CLUSTER, "four parts per CTA in a cluster only");
  static_assert(!FOLD || GLOBAL, "the fold in the split form only");
  static_assert(!CLUSTER || 2 * kAcc * kThreads * sizeof(float) <= kSlots * kWgStageBytes<NT> + std::size_t{kWarps} * kSlots * 2 * kWarp * sizeof(uint4),
                "two parts' sums fit the x stages and the code rings");

  // GLOBAL: x from its image (gemv_mma_x_image_kernel), one bulk copy per chunk; bit st of
  // `phases`: the parity of stage st's next phase.
  [[maybe_unused]] const unsigned char* image = GLOBAL ? x_image<NT>(a) : nullptr;
  [[maybe_unused]] unsigned phases = 0;
  const auto run_items = [&](auto nested_tag) {
  constexpr bool kNested = decltype(nested_tag)::value;
  for (std::int64_t unit = blockIdx.x / cluster; unit < cta.items * groups; unit += gridDim.x / cluster) {
    const std::int64_t item = GLOBAL ? unit / groups : unit;
    const unsigned rank = GLOBAL ? static_cast<unsigned>(unit % groups) : place.rank;
    const int first = CLUSTER || GLOBAL ? min(static_cast<int>(rank << per_log2) * span, chunks) : 0;
    const int end = CLUSTER || GLOBAL ? min(first + (span << per_log2), chunks) : chunks;
    const WideItem place(cta, item, kTokens);
    const std::int64_t tt = place.tt, row0 = place.row0, tok0 = place.tok0;
    const WideRows<kNested> rows(a, cta, row0);
    const unsigned short* x_src[kMyUnits];
    unsigned x_dst[kMyUnits];
#pragma unroll
    for (int i = 0; i < kMyUnits; ++i) {
      const unsigned r = tid / 16 + 16 * i;
      x_src[i] = x + min(tok0 + r, std::int64_t{a.m} - 1) * cta.k + 8 * my_u;
      x_dst[i] = (2 * uq) * kWgStepBytes<NT> + (r / 8) * 256 + (r % 8) * 16 + 4 * ut;
    }
    // Chunk c's x into registers (zeros past k: whole units, as k % 32 == 0 here).
    uint4 xr[kMyUnits];
    const auto load_x = [&](int c) {
      const std::uint32_t base = static_cast<std::uint32_t>(c) * kChunkCols;
      const bool live = c < end && static_cast<std::uint64_t>(base + 8 * my_u) < cta.uk;
#pragma unroll
      for (int i = 0; i < kMyUnits; ++i) xr[i] = live ? __ldg(reinterpret_cast<const uint4*>(x_src[i] + base)) : make_uint4(0, 0, 0, 0);
    };
    const auto store_x = [&](unsigned st) {
      unsigned char* stage = xs + st * kWgStageBytes<NT>;
#pragma unroll
      for (int i = 0; i < kMyUnits; ++i) {
        unsigned char* p = stage + x_dst[i];
        *reinterpret_cast<std::uint32_t*>(p) = xr[i].x;
        *reinterpret_cast<std::uint32_t*>(p + 128) = xr[i].y;
        *reinterpret_cast<std::uint32_t*>(p + kWgStepBytes<NT>) = xr[i].z;
        *reinterpret_cast<std::uint32_t*>(p + kWgStepBytes<NT> + 128) = xr[i].w;
      }
    };
    const auto copy_codes = [&](int c, unsigned st) {
      if (c < end) rows.copy_codes(my_ring + st * 2 * kWarp, c);
      copy_commit();
    };
    float acc[kAcc];
    [[maybe_unused]] float total[kAcc];  // the parts' sum (the split form: rank 0's parts' only)
    std::uint32_t af[kRing][4];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    // A part's sums added to the total (restart: they are the total), then acc from zero again.
    [[maybe_unused]] const auto join_part = [&](bool restart) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        total[i] = restart ? acc[i] : __fadd_rn(total[i], acc[i]);
        acc[i] = 0.0f;
      }
    };
    // Sums v (4 NT of them) as [token block][thread] float4s from this thread's dst: each thread's
    // 16 bytes beside its neighbours'.
    [[maybe_unused]] const auto put_sums = [&](float4* dst, const float* v) {
#pragma unroll
      for (int j = 0; j < NT; ++j) dst[j * kThreads] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    };
    // Chunk c's eight steps: step s's A fragment is decoded while the MMAs of the steps before it
    // run (kRing steps' fragments in registers, each rewritten only after the MMA that read it has
    // completed). The MMAs are not waited for here: a chunk's stage is next written two chunks
    // later, after the waits of the chunk between.
    WideStats cur, next;
    ChunkStart<kAhead> cs;
    // Chunk c's decode inputs into cs (its codes in ring stage st, its statistics w).
    const auto start_chunk = [&](int c, const WideStats& w, unsigned st) {
      cs.lo = my_ring[(st * 2) * kWarp], cs.hi = my_ring[(st * 2 + 1) * kWarp];
      rows.scales(c, w, cs.am);
#pragma unroll
      for (int i = 0; i < kAhead; ++i) cs.e[i] = table_lookup(smem, cs.lo, cs.hi, cta.lane_off, i);
    };
    // after_first: the chunk's other work (x's stores and loads, the next chunk's statistics),
    // issued once step 0's MMA is: where it came first, every warp's first MMA after the barrier
    // waited behind it.
    const auto body = [&]([[maybe_unused]] int c, unsigned st, const auto& after_first) {
      if constexpr (!kEarly) start_chunk(c, cur, st);
      // Step s's descriptor is stage 0's plus s steps in its address field: every address in the
      // stage lies below 2^18 bytes (the dynamic shared memory), so the field never carries.
      const std::uint32_t desc0 = wgmma_desc_lo(xs_addr + st * kWgStageBytes<NT>);
      // The table loads of steps s + 1 .. s + kAhead are in flight while step s's fragment is
      // finished (where the registers allow).
      TableAhead<kAhead> entries(smem, cs.lo, cs.hi, cta.lane_off, cs.e);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const TablePairs e = entries.take(s);
        wgmma_wait<kRing - 1>();  // the MMA of step s - kRing (this chunk's or the last one's) is done
        std::uint32_t(&f)[4] = af[s % kRing];
        table_finish<XD>(e, cs.am[0], cs.am[1], f);
        wgmma_fence();
        wgmma_step<XD, kTokens>(acc, f, desc0 + s * (kWgStepBytes<NT> >> 4), kWgmmaDescHi);
        wgmma_commit();
        if (s == 0) after_first();
      }
    };
    // Before the accumulators are read (a part's last chunk): every MMA done.
    const auto settle = [&] {
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kAcc; ++i) register_fence(acc[i]);
    };

    // Parts as the other kernels: sums restart at each part's first chunk and join the total at its
    // last. x is loaded two chunks ahead and stored one ahead: the store at chunk c's step goes to
    // chunk c - 2's stage, whose MMAs every warpgroup has waited for (by the step waits of chunk c - 1)
    // before the barrier of step c.
    static_assert(D == 2, "x loaded two chunks ahead into the stage of the chunk two before");
    // GLOBAL: chunk c's image is copied into its stage at chunk c - 1's barrier (the stage of chunk
    // c - 3, whose MMAs are complete), the first chunk's here.
    const unsigned char* tile_image = image + static_cast<std::size_t>(tt) * cta.chunks * kWgStageBytes<NT>;
    const auto copy_x = [&](int c, unsigned stage) {
      bulk_copy_to_shared(xs_addr + stage * kWgStageBytes<NT>, tile_image + static_cast<std::size_t>(c) * kWgStageBytes<NT>, kWgStageBytes<NT>,
                          bars + 8 * stage);
    };
    if constexpr (GLOBAL) {
      if (tid == 0 && first < end) copy_x(first, 0);
    } else {
      load_x(first);
      store_x(0);
      load_x(first + 1);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) copy_codes(first + d, d);
    rows.stats(first < end ? first : 0, cur);
    unsigned st = 0;
    // One code path for every chunk (no step under a branch the compiler cannot prove uniform,
    // which would make it serialize the MMAs): parts in turn, each a loop over its chunks.
    for (int p0 = first; p0 < end; p0 += span) {
      const int p1 = p0 + span < end ? p0 + span : end;
      for (int c = p0; c < p1; ++c) {
        copy_wait<D - 1>();
        async_proxy_fence();
        // The fence waits for the loads in flight (a chunk old: x's and the statistics); the
        // decode's shared loads come after it.
        if constexpr (kEarly) start_chunk(c, cur, st);
        if constexpr (GLOBAL) {
          mbarrier_wait(bars + 8 * st, (phases >> st) & 1u);
          phases ^= 1u << st;
        }
        __syncthreads();  // chunk c's x is in; chunk c - 2's MMAs are complete in every warpgroup
        const unsigned next_stage = st == D ? 0 : st + 1, free_stage = st == 0 ? D : st - 1;
        if constexpr (GLOBAL) {
          if (tid == 0 && c + 1 < end) copy_x(c + 1, next_stage);
        }
        copy_codes(c + D, free_stage);
        // Between the MMAs of the chunk nothing is under a branch (ptxas would serialize them:
        // C7513): the last chunk reads its own statistics again instead of none.
        body(c, st, [&] {
          if constexpr (!GLOBAL) {
            store_x(next_stage);  // chunk c + 1
            load_x(c + 2);
          }
          rows.stats(c + 1 < end ? c + 1 : c, next);
        });
        cur = next;
        st = next_stage;
      }
      settle();
      if constexpr (GLOBAL) {
        if (FOLD && rank == 0) {
          // The first parts of k: added in turn, as the other kernels add them (their sum goes to
          // slot 0 below, or is the output where this CTA takes every part).
          join_part(p0 == first);
        } else {
          // This part's sums to its slot.
          const PartSlots slots = part_slots<NT>(a.log2_split, per_log2);
          put_sums(reinterpret_cast<float4*>(a.workspace) + slots.index(item, static_cast<unsigned>(p0 / span)) * (NT * kThreads) + tid, acc);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
        }
      } else if constexpr (FOUR) {
        // CTA 0 adds its four parts in turn; CTA 1 keeps each apart (above `held`), to be added by
        // the reduction below, in part order. (Written out, not join_part and put_sums: through
        // them ptxas schedules this kernel 16 instructions longer.)
        const int q = (p0 - first) / span;
        if (rank == 0 || q == 2) {
          const bool restart = p0 == first || rank != 0;
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            total[i] = restart ? acc[i] : __fadd_rn(total[i], acc[i]);
            acc[i] = 0.0f;
          }
        } else if (q < 2) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            held[(q * NT + j) * kThreads + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
            acc[4 * j] = acc[4 * j + 1] = acc[4 * j + 2] = acc[4 * j + 3] = 0.0f;
          }
        }
      } else {
        // The first part's sums go to the total; in a cluster a second part's stay in acc (each
        // part is added by the reduction below, in part order).
        if (!CLUSTER || p0 == first) join_part(p0 == first);
      }
    }
    copy_wait<0>();
    __syncthreads();  // the next item's stores and copies reuse every stage
    if constexpr (CLUSTER) {
      // Each part's sums into the x stages and code rings (part slot q, token block j of every
      // thread as [q][j][thread] float4s: conflict-free), then each CTA adds its token blocks' sums
      // of every part in part order (all loads issued before the first addition); the second
      // barrier keeps every CTA's sums in place until the others have read them. FOUR: slot 0
      // holds CTA 0's sum of its four parts and CTA 1's third part, slot 1 CTA 1's last.
      float4* sums = reinterpret_cast<float4*>(xs);
      if (first < end) put_sums(sums + tid, total);
      if (first + (FOUR ? 3 : 1) * span < end) put_sums(sums + NT * kThreads + tid, acc);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
      cluster_sync();
      const unsigned parts = static_cast<unsigned>((chunks + span - 1) / span), blocks = NT / cluster;  // empty parts add nothing
      for (unsigned j = rank * blocks; j < (rank + 1) * blocks; ++j) {
        // Value i: part i's sums; with FOUR, CTA 0's sum of parts 0 .. 3 and then CTA 1's parts 4 .. 7
        // (held 0, held 1, slot 0, slot 1). Values of parts past k are neither read nor added.
        constexpr unsigned kValues = FOUR ? 5 : kWarps;  // at most 8 parts (gemv_mma_split)
        const auto present = [&](unsigned i) { return FOUR ? i == 0 || 3 + i < parts : i < parts; };
        float4 v[kValues];
        if constexpr (FOUR) {
          v[0] = cluster_map(sums, 0)[j * kThreads + tid];
#pragma unroll
          for (unsigned q = 0; q < 4; ++q) {
            const float4* src = q < 2 ? held + q * NT * kThreads : sums + (q - 2) * NT * kThreads;
            if (present(1 + q)) v[1 + q] = cluster_map(src, 1)[j * kThreads + tid];
          }
        } else {
#pragma unroll
          for (unsigned r = 0; r < kValues; ++r)
            if (present(r)) v[r] = cluster_map(sums, r >> per_log2)[((r & ((1u << per_log2) - 1)) * NT + j) * kThreads + tid];
        }
        float sum[4];
        add_in_part_order(v, present, sum);
        store_wide_block(a, cta, row0, tok0, static_cast<int>(j), sum);
      }
      cluster_sync();
    } else if constexpr (GLOBAL) {
      // FOLD: rank 0's sum of the first parts, the output where it took every part, else slot 0,
      // which the addition starts from.
      if (FOLD && rank == 0) {
        if (per_log2 == a.log2_split) {
          store_wide<NT>(a, cta, row0, tok0, total);
        } else {
          put_sums(reinterpret_cast<float4*>(a.workspace) + part_slots<NT>(a.log2_split, per_log2).index(item, 0) * (NT * kThreads) + tid, total);
        }
      }
    } else {
      store_wide<NT>(a, cta, row0, tok0, total);
    }
  }
  };
  if (a.nested) run_items(std::true_type{});
  else run_items(std::false_type{});
#endif
}

// The split form's second kernel: one CTA per item and 8-token block, thread tid adding the
// values thread tid of the first kernel left in each part's slot, in part order
// ((p0 + p1) + p2) + ..., as the other kernels add them (the same bits), then storing them where
// the other kernels do (store_wide_block). Slot 0 holds the sum of the first P = 2^log2_part_group
// parts (rank 0 added them in that order; P = 1 without the fold: split_folds), so the addition
// starts there and goes on from part P.
// Parts past k were not written and are not read. Not launched where P = S (no part left).
// The slots to add are consecutive (slot 0, then one a part from P that holds chunks): their count
// is worked out once, in 32 bits; tested part by part, each slot's place in 64 bits, the index
// arithmetic took most of the kernel's ~600 instructions a warp (a profile).
template <int NT>
__global__ void __launch_bounds__(kThreads) gemv_mma_split_reduce_kernel(const __grid_constant__ GemvArgs a) {
  wait_for_previous_grid();  // the first kernel's sums (pdl.h)
  const unsigned tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, t = lane % 4;
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  const std::int64_t item = blockIdx.x / NT;
  const int j = static_cast<int>(blockIdx.x % NT);
  if (item >= grid.items) return;
  const unsigned log2_split = a.log2_split, chunks = static_cast<unsigned>(chunk_count(a.k));
  const unsigned span = part_span(chunks, log2_split), parts = (chunks + span - 1) / span;  // parts with chunks
  const PartSlots slots = part_slots<NT>(log2_split, a.log2_part_group);
  const unsigned count = parts > slots.first ? parts - slots.first + 1 : 1u;
  const auto present = [&](unsigned s) { return s < count; };
  const float4* sums = reinterpret_cast<const float4*>(a.workspace) + slots.index(item, 0) * (NT * kThreads) + j * kThreads + tid;
  float4 v[kWarps];  // at most 8 parts (gemv_mma_split)
#pragma unroll
  for (unsigned s = 0; s < kWarps; ++s)
    if (present(s)) v[s] = sums[s * (NT * kThreads)];
  float sum[4];
  add_in_part_order(v, present, sum);
  const std::int64_t rb = item / grid.token_tiles, tt = item % grid.token_tiles;
  const struct {
    std::int64_t n;
    unsigned g, t;
  } lane_place{a.n, g, t};
  store_wide_block(a, lane_place, (rb * kWarps + warp) * kTileRows, tt * 8 * NT, j, sum);
}

// A planned cluster launch's modelled time (its grid holds every item's cluster or as many as fit).
double cluster_launch_time(const GemvArgs& a, const GemvKernelLaunch& l, int sms) {
  const std::int64_t parts = std::int64_t{1} << a.log2_split, chunks = chunk_count(a.k);
  const std::int64_t items = item_grid(a.n, a.m, kWarps, kTileRows, 8).items;
  return cluster_time(items, part_span(chunks, a.log2_split), parts / l.cluster, l.grid / l.cluster, std::min(1.0, static_cast<double>(l.grid) / sms));
}

// One warpgroup kernel's launch: `cluster` CTAs per item (1: none).
template <nf4_dtype XD, int NT, bool CLUSTER, bool FOUR>
cudaError_t plan_wgmma_kernel(const GemvArgs& a, int sms, GemvKernelLaunch* out, unsigned cluster) {
  static MmaLaunchCache cache;
  const void* fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, CLUSTER, FOUR>);
  const auto has_code = [](int arch) { return kWgmmaBuilt && arch == 900; };
  return plan_launch(cache, fn, wgmma_shared_bytes<NT, kWideDepth, FOUR>(), has_code, item_grid(a.n, a.m, kWarps, kTileRows, NT).items, sms, out,
                     cluster);
}

// Parts per CTA forced for a form that takes 1, 2, 4 or 8 (0: its own choice), fewer where k has
// fewer than asked; false where the value is none of these.
inline bool clamp_forced_parts(int& forced_parts, unsigned parts) {
  if (forced_parts != 0 && forced_parts != 1 && forced_parts != 2 && forced_parts != 4 && forced_parts != 8) return false;
  if (forced_parts > static_cast<int>(parts)) forced_parts = static_cast<int>(parts);
  return true;
}

// What every workspace form's launch has around its kernel, for 8 NT tokens and 2^per_log2 parts
// per CTA: x's image first (two token blocks of a chunk per CTA, at most 8 CTAs per SM,
// grid-stride), the addition where some part is left to add (P < S), and the workspace for the
// part sums and the image.
template <int NT>
void plan_workspace_launch(GemvArgs& a, unsigned per_log2, int sms, GemvKernelLaunch* out) {
  a.log2_part_group = static_cast<std::uint8_t>(per_log2);
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);  // as x_image and the kernels walk it
  const std::int64_t image_units = grid.token_tiles * chunk_count(a.k) * (NT / kImageBlocks);
  out->before_fn = reinterpret_cast<const void*>(&gemv_mma_x_image_kernel<NT>);
  out->before_grid = static_cast<unsigned>(std::min<std::int64_t>(image_units, std::int64_t{8} * sms));
  out->before_threads = kThreads;
  if (per_log2 < a.log2_split) {
    out->then_fn = reinterpret_cast<const void*>(&gemv_mma_split_reduce_kernel<NT>);
    out->then_grid = static_cast<unsigned>(grid.items * NT);
    out->then_threads = kThreads;
  }
  out->workspace_bytes = split_sums_bytes<NT>(grid.items, a.log2_split, per_log2) + x_image_bytes<NT>(grid.token_tiles, a.k);
}

// The split form for 8 NT tokens: items x S / P work units of P consecutive parts (P = 1 to S:
// forced_parts, else whichever takes less modelled time by the CTAs resident at once:
// split_parts_choice), then the addition; its modelled time into *time where asked.
template <nf4_dtype XD, int NT>
cudaError_t plan_wgmma_split(GemvArgs& a, int sms, GemvKernelLaunch* out, int forced_parts, double* time = nullptr) {
  static MmaLaunchCache plain_cache, fold_cache;
  if (!clamp_forced_parts(forced_parts, 1u << a.log2_split)) return cudaErrorInvalidValue;
  const void* plain_fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, false, false, true, false>);
  const void* fold_fn = reinterpret_cast<const void*>(&gemv_mma_wgmma_kernel<XD, NT, kWideDepth, false, false, true, true>);
  const auto has_code = [](int arch) { return kWgmmaBuilt && arch == 900; };
  constexpr std::size_t smem = wgmma_shared_bytes<NT, kWideDepth, false, true>();
  cudaError_t failed = cudaSuccess;
  const auto resident = [&](bool folds) {
    std::int64_t ctas = 1;
    if (cudaError_t e = resident_ctas(folds ? fold_cache : plain_cache, folds ? fold_fn : plain_fn, smem, has_code, sms, &ctas); e != cudaSuccess) failed = e;
    return ctas;
  };
  const PartsChoice best = split_parts_choice<NT>(a.n, a.k, a.m, a.log2_split, forced_parts, resident);
  if (failed != cudaSuccess) return failed;
  const bool folds = split_folds<NT>(a.log2_split, best.log2);
  if (cudaError_t e = plan_launch(folds ? fold_cache : plain_cache, folds ? fold_fn : plain_fn, smem, has_code, best.units, sms, out); e != cudaSuccess)
    return e;
  if (time) *time = best.time;
  plan_workspace_launch<NT>(a, best.log2, sms, out);
  return cudaSuccess;
}

// The cluster form takes a cluster of S CTAs (a part each), of S / 2 (two parts each) or of S / 4
// (four each), whichever runs its items in fewer chunk-times by the clusters the device holds at
// once (clusters of 8 leave more SMs idle than clusters of 4, and those than clusters of 2: a
// cluster's CTAs share a GPC). forced_parts: parts per CTA, 1, 2 or 4 (fewer where k has fewer parts).
template <nf4_dtype XD, int NT, bool CLUSTER>
cudaError_t plan_wgmma(const GemvArgs& a, int sms, GemvKernelLaunch* out, int forced_parts = 0) {
  if constexpr (!CLUSTER) {
    (void)forced_parts;
    return plan_wgmma_kernel<XD, NT, false, false>(a, sms, out, 1);
  } else {
    const unsigned parts = 1u << a.log2_split, most = std::max(parts / 2, 1u);
    const auto plan_per = [&](unsigned per, GemvKernelLaunch* o) {
      return per == 4 ? plan_wgmma_kernel<XD, NT, true, true>(a, sms, o, parts / 4) : plan_wgmma_kernel<XD, NT, true, false>(a, sms, o, parts / per);
    };
    if (forced_parts != 0) {
      if (forced_parts != 1 && forced_parts != 2 && forced_parts != 4) return cudaErrorInvalidValue;
      return plan_per(std::min(static_cast<unsigned>(forced_parts), most), out);
    }
    const cudaError_t e = plan_per(1, out);
    if (e != cudaSuccess) return e;
    for (unsigned per = 2; per <= std::min(most, 4u); per *= 2) {
      GemvKernelLaunch fewer;
      if (plan_per(per, &fewer) == cudaSuccess && cluster_launch_time(a, fewer, sms) < cluster_launch_time(a, *out, sms)) *out = fewer;
    }
    return cudaSuccess;
  }
}

}  // namespace
}  // namespace nf4::cuda
