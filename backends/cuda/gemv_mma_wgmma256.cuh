// SPDX-License-Identifier: MIT
// The 256-token warpgroup form (sm_90a), its plan and model.
// Part of gemv_mma.cu's translation unit: it includes gemv_mma_wgmma.cuh (and through it every
// header before), and only gemv_mma.cu includes it (hence the unnamed namespace).
#pragma once

#include "backends/cuda/gemv_mma_wgmma.cuh"

namespace nf4::cuda {
namespace {

// The 256-token form: the warpgroup kernel's decode and MMAs (wgmma m64n256k16, the same bits as
// the other kernels: the same MMAs on the same operands in the same order), for items of 128 rows
// by 256 tokens: W decoded once per 256 tokens, where the 128-token form decodes it twice and
// stalls on its decode. Its accumulators take 128 registers a thread, so the parts' running total
// (another 128) lives in shared memory instead (128 KB: each thread's own floats,
// [accumulator][thread]), added to at each part's end: the additions every kernel makes, in part
// order; the outputs go through it too, stored by a rolled, coalesced loop. (The same kernel for
// 128 tokens ran its chunk no faster than the 128-token warpgroup kernel: docs/PERFORMANCE_LOG.md,
// "The 256-token form's parts of k over several CTAs".) What is left of shared memory holds the
// 16-copy pair table (32 KB, where the other warpgroup kernels keep 32 copies) and eight stages of
// x of one k16 step each (8 KB), filled from x's image (gemv_mma_x_image_kernel) two at a time by
// one bulk copy (16 KB), each pair's by a warp of its own: a pair is refilled once every warp has
// seen both its MMAs complete (an mbarrier per pair counts the warps), four steps ahead of its
// first MMA, so no barrier of the whole CTA runs in the loop. Codes go to registers one chunk
// ahead (no ring: no room).
// Parts of k over CTAs: a work unit is P = 2^log2_part_group consecutive parts of an item (1 to
// S). Where P = S one CTA takes the item and stores its output; else the unit of the item's first
// parts (rank 0) adds them in turn and leaves their sum in slot 0 of the workspace, every other
// unit leaves each part's sums in the part's slot ([item][part][token block][thread] float4s, as
// the split forms), and gemv_mma_split_reduce_kernel adds them in part order: the same additions.
// RELAY (P = S / 2): the two CTAs of a cluster take an item's parts in turn instead (CTA r parts r,
// r + 2, ...), and the running total goes from one to the other over distributed shared memory:
// at the end of part q its CTA waits for the total through part q - 1 (the other's, signalled on
// this CTA's mbarrier), adds its part's sums to it into its own total and signals the other. The
// same additions in the same order, without part sums in the workspace or the addition kernel;
// the CTA of the last part stores the output.
constexpr int kWg256Copies = 16;
constexpr int kWg256Stages = 8;
// x's bulk copies a chunk, two stages each: each copy costs time of its own beyond its bytes
// (lab/wgmma_overlap: eight 8 KB copies a chunk 0.13-0.16 us slower than one of 64 KB).
constexpr int kWg256XCopies = 4;
// The stages start on a 128-byte line (after the table and values, with up to 127 bytes of
// alignment): 8 KB copies into stages 16 bytes off a line ran the 256-token form slower.
constexpr unsigned kWg256StageAlign = 128;
constexpr std::size_t wgmma256_shared_bytes() {
  return std::size_t{pair_table_bytes(kWg256Copies)} + (256 + 16) * sizeof(float) + (kWg256StageAlign - 1) +
         std::size_t{kWg256Stages} * kWgStepBytes<32> + std::size_t{128} * kThreads * sizeof(float) + (2 * kWg256XCopies + 1) * 8;
}
static_assert(kWgStepBytes<32> % kWg256StageAlign == 0, "every stage on a line");
static_assert(wgmma256_shared_bytes() <= 227 * 1024, "the H100's shared memory per CTA");

// Arrives on the mbarrier at `bar` where `p` (one lane of a warp: no branch around the MMAs).
[[maybe_unused]] __device__ __forceinline__ void mbarrier_arrive_where(unsigned bar, bool p) {
#if defined(NF4_WGMMA_CODE)
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %1, 0; @p mbarrier.arrive.shared::cta.b64 _, [%0]; }" ::"r"(bar), "r"(static_cast<unsigned>(p)) : "memory");
#else
  (void)bar, (void)p;
#endif
}

// RELAY's handover: an arrival on the mbarrier at `bar` in the cluster's CTA `rank`, releasing this
// thread's shared-memory writes before it at cluster scope, and a wait that acquires them.
[[maybe_unused]] __device__ __forceinline__ void mbarrier_arrive_remote(unsigned bar, unsigned rank) {
#if defined(NF4_WGMMA_CODE)
  asm volatile("{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1; mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]; }" ::"r"(bar), "r"(rank) : "memory");
#else
  (void)bar, (void)rank;
#endif
}
[[maybe_unused]] __device__ __forceinline__ void mbarrier_wait_cluster(unsigned bar, unsigned parity) {
#if defined(NF4_WGMMA_CODE)
  asm volatile("{ .reg .pred done;\nwait_%=: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n@!done bra wait_%=; }" ::"r"(bar), "r"(parity)
               : "memory");
#else
  (void)bar, (void)parity;
#endif
}

// v = 0, in f registers: through C++ floats a zeroing loop becomes a memset, and the compiler
// carried the accumulators in integer registers across the loops, moving them in and out around
// the MMAs, which made ptxas serialize the MMAs (C7513, C7514).
[[maybe_unused]] __device__ __forceinline__ void zero4(float* v) {
#if defined(NF4_WGMMA_CODE)
  asm volatile("{ mov.b32 %0, 0; mov.b32 %1, 0; mov.b32 %2, 0; mov.b32 %3, 0; }" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]));
