// SPDX-License-Identifier: MIT
// Validation of an nf4_gemv_desc (the fused matrix-vector product, nf4.h) and the helpers every
// backend shares: the padding rule and the output conversion of docs/GEMV.md.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "core/tensor.h"
#include "nf4/nf4.h"

namespace nf4 {

struct GemvSizes {
  TensorSizes weight;      // the weight's array sizes (out_bytes unused)
  std::int64_t x_bytes;    // m * k * sizeof(x_dtype)
  std::int64_t y_bytes;    // m * n * sizeof(y_dtype)
};

// The scalars of a product, without addresses: what every front end (nf4_gemv_desc,
// nf4_vulkan_gemv) has in common. Enums as their integer representation (enum_bits).
struct GemvGeometry {
  Geometry weight;  // out_dtype is not used by the product
  std::int64_t n, k;
  std::int32_t m;
  std::int32_t x_dtype, y_dtype;
};

// Rows of X the exact contract's kernels take per launch: a longer X runs as slices of this many
// rows (the exact contract's row j depends on row j of X alone, so slicing changes no bit).
inline constexpr std::int32_t kGemvExactRows = 8;

// Checks the weight's scalars (validate_geometry, "gemv weight"), the shape against the weight's
// numel, m and the dtypes; returns the sizes they imply. Throws nf4::Error naming the field.
GemvSizes validate_gemv_geometry(const GemvGeometry& g);

// A product description that passed validate_gemv, with the sizes it implies. Made once, at the
// API boundary; planning and the backends take it as given and never re-check it. desc.weight
// points to the caller's tensor (or a prepared product's copy of it), which must outlive the value.
struct ValidGemv {
  nf4_gemv_desc desc;
  GemvSizes sizes;
};

// Throws nf4::Error naming the field: the weight (as validate_inputs), the shape and dtypes (as
// validate_gemv_geometry), the pointers, y's capacity and y overlapping x or any buffer of the weight.
ValidGemv validate_gemv(const nf4_gemv_desc& g);
// The part of validate_gemv that depends on x and y: y overlapping x or any buffer of the weight,
// the workspace overlapping any of them (also what a prepared product's launch checks of new
// pointers).
void check_gemv_y(const nf4_gemv_desc& g, const GemvSizes& s);

// Whether the description asks for the fast contract and its activations allow it (fp16 or bf16
// x); a backend then decides whether it has the path (Backend::gemv_fast).
bool gemv_wants_fast(const nf4_gemv_desc& g);

// Rows [first, first + rows) of a valid product: x and y advanced by first rows, m = rows, the
// sizes those rows imply. Valid by construction (a sub-range of checked buffers).
ValidGemv gemv_rows(const ValidGemv& g, std::int32_t first, std::int32_t rows);

// Rows of X a backend takes in one call: all of them under the fast contract, kGemvExactRows at a
// time under the exact one (desc.mode resolved).
inline std::int32_t gemv_slice_rows(const ValidGemv& v) { return v.desc.mode == NF4_GEMV_FAST ? v.desc.m : kGemvExactRows; }

// Calls fn(first_row, slice) for each slice of gemv_slice_rows rows.
template <typename Fn>
void for_each_gemv_slice(const ValidGemv& v, Fn&& fn) {
  const std::int32_t rows = gemv_slice_rows(v);
  for (std::int32_t first = 0; first < v.desc.m; first += rows)
    fn(first, first == 0 && rows >= v.desc.m ? v : gemv_rows(v, first, rows < v.desc.m - first ? rows : v.desc.m - first));
}

// The contract pads the tree with +0.0f leaves up to P = bit_ceil(k). An implementation that
// evaluates a larger tree (P' > P, its own granularity) gets the same root when it pads every leaf
// at or past k with this value: with k a power of two the contract has no padding and the extra
// leaves must leave a -0.0f root alone (x + -0 == x for every x); otherwise the root has a +0 leaf,
// is never -0, and adding +0 subtrees changes nothing. (A node is -0 exactly when all its leaves
// are -0: under round-to-nearest-even an exact cancellation gives +0.)
NF4_HD constexpr std::uint32_t gemv_pad_bits(std::int64_t k) { return (k & (k - 1)) == 0 ? 0x80000000u : 0u; }

// The chunk count rounded up to a power of two: the chunk tree the GPU backends evaluate (its
// extra chunks hold padding leaves only).
NF4_HD constexpr std::int64_t gemv_padded_chunks(std::int64_t chunks) {
  std::int64_t padded = 1;
  while (padded < chunks) padded <<= 1;
  return padded;
}

// How many workers (CUDA warps of a CTA, Vulkan teams of a workgroup) share one row group's
// chunks: a power of two up to `max_split` dividing `workers` (those of one CTA or workgroup) and
// at most the chunk count rounded up to a power of two. `forced` > 0: that many, capped so. 0: the
// count whose waves of row groups over the `resident` workers times chunks per part is lowest, a
// larger count taken only where it costs a quarter less than the best smaller one (H100:
// splits gained 12-20% where this cost halves, nothing where it saves part of a wave, and lost
// 3-15% at m = 4 and 8 where taken for a 2% lower cost; docs/PERFORMANCE_LOG.md, "Splitting a row
// group over warps"); 1 where `resident` is unknown (0).
inline int gemv_split(std::int64_t groups, std::int64_t chunks, std::int64_t workers, std::int64_t resident, int forced, int max_split) {
  const std::int64_t padded = gemv_padded_chunks(chunks);
  int most = forced > 0 && forced < max_split ? forced : max_split;
  while (most > 1 && (most > workers || workers % most != 0 || most > padded)) most /= 2;
  if (forced > 0) return most;
  int best = 1;
  if (resident <= 0) return best;
  std::int64_t best_cost = 0;
  for (int split = 1; split <= most; split *= 2) {
    const std::int64_t waves = (groups * split + resident - 1) / resident;
    const std::int64_t cost = waves * (padded / split);
    if (split == 1 || cost * 4 <= best_cost * 3) best = split, best_cost = cost;
  }
  return best;
}

// The fast contract's bound on |Y - Y64| for one output (docs/GEMV.md section 6): Y64 the float64
// sum of the k products of the weights rounded to x's dtype with x, abs_sum the sum of their
// magnitudes. k * 2^-22 * abs_sum covers fp32 accumulation in any fixed order (a tensor core that
// aligns and truncates inside a step included), plus half a unit in the last place of y's dtype.
inline double gemv_fast_bound(std::int64_t k, double abs_sum, double y64, nf4_dtype y_dtype) {
  const double acc = static_cast<double>(k) * abs_sum / 4194304.0;  // 2^22
  int bits = 0;
  dispatch_dtype(y_dtype, [&](auto d) { bits = DtypeCodec<decltype(d)::value>::kSignificandBits; });
  const double half_ulp = (y64 < 0 ? -y64 : y64) + acc;
  return acc + half_ulp / static_cast<double>(std::int64_t{1} << bits) + 1e-30;
}

// The output bits of a result in y's dtype d: RNE to d, any NaN as d's positive quiet NaN. d is
// a row the product takes (validate_gemv refuses the others): only those have a case, so the
// kernels' stores carry no code for the rest.
NF4_HD inline std::uint32_t gemv_out_bits(float v, nf4_dtype d) {
  const std::uint32_t u = float_bits(v);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  switch (d) {
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product)                    \
  case value:                                                                                          \
    if constexpr ((product) != 0) return nan ? DtypeCodec<value>::nan_bits() : DtypeCodec<value>::from_bits(u); \
    break;
    NF4_DTYPES(NF4_X)
#undef NF4_X
  }
  unknown_row();
}

// y[at] = bits as a T. On the host through memcpy: y need not be aligned to its element there.
template <typename T>
NF4_HD inline void store_bits(void* y, std::int64_t at, std::uint32_t bits) {
  const T v = static_cast<T>(bits);
#if defined(__CUDA_ARCH__)
  static_cast<T*>(y)[at] = v;
#else
  std::memcpy(static_cast<T*>(y) + at, &v, sizeof v);
#endif
}

// Stores a result as y[at] in y's dtype d (gemv_out_bits): the row's size in bytes, nothing more.
// (The kernels' register budget is tight: the switch keeps the store as cheap as a two-way branch.)
NF4_HD inline void gemv_store(void* y, std::int64_t at, float v, nf4_dtype d) {
  const std::uint32_t bits = gemv_out_bits(v, d);
  switch (d) {
#define NF4_X(value, name, torch_name, aliases, enum_name, st_name, size, product) \
  case value:                                                                     \
    if constexpr ((product) != 0) {                                               \
      store_bits<typename DtypeCodec<value>::Storage>(y, at, bits);               \
      return;                                                                     \
    }                                                                             \
    break;
    NF4_DTYPES(NF4_X)
#undef NF4_X
  }
  unknown_row();
}

}  // namespace nf4
