// SPDX-License-Identifier: MIT
// The fast product's geometry and cost models as plain arithmetic, without CUDA: the tensor-core
// kernels share the geometry (chunks, tiles, items, the workspace's layout), the planners of
// gemv_mma.cu price their forms and choose with the models, and tests/test_gemv_model.cpp holds the
// models and the choice against the H100 measurements they were fitted on (on any machine).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/host_device.h"

namespace nf4::cuda::mma {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kChunkCols = 128;  // columns per warp per chunk: 32 per lane group of 4
// Chunks of k, the last one partial where k % 128 != 0.
NF4_HD constexpr std::int64_t chunk_count(std::int64_t k) { return (k + kChunkCols - 1) / kChunkCols; }
// The chunks of each of the 2^log2_split parts of k (the last part's fewer, or none), in the
// caller's integer type (a kernel's 32 bits, the planners' 64).
template <class Int>
NF4_HD constexpr Int part_span(Int chunks, unsigned log2_split) {
  return (chunks + (Int{1} << log2_split) - 1) >> log2_split;
}
constexpr int kTileRows = 16;  // rows of W per MMA tile

// A launch's work items, the same on the host (grid size) and in both kernels (item walk): row
// blocks of `rows` rows for each of a CTA's `groups` warp groups, times token tiles of 8 NT
// tokens; item = row block * token_tiles + token tile.
struct ItemGrid {
  std::int64_t token_tiles, items;
};
NF4_HD constexpr ItemGrid item_grid(std::int64_t n, std::int64_t m, std::int64_t groups, std::int64_t rows, int nt) {
  const std::int64_t token_tiles = (m + 8 * nt - 1) / (8 * nt);
  return {token_tiles, (n + groups * rows - 1) / (groups * rows) * token_tiles};
}

// The parts of k, S (1, 2, 4 or 8): parts of at least 8 chunks each (a part's copies stay
// pipelined), up to the CTA's 8 warps. A function of k alone: the sum order may depend on nothing
// else.
constexpr int split_parts(std::int64_t k) {
  int split = 1;
  while (split < kWarps && chunk_count(k) >= 16 * split) split *= 2;
  return split;
}
// log2 S, as GemvArgs::log2_split holds it.
constexpr unsigned split_log2(std::int64_t k) {
  const int parts = split_parts(k);
  unsigned log2 = 0;
  while ((1 << log2) < parts) ++log2;
  return log2;
}

// Bytes of one step of a stage: 8 NT token blocks of 256 bytes (two core matrices, k slots 0-7 at
// +0 and 8-15 at +128), and, where threads store x (NT = 8, 16), 16 more so that the four steps a
// thread's 16-byte unit feeds start in four different bank groups (its four word stores from a
// warp are then conflict-free). The 256-token form (NT = 32) fills each step by a bulk copy of its
// own: no pad, so every copy starts and ends on 128-byte lines.
template <int NT>
constexpr int kWgStepBytes = NT * 256 + (NT < 32 ? 16 : 0);
static_assert(kWgStepBytes<8> % 16 == 0 && kWgStepBytes<16> % 16 == 0, "steps in the descriptor's 16-byte units");
template <int NT>
constexpr int kWgStageBytes = 8 * kWgStepBytes<NT>;

// Bytes of one part's sums in the cluster form: a float per token and row of a CTA's item.
template <int NT>
constexpr std::size_t kWgPartBytes = std::size_t{4} * NT * kThreads * sizeof(float);

// Whether the split form's first CTA of an item adds its parts itself (gemv_mma_wgmma_kernel's
// FOLD): where it takes every one (no addition kernel, no slots) and, for 128 tokens, wherever it
// takes more than one (it saves their slots); the 256-token form's always does. The fold's
// registers slow the 64-token form's chunk: with 2 of 8 parts per CTA it ran 1-3% slower than
// storing each part, where the 128-token form's ran up to 5% faster at 256 tokens (H100,
// docs/PERFORMANCE_LOG.md, "The split forms' fold").
template <int NT>
NF4_HD constexpr bool split_folds(unsigned log2_split, unsigned log2_part_group) {
  return log2_part_group == log2_split || (NT >= 16 && log2_part_group > 0);
}

// The split form's x image: x laid out beforehand, per token tile and chunk, byte for byte as a
// stage holds it (gemv_mma_x_image_kernel), so that the warpgroup kernel fills a stage with one bulk
// copy instead of loading x into registers and storing it word by word: on the H100 that staging
// cost a 128-token chunk about 0.3 us of its 1.1 and a 256-token one 0.75 of its 2
// (lab/wgmma_overlap, docs/PERFORMANCE_LOG.md). It follows the part sums in the workspace.
// The part sums' slots, [item][slot]: slot 0 holds the sum of the item's first F parts (F = P,
// the parts per CTA, where the first CTA adds its own: split_folds; else 1) and slot q - F + 1 part
// q's for q >= F, so S - F + 1 an item; none where a CTA takes every part of its item (it stores
// the output itself).
struct PartSlots {
  unsigned first;     // F: the parts slot 0 sums
  unsigned per_item;  // slots an item
  // Where item `item`'s part q (0, or F and after) has its sums, in slots from the workspace's start.
  NF4_HD constexpr std::int64_t index(std::int64_t item, unsigned q) const { return item * per_item + (q == 0 ? 0 : q - first + 1); }
};
template <int NT>
NF4_HD constexpr PartSlots part_slots(unsigned log2_split, unsigned log2_part_group) {
  const unsigned first = split_folds<NT>(log2_split, log2_part_group) ? 1u << log2_part_group : 1u;
  return PartSlots{first, log2_part_group == log2_split ? 0u : (1u << log2_split) - first + 1};
}
template <int NT>
NF4_HD constexpr std::size_t split_sums_bytes(std::int64_t items, unsigned log2_split, unsigned log2_part_group) {
  return static_cast<std::size_t>(items) * part_slots<NT>(log2_split, log2_part_group).per_item * kWgPartBytes<NT>;
}
template <int NT>
NF4_HD constexpr std::size_t x_image_bytes(std::int64_t token_tiles, std::int64_t k) {
  return static_cast<std::size_t>(token_tiles) * static_cast<std::size_t>(chunk_count(k)) * kWgStageBytes<NT>;
}

// The cluster form's modelled time (us on an H100, fitted there on one, two and four parts per CTA
// at six shapes and 32, 64 and 128 tokens, rms 5%: docs/PERFORMANCE_LOG.md, "The cluster form's
// model refitted"): waves of the clusters the device holds at once, each item a CTA's parts'
// chunks, at a cost that grows with the share of the SMs busy (as the 256-token form's), plus a
// cost per wave (two cluster barriers, the parts' addition), plus one per launch (the pipelines'
// start). busy: the share of the SMs running a CTA.
inline double cluster_time(std::int64_t items, std::int64_t span, std::int64_t per, std::int64_t at_once, double busy) {
  constexpr double kClusterPerChunk = 0.765, kClusterPerChunkBusy = 0.255, kClusterWave = 4.30, kClusterFixed = 5.43;
  return static_cast<double>((items + at_once - 1) / at_once) *
             (static_cast<double>(per * span) * (kClusterPerChunk + kClusterPerChunkBusy * busy) + kClusterWave) +
         kClusterFixed;
}

// The split forms' modelled time (us on an H100): waves of the resident CTAs over the units, each
// its chunks plus a fixed cost, then the part sums' traffic (written, then read by the addition),
// x's image (a third kernel, and its bytes written and read) and a fixed cost of the addition. The
// 64-token form's fitted on 1 to 8 parts per CTA within 8% (docs/PERFORMANCE_LOG.md, "The split
// form for 128 tokens, and the models refitted"; its chunk and x's image in "x through a bulk
// copy"). The 128-token form's refitted on 13 shapes at 128-256 rows with every part count
// ("The 128-token split form's model refitted"), within 17%: a unit that folds its parts
// (split_folds) costs 2.8 us more a wave, the addition kernel 3.6 us where it runs (P < S), and
// the part sums little (0.08 us a MiB: they stay in L2). folds: whether the units fold their parts;
// adds: whether the addition runs.
template <int NT>
double split_time(std::int64_t units, std::int64_t resident, std::int64_t unit_chunks, std::size_t sums_bytes, std::size_t image_bytes, bool folds,
                  bool adds) {
  constexpr double kPerChunk = NT == 8 ? 0.91 : 1.19, kPerWave = NT == 8 ? 0.97 : 5.3, kFoldPerWave = NT == 8 ? 0.0 : 2.8,
                   kPerMiB = NT == 8 ? 0.53 : 0.08, kFixed = NT == 8 ? 4.5 : 0.0, kAddFixed = NT == 8 ? 0.0 : 3.6, kImageFixed = 0.8,
                   kImagePerMiB = 0.6;
  return static_cast<double>((units + resident - 1) / resident) * (static_cast<double>(unit_chunks) * kPerChunk + kPerWave + (folds ? kFoldPerWave : 0.0)) +
         static_cast<double>(sums_bytes) / (1 << 20) * kPerMiB + kFixed + (adds ? kAddFixed : 0.0) + kImageFixed +
         static_cast<double>(image_bytes) / (1 << 20) * kImagePerMiB;
}

// The 256-token form's modelled time (us on an H100): waves of the resident CTAs over the units,
// each its chunks at a cost that grows with the share of the SMs busy (x from L2 for every CTA)
// plus a fixed cost (the pipeline's start, the parts' additions in shared memory, the stores),
// then the part sums' traffic (written, then read by the addition) and x's image (a first
// kernel). Fitted on 14336x4096, 4096x14336, 8192x28672 and 4096x4096 at 256 rows with every
// number of parts per CTA, within 8% there and 10% at 192 rows (docs/PERFORMANCE_LOG.md, "The
// 256-token form's model refitted after its copies"). busy: the share of the SMs running a unit.
inline double wgmma256_time(std::int64_t units, std::int64_t resident, double busy, std::int64_t unit_chunks, std::size_t sums_bytes, std::size_t image_bytes) {
  constexpr double kPerChunk = 1.539, kPerChunkBusy = 0.211, kPerWave = 6.50, kPerMiB = 0.543, kImageFixed = 0.8, kImagePerMiB = 0.6;
  return static_cast<double>((units + resident - 1) / resident) * (static_cast<double>(unit_chunks) * (kPerChunk + kPerChunkBusy * busy) + kPerWave) +
         static_cast<double>(sums_bytes) / (1 << 20) * kPerMiB + kImageFixed + static_cast<double>(image_bytes) / (1 << 20) * kImagePerMiB;
}

// A workspace form's parts of k per CTA, 2^log2, its work units with them (items x S / P) and its
// modelled time; chosen: whether any count was allowed (else the time is infinite).
struct PartsChoice {
  unsigned log2 = 0;
  std::int64_t units = 0;
  double time = 1e300;
  bool chosen = false;
};

// What a workspace form for 8 NT tokens prices its parts per CTA from: S parts of `span` chunks
// each, its items and x's image.
struct WorkspaceForm {
  unsigned log2_split;
  ItemGrid grid;
  std::int64_t chunks, span;
  std::size_t image_bytes;
};

// Of P = 1 to S parts per CTA (forced_parts alone where not 0), the count of least modelled time:
// price(form, log2 P, units), infinite where that count cannot run.
template <int NT, class Price>
PartsChoice cheapest_parts(std::int64_t n, std::int64_t k, std::int64_t m, unsigned log2_split, int forced_parts, Price price) {
  const std::int64_t chunks = chunk_count(k);
  const ItemGrid grid = item_grid(n, m, kWarps, kTileRows, NT);
  const WorkspaceForm form{log2_split, grid, chunks, part_span(chunks, log2_split), x_image_bytes<NT>(grid.token_tiles, k)};
  PartsChoice best;
  for (unsigned per_log2 = 0; per_log2 <= log2_split; ++per_log2) {
    if (forced_parts != 0 && (1 << per_log2) != forced_parts) continue;
    const std::int64_t units = grid.items << (log2_split - per_log2);
    const double t = price(form, per_log2, units);
    if (t < best.time) best = {per_log2, units, t, true};
  }
  return best;
}

// The split form for 8 NT tokens (NT = 8 or 16). resident(folds): the CTAs resident at once of
// the kernel that runs with a count (the folding one or the plain one).
template <int NT, class Resident>
PartsChoice split_parts_choice(std::int64_t n, std::int64_t k, std::int64_t m, unsigned log2_split, int forced_parts, Resident resident) {
  return cheapest_parts<NT>(n, k, m, log2_split, forced_parts, [&](const WorkspaceForm& f, unsigned per_log2, std::int64_t units) {
    const bool folds = split_folds<NT>(f.log2_split, per_log2);
    return split_time<NT>(units, std::min<std::int64_t>(units, resident(folds)), f.span << per_log2,
                          split_sums_bytes<NT>(f.grid.items, f.log2_split, per_log2), f.image_bytes, folds, per_log2 < f.log2_split);
  });
}

// The 256-token form, with `resident` CTAs at once on `sms` SMs. A count that would leave a unit
// without chunks is not taken (the kernel runs none).
inline PartsChoice wgmma256_parts_choice(std::int64_t n, std::int64_t k, std::int64_t m, unsigned log2_split, int forced_parts, std::int64_t resident,
                                         int sms) {
  constexpr int NT = 32;
  return cheapest_parts<NT>(n, k, m, log2_split, forced_parts, [&](const WorkspaceForm& f, unsigned per_log2, std::int64_t units) {
    const std::int64_t groups = std::int64_t{1} << (f.log2_split - per_log2), unit_chunks = std::min(f.span << per_log2, f.chunks);
    if ((groups - 1) * unit_chunks >= f.chunks) return 1e300;
    const std::int64_t launched = std::min(units, resident);
    const double busy = std::min(1.0, static_cast<double>(launched) / sms);
    return wgmma256_time(units, launched, busy, unit_chunks, split_sums_bytes<NT>(f.grid.items, f.log2_split, per_log2), f.image_bytes);
  });
}

// The kernels the automatic choice weighs past 16 tokens (gemv_launch.h's GemvMmaKernel of the
// same names).
enum class WideKernel { stream2, wide32, wide64, wgmma64, wgmma128, wgmma64_cluster, wgmma64_split, wgmma128_split, wgmma256 };

// Past 16 tokens the automatic choice takes the kernel of least modelled time: the streaming kernel
// decodes W once per 16 tokens with its work spread evenly over the SMs; the wide and warpgroup
// kernels decode it once per item of 32, 64 or 128 tokens, one CTA per SM, so they run whole waves
// of items (few rows leave SMs idle). Costs are SM-times of one 128-row, 128-column chunk, measured
// on an H100 (docs/PERFORMANCE_LOG.md, "The fast contract past 16 tokens" and "on warpgroup MMAs"),
// plus a fixed 5 us for the streaming kernel (its small-weight times, "... on a cluster's SMs"; its
// 0.87 us a chunk set so that at 6144x4096 and 24-32 tokens, 26.2-26.4 us, it ranks behind the
// cluster form, 23.4-23.6, as measured: "The cluster form's model refitted", where its per-chunk
// cost at 24 to 128 tokens ranges 0.70-0.92 us by shape); the 64-token warpgroup kernel's as a cost
// per chunk and one per wave (its pipeline's start: "Four parts of k per CTA"), which a cost per
// chunk alone overstates for long k by a fifth, and so the 128-token one's ("The split form for 128
// tokens": 1.48 us a chunk and 11.7 a wave, within 1% of 14336x4096, 4096x14336 and 8192x28672 at
// 128 and 256 tokens, where 1.91 a chunk overstated 8192x28672 by a quarter). wgmma: whether the
// warpgroup kernels can run (gemv_wgmma_available).
// cluster: the cluster form's modelled time from its planned launch (cluster_launch_time), which
// knows the clusters the device holds at once; split, split128: the split form's for 64 and 128
// tokens (split_time); wide256: the 256-token form's (wgmma256_time), which also takes the
// caller's memory and so the same margin; unavailable: infinite.
inline WideKernel automatic_wide(std::int64_t n, std::int64_t k, std::int64_t m, int sms, bool wgmma, double cluster, double split,
                             double split128, double wide256) {
  constexpr double kStreamPer16 = 0.87, kStreamFixed = 5.0, kWide32 = 1.10, kWide64 = 1.55, kWgmma64 = 0.967, kWgmma64Wave = 8.0, kWgmma128 = 1.48,
                   kWgmma128Wave = 11.7;
  // A split form must model a tenth faster than the rest: the models err by up to 8% (8192x28672 at
  // 64 tokens: the split form modelled 1% faster than the cluster form ran 9% slower), and a split
  // also takes the caller's memory.
  constexpr double kSplitMargin = 1.1;
  const double chunks = static_cast<double>(chunk_count(k));
  const double stream =
      static_cast<double>((m + 15) / 16) * (static_cast<double>(n) / (kWarps * kTileRows)) * chunks / sms * kStreamPer16 + kStreamFixed;
  const auto waves = [&](int nt, double per_chunk, double per_wave = 0.0) {
    const std::int64_t items = item_grid(n, m, kWarps, kTileRows, nt).items;
    return static_cast<double>((items + sms - 1) / sms) * (chunks * per_chunk + per_wave);
  };
  struct Cost {
    WideKernel kernel;
    double time;
  };
  Cost best{WideKernel::stream2, stream};
  // The warpgroup kernels last, so that without them the first two are the candidates.
  const Cost wide[] = {{WideKernel::wide32, waves(4, kWide32)},
                       {WideKernel::wide64, waves(8, kWide64)},
                       {WideKernel::wgmma64, waves(8, kWgmma64, kWgmma64Wave)},
                       {WideKernel::wgmma128, waves(16, kWgmma128, kWgmma128Wave)},
                       {WideKernel::wgmma64_cluster, cluster},
                       {WideKernel::wgmma64_split, split * kSplitMargin},
                       {WideKernel::wgmma128_split, split128 * kSplitMargin},
                       {WideKernel::wgmma256, wide256 * kSplitMargin}};
  for (int i = 0; i < (wgmma ? 8 : 2); ++i)
    if (wide[i].time < best.time) best = wide[i];
  return best.kernel;
}

}  // namespace nf4::cuda::mma