#else
  v[0] = v[1] = v[2] = v[3] = 0.0f;
#endif
}

template <nf4_dtype XD, bool RELAY = false>
__global__ void __launch_bounds__(kThreads, 1) gemv_mma_wgmma256_kernel(const __grid_constant__ GemvArgs a) {
#if !defined(NF4_WGMMA_CODE)
  (void)a;
  __trap();
#else
  // kRing: steps whose A fragments are in registers; kAhead: steps whose table loads are in flight
  // ahead of the one being finished (as the 64-token form).
  constexpr int NT = 32, kTokens = 8 * NT, kAcc = kTokens / 2, kRing = 2, kAhead = 2, kQ = kWg256Stages;
  wait_for_previous_grid();  // programmatic dependent launch (pdl.h): before any global access
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* xs = WideCta::after_table(smem, kWg256Copies);  // [stage][token block][k half][token][16 bytes]
  xs += (kWg256StageAlign - static_cast<unsigned>(__cvta_generic_to_shared(xs)) % kWg256StageAlign) % kWg256StageAlign;
  float* const totals = reinterpret_cast<float*>(xs + kQ * kWgStepBytes<NT>);  // [accumulator][thread]
  // Stage pair p's copy (stages 2 p and 2 p + 1) completes on the mbarrier at full + 8 p; its two
  // MMAs' completion, seen by each of the 8 warps, on the one at empty + 8 p.
  constexpr int kP = kWg256XCopies;
  // RELAY: the other CTA's total through the part before this CTA's next is ready (each of its
  // threads arrives) on the one at `ready`.
  const unsigned full = static_cast<unsigned>(__cvta_generic_to_shared(totals + kAcc * kThreads)), empty = full + 8 * kP, ready = empty + 8 * kP;
  if (threadIdx.x == 0) {
    for (int q = 0; q < kP; ++q) {
      mbarrier_init(full + 8 * q, 1);
      mbarrier_init(empty + 8 * q, kWarps);
    }
    mbarrier_init(ready, kThreads);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const WideCta cta(a, smem, NT, kWg256Copies);  // its table barriers make the mbarriers visible
  if constexpr (RELAY) cluster_sync();            // and this one to the other CTA
  const unsigned tid = cta.tid;
  const int chunks = cta.chunks, span = cta.span;
  const unsigned xs_addr = static_cast<unsigned>(__cvta_generic_to_shared(xs));
  const std::uint64_t policy = evict_first_policy();
  const unsigned char* image = x_image<NT>(a);  // after the part sums' slots, if any
  // Work units: `groups` per item of P = 2^per_log2 consecutive parts each. RELAY: two per item,
  // unit u's CTA (rank u % 2 of its cluster: the grid a multiple of 2) starting at part u % 2.
  const unsigned per_log2 = RELAY ? 0u : a.log2_part_group, groups = RELAY ? 2u : (1u << a.log2_split) >> per_log2;
  const std::int64_t units = cta.items * groups;
  // The chunks of unit u: [first, end) (never empty: the host plans no empty unit).
  const auto unit_first = [&](std::int64_t u) { return min(static_cast<int>((u % groups) << per_log2) * span, chunks); };

  // The copies: this CTA's steps in order, its units in turn, each chunk's 8 steps in pairs; a
  // chunk's steps 2 p and 2 p + 1 go to stages 2 p and 2 p + 1 once every warp has seen the MMAs
  // of the steps those stages held complete (the chunk before's). chunk_image(item, c): where
  // chunk c of the item's token tile starts in x's image.
  const auto chunk_image = [&](std::int64_t item, int c) {
    return image + (static_cast<std::size_t>(item % cta.token_tiles) * chunks + c) * kWgStageBytes<NT>;
  };
  // Chunks whose MMAs this thread has issued (every thread the same); chunk `issued`'s stages are
  // in the phase of its parity.
  static_assert(kQ == 8 && kP * 2 == kQ, "a stage per step of a chunk, two a copy");
  unsigned issued = 0;
  unsigned relays = 0;  // RELAY: the waits at `ready` so far (its phase parity)
  // Steps 2 p and 2 p + 1 of the chunk at `src` into their stages (by warp 2 p + 1's first lane,
  // once the pair is released: a step or more before, so the wait costs one test); `later`: the
  // chunk after the one whose MMAs run. One warp a pair: a warp's MMAs wait for the copies its
  // threads issue, and one thread issuing all of them made every warp wait for that one.
  const auto copy_pair = [&](const unsigned char* src, int p, bool later) {
    if (tid == 32u * static_cast<unsigned>(2 * p + 1)) {
      if (issued + later > 0) mbarrier_wait(empty + 8 * p, (issued + later - 1) & 1u);
      bulk_copy_to_shared(xs_addr + 2 * p * kWgStepBytes<NT>, src + 2 * p * kWgStepBytes<NT>, 2 * kWgStepBytes<NT>, full + 8 * p);
    }
  };
  // The first chunk's pairs 0 and 1 (its pairs 2 and 3 are copied at its steps 0 and 2, as every
  // chunk's).
  if (blockIdx.x < units)
    for (int p = 0; p < 2; ++p) copy_pair(chunk_image(blockIdx.x / groups, unit_first(blockIdx.x)), p, false);

  const auto run_items = [&](auto nested_tag) {
  constexpr bool kNested = decltype(nested_tag)::value;
  for (std::int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const std::int64_t item = unit / groups;
    const unsigned rank = static_cast<unsigned>(unit % groups);
    const int first = unit_first(unit), end = min(first + (span << per_log2), chunks);
    const WideItem place(cta, item, kTokens);
    const std::int64_t rb = place.rb, row0 = place.row0, tok0 = place.tok0;
    const WideRows<kNested> rows(a, cta, row0);
    // Chunk c's codes of the lane's two rows (column 0's past k, which the body replaces by zeros
    // when it uses them: a select here would wait for the load at once, as a profile showed).
    const auto load_codes = [&](int c, uint4& lo, uint4& hi) {
      const std::uint32_t col = rows.chunk_col(c);
      lo = load_stream16(rows.rows.code[0] + col / 2, policy);
      hi = load_stream16(rows.rows.code[1] + col / 2, policy);
    };
    float acc[kAcc];
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) zero4(acc + 4 * j);
    std::uint32_t af[kRing][4];
    // Chunk c's eight steps, as the warpgroup kernel's, each step's x in its own stage: before step
    // s's fragment is written, the MMA of the step before last is complete; at odd steps this warp
    // says so for the pair before (both its MMAs done), a warp refills a pair every warp has said
    // so for (a step or more ago), and at even steps the pair's MMAs wait for its copy.
    // ptxas keeps the MMAs asynchronous only while no loop (an mbarrier wait, even a counted loop)
    // lies between a chunk's first two MMAs or its last two: with one at step 1 or 7, and only
    // there, it serializes every MMA (C7513, found by compiling each placement). Pairs leave the
    // odd steps without waits or copies: pairs 2 and 3 are copied at steps 0 and 2, the next
    // chunk's pairs 0 and 1 at steps 4 and 6, each four steps ahead of its first MMA.
    // this_src, next_src: the images of this chunk and the next this CTA takes (nullptr: none).
    // after_first: the next chunk's loads of codes and statistics, issued behind step 0's MMA so
    // that their address arithmetic (some 60 instructions a warp) does not lie between the chunk
    // before's last MMA and this one's first, in every warp at once (nor ahead of the copy at step
    // 0); they are still a chunk ahead of their use.
    const auto body = [&](int c, const WideStats& w, const uint4& loaded_lo, const uint4& loaded_hi, const unsigned char* this_src,
                          const unsigned char* next_src, const auto& after_first) {
      const bool live = rows.live(c);
      const uint4 zero = make_uint4(0, 0, 0, 0), lo = live ? loaded_lo : zero, hi = live ? loaded_hi : zero;
      float am[2];
      rows.scales(c, w, am);
      // Step s's descriptor: stage 0's plus s stages in its address field (every address in shared
      // memory lies below 2^18 bytes, so the field never carries).
      const std::uint32_t desc0 = wgmma_desc_lo(xs_addr);
      TableAhead<kAhead, kWg256Copies> entries(smem, lo, hi, cta.lane_off);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const TablePairs e = entries.take(s);
        wgmma_wait<kRing - 1>();  // the MMA of the step before last is done
        // Odd steps: the pair of steps s - 3 and s - 2 is done (at step 1 the chunk before's last).
        if (s % 2 == 1) mbarrier_arrive_where(empty + 8 * ((s / 2 + kP - 1) % kP), (s >= 3 || issued > 0) && cta.lane == 0);
        if (s % 2 == 0) {
          // Pairs 2 and 3 (released at the chunk before's step 7 and this one's step 1), then the
          // next chunk's pairs 0 and 1 (released at this chunk's steps 3 and 5); then this step's
          // pair.
          if (s < 4) copy_pair(this_src, s / 2 + 2, false);
          else if (next_src) copy_pair(next_src, s / 2 - 2, true);
          mbarrier_wait(full + 8 * (s / 2), issued & 1u);
        }
        std::uint32_t(&f)[4] = af[s % kRing];
        table_finish<XD>(e, am[0], am[1], f);
        wgmma_fence();
        wgmma_step<XD, kTokens>(acc, f, desc0 + s * (kWgStepBytes<NT> >> 4), kWgmmaDescHi);
        wgmma_commit();
        if (s == 0) after_first();
      }
      ++issued;
    };
    uint4 lo, hi, next_lo = make_uint4(0, 0, 0, 0), next_hi = next_lo;
    WideStats cur, next;
    load_codes(first, lo, hi);
    rows.stats(first, cur);
    next = cur;
    // Parts as the other kernels: sums restart at each part's first chunk; at its end they are added
    // to the total, or become it (the unit's first part, and each part of a unit other than the
    // item's first, which then goes to its slot); where the unit is the whole item the last part's
    // sum with the total is the output. A loop per part, its end after it, as the warpgroup kernel's,
    // so every path to a read of the accumulators passes a wait for every MMA: where one did not (the
    // part's end under a branch in the chunk loop), ptxas put its own wait in the stores' divergent
    // branches and serialized every MMA (C7518).
    float* const my_total = totals + tid;
    // This thread's total to the slot of part q (its own floats: no barrier), as the split forms'
    // [token block][thread] float4s.
    const auto put_total = [&](unsigned q) {
      float4* dst = reinterpret_cast<float4*>(a.workspace) + part_slots<NT>(a.log2_split, per_log2).index(item, q) * (NT * kThreads) + tid;
#pragma unroll 4
      for (int j = 0; j < NT; ++j)
        dst[j * kThreads] = make_float4(my_total[(4 * j) * kThreads], my_total[(4 * j + 1) * kThreads], my_total[(4 * j + 2) * kThreads],
                                        my_total[(4 * j + 3) * kThreads]);
    };
    // This unit's token tile in x's image, and the next unit's first chunk (nullptr: none), once
    // per unit.
    const unsigned char* const tile_image = chunk_image(item, 0);
    const std::int64_t next_unit = unit + gridDim.x;
    const unsigned char* const next_unit_image = next_unit < units ? chunk_image(next_unit / groups, unit_first(next_unit)) : nullptr;
    if constexpr (RELAY) {
      // This CTA's parts: rank, rank + 2, ... (2 span chunks apart), the chunk after a part's last
      // the next part's first. At a part's end its sums become the total (part 0) or are added to
      // the other CTA's total through the part before, into this CTA's own; then the other CTA is
      // told, where a part follows. (A loop of its own: through one loop for both forms the plain
      // form took 250 registers instead of 218, and was 2-5% slower.)
      for (int p0 = first; p0 < chunks; p0 += 2 * span) {
        const int p1 = p0 + span < chunks ? p0 + span : chunks;
        for (int c = p0; c < p1; ++c) {
          const int nc = c + 1 < p1 ? c + 1 : p0 + 2 * span;  // the next chunk this CTA takes, if before `chunks`
          const unsigned char* this_src = tile_image + static_cast<std::size_t>(c) * kWgStageBytes<NT>;
          // The next chunk's loads even where there is none (nc >= chunks: not live, so column 0's,
          // in bounds and unused): a branch between two MMAs would serialize every MMA (C7513).
          body(c, cur, lo, hi, this_src, nc < chunks ? this_src + static_cast<std::size_t>(nc - c) * kWgStageBytes<NT> : next_unit_image, [&] {
            load_codes(nc, next_lo, next_hi);
            rows.stats(nc, next);
          });
          cur = next, lo = next_lo, hi = next_hi;
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kAcc; ++i) register_fence(acc[i]);
        if (p0 == 0) {
#pragma unroll
          for (int i = 0; i < kAcc; ++i) my_total[i * kThreads] = acc[i];
        } else {
          mbarrier_wait_cluster(ready, relays++ & 1u);
          // The other CTA's floats read a batch at a time before any of the batch is stored:
          // through a pointer the compiler cannot tell from this CTA's own, each load would wait
          // for the store before it (a round trip to the other SM per float).
          const float* before = cluster_map(static_cast<const float*>(my_total), rank ^ 1u);
          constexpr int kBatch = 32;
#pragma unroll
          for (int i0 = 0; i0 < kAcc; i0 += kBatch) {
            float v[kBatch];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) v[i] = before[(i0 + i) * kThreads];
#pragma unroll
            for (int i = 0; i < kBatch; ++i) my_total[(i0 + i) * kThreads] = __fadd_rn(v[i], acc[i0 + i]);
          }
        }
        if (p1 < chunks) mbarrier_arrive_remote(ready, rank ^ 1u);
        if (p0 + 2 * span < chunks) {
#pragma unroll
          for (int j = 0; j < kAcc / 4; ++j) zero4(acc + 4 * j);
        }
      }
    } else {
      for (int p0 = first; p0 < end; p0 += span) {
        const int p1 = p0 + span < end ? p0 + span : end;
        for (int c = p0; c < p1; ++c) {
          const unsigned char* this_src = tile_image + static_cast<std::size_t>(c) * kWgStageBytes<NT>;
          // The next chunk's loads even after the unit's last (chunk `end`: a chunk of k, or past
          // it and so column 0's; in bounds and unused), as the relay's.
          body(c, cur, lo, hi, this_src, c + 1 < end ? this_src + kWgStageBytes<NT> : next_unit_image, [&] {
            load_codes(c + 1, next_lo, next_hi);
            rows.stats(c + 1, next);
          });
          cur = next, lo = next_lo, hi = next_hi;
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kAcc; ++i) register_fence(acc[i]);
        // The part's sums into the total (restart: they are the total), acc from zero again.
        const bool restart = p0 == first || rank != 0, last_part = p1 == end;
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          float* t = my_total + i * kThreads;
          *t = restart ? acc[i] : __fadd_rn(*t, acc[i]);
        }
        if (!last_part) {
#pragma unroll
          for (int j = 0; j < kAcc / 4; ++j) zero4(acc + 4 * j);
        }
        if (rank != 0) put_total(static_cast<unsigned>(p0 / span));
      }
    }
    if (!RELAY && groups > 1) {
      // The sum of the item's first parts, where the addition starts. No barrier before the next
      // unit: a thread's slot stores read its own floats of the total only.
      if (rank == 0) put_total(0);
      continue;
    }
    // The outputs from shared memory by a rolled loop (coalesced): unrolled over the accumulators
    // (every value's bounds and dtype) the stores were 140 KB of code, whose instruction-cache
    // misses took 40% of the kernel's time (a profile). Thread u's accumulator i (= 4 j + q) is row
    // 16 w + g + 8 (q / 2) and token 8 j + 2 t + q % 2 of the item (w, g, t: u's warp, lane / 4,
    // lane % 4).
    __syncthreads();  // every thread's outputs in place
    const float* outputs = totals;
    const std::int64_t item_row0 = rb * kWarps * kTileRows;
    // One loop per output dtype (gemv_out_bits folded for it: through the run-time switch the
    // rounding's branches took a fifth of the kernel's time, a profile).
    // Thread u stores row u % 128 of tokens u / 128, + 2, + 4, ...: a warp's stores are 32
    // consecutive rows of one token.
    const unsigned row = tid % 128, row_u = 32 * (row / 16) + 4 * (row % 8), row_i = 2 * (row % 16 / 8);
    const int tokens = static_cast<int>(min(std::int64_t{kTokens}, a.m - tok0));
    const auto store_outputs = [&](auto dtype_tag) {
      constexpr nf4_dtype YD = decltype(dtype_tag)::value;
      using Storage = typename DtypeCodec<YD>::Storage;
      if (item_row0 + row >= cta.n || (RELAY && rank != static_cast<unsigned>((chunks - 1) / span) % 2u)) return;  // RELAY: the last part's CTA
      Storage* y = static_cast<Storage*>(a.y) + (tok0 + tid / 128) * cta.n + item_row0 + row;
#pragma unroll 8
      for (int token = static_cast<int>(tid / 128); token < tokens; token += 2, y += 2 * cta.n)
        *y = static_cast<Storage>(gemv_out_bits(outputs[(4 * (token / 8) + row_i + token % 2) * kThreads + row_u + token % 8 / 2], YD));
    };
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product) \
  if constexpr ((product) != 0)                                                   \
    if (a.y_dtype == (value)) store_outputs(std::integral_constant<nf4_dtype, (value)>{});
    NF4_DTYPES(NF4_X)
#undef NF4_X
    __syncthreads();  // the next unit's first part rewrites the total
    if constexpr (RELAY) cluster_sync();  // (and the other CTA has read it)
  }
  };
  if (a.nested) run_items(std::true_type{});
  else run_items(std::false_type{});
#endif
}

// The 256-token form: x's image first (in the workspace), then items x S / P work units of P
// consecutive parts over the SMs (P = 1 to S: forced_parts, else whichever takes less modelled
// time: wgmma256_parts_choice), then the addition where P < S; its modelled time into *time where
// asked.
template <nf4_dtype XD>
cudaError_t plan_wgmma256(GemvArgs& a, int sms, GemvKernelLaunch* out, int forced_parts, double* time = nullptr) {
  constexpr int NT = 32;
  static MmaLaunchCache cache;
  const auto has_code = [](int arch) { return kWgmmaBuilt && arch == 900; };
  if (!clamp_forced_parts(forced_parts, 1u << a.log2_split)) return cudaErrorInvalidValue;
  const void* fn = reinterpret_cast<const void*>(&gemv_mma_wgmma256_kernel<XD>);
  std::int64_t resident = 0;
  if (cudaError_t e = resident_ctas(cache, fn, wgmma256_shared_bytes(), has_code, sms, &resident); e != cudaSuccess) return e;
  const PartsChoice best = wgmma256_parts_choice(a.n, a.k, a.m, a.log2_split, forced_parts, resident, sms);
  if (!best.chosen) return cudaErrorInvalidValue;
  const ItemGrid grid = item_grid(a.n, a.m, kWarps, kTileRows, NT);
  const std::int64_t chunks = chunk_count(a.k), parts = std::int64_t{1} << a.log2_split, span = part_span(chunks, a.log2_split);
  bool relayed = false;
  if (parts > 1 && best.log2 + 1 == a.log2_split && (parts - 1) * span < chunks) {
    // Two units an item, no part empty: the relay in clusters of two CTAs, where its pairs run the
    // items in no more waves than the CTAs run the units (pairs share a GPC); the workspace then
    // holds x's image only. Its time is the plain form's model (it measured 2-6% under it at
    // 192-256 rows on an H200: docs/PERFORMANCE_LOG.md, "The relay landed").
    static MmaLaunchCache relay_cache;
    const void* relay_fn = reinterpret_cast<const void*>(&gemv_mma_wgmma256_kernel<XD, true>);
    GemvKernelLaunch relay = *out;
    if (plan_launch(relay_cache, relay_fn, wgmma256_shared_bytes(), has_code, grid.items, sms, &relay, 2) == cudaSuccess) {
      const std::int64_t pairs = relay.grid / 2;
      relayed = (grid.items + pairs - 1) / pairs <= (best.units + resident - 1) / resident;
      if (relayed) *out = relay;
    }
  }
  if (!relayed) {
    if (cudaError_t e = plan_launch(cache, fn, wgmma256_shared_bytes(), has_code, best.units, sms, out); e != cudaSuccess) return e;
  }
  if (time) *time = best.time;
  plan_workspace_launch<NT>(a, relayed ? a.log2_split : best.log2, sms, out);
  return cudaSuccess;
}

}  // namespace
}  // namespace nf4::cuda
