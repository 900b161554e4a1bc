// SPDX-License-Identifier: MIT
#include "core/gemv.h"

#include <string>

#include "core/error.h"
#include "core/format.h"
#include "core/types.h"

namespace nf4 {

namespace {

// The product's own scalars, given a weight whose scalars passed validate_geometry.
GemvSizes product_sizes(const GemvGeometry& g, const TensorSizes& weight) {
  if (g.n < 1 || g.k < 1)
    fail(NF4_ERR_SHAPE, "gemv: n and k must be at least 1, got n = {}, k = {}", g.n, g.k);
  // n * k can overflow only if it exceeds NF4_MAX_ELEMENTS, which numel never does.
  if (g.n > NF4_MAX_ELEMENTS / g.k || g.n * g.k != g.weight.numel)
    fail(NF4_ERR_SHAPE, "gemv: n * k must equal the weight's numel {}, got n = {}, k = {}", g.weight.numel, g.n, g.k);
  if (g.m < 1 || g.m > NF4_GEMV_MAX_M)
    fail(NF4_ERR_SHAPE, "gemv: m must be in [1, {}], got {}", NF4_GEMV_MAX_M, g.m);
  const DtypeInfo* x = find_dtype(g.x_dtype);
  const DtypeInfo* y = find_dtype(g.y_dtype);
  if (!x || !x->product) fail(NF4_ERR_DTYPE, "gemv: x_dtype must be {}, got {}", product_dtype_choices(), g.x_dtype);
  if (!y || !y->product) fail(NF4_ERR_DTYPE, "gemv: y_dtype must be {}, got {}", product_dtype_choices(), g.y_dtype);
  // x and y are tensors too: at most NF4_MAX_ELEMENTS elements each, so their byte counts fit 64
  // bits (n and k do alone; m up to NF4_GEMV_MAX_M times either may not).
  if (g.k > NF4_MAX_ELEMENTS / g.m || g.n > NF4_MAX_ELEMENTS / g.m)
    fail(NF4_ERR_SHAPE, "gemv: x (m x k) and y (m x n) must hold at most 2^56 elements each, got m = {}, n = {}, k = {}", g.m, g.n,
         g.k);
  GemvSizes s{};
  s.weight = weight;
  s.x_bytes = g.m * g.k * static_cast<std::int64_t>(nf4_dtype_size(static_cast<nf4_dtype>(g.x_dtype)));
  s.y_bytes = g.m * g.n * static_cast<std::int64_t>(nf4_dtype_size(static_cast<nf4_dtype>(g.y_dtype)));
  return s;
}

// The weight's out_dtype, out and out_bytes are not used by the product: whatever they hold, the
// weight is validated as a tensor with this output dtype.
constexpr nf4_dtype kWeightOutDtype = NF4_DTYPE_F32;
}  // namespace

GemvSizes validate_gemv_geometry(const GemvGeometry& g) {
  Geometry w = g.weight;
  w.out_dtype = kWeightOutDtype;
  return product_sizes(g, validate_geometry(w, "gemv weight"));
}

ValidGemv validate_gemv(const nf4_gemv_desc& g) {
  if (!g.weight) fail(NF4_ERR_NULL_POINTER, "gemv: weight is NULL");
  nf4_tensor w = *g.weight;
  w.out_dtype = kWeightOutDtype;
  const GemvGeometry geometry{geometry_of(w), g.n, g.k, g.m, enum_bits(g.x_dtype), enum_bits(g.y_dtype)};
  ValidGemv v{g, product_sizes(geometry, validate_inputs(w, "gemv weight"))};
  if (!g.x) fail(NF4_ERR_NULL_POINTER, "gemv: x is NULL");
  if (!g.y) fail(NF4_ERR_NULL_POINTER, "gemv: y is NULL");
  if (g.y_bytes < v.sizes.y_bytes)
    fail(NF4_ERR_OUTPUT_TOO_SMALL, "gemv: y_bytes must be at least m * n * {} = {} (m {}, n {}), got {}", nf4_dtype_size(g.y_dtype),
         v.sizes.y_bytes, g.m, g.n, g.y_bytes);
  // Read as its integer representation: a caller's out-of-range value is no valid nf4_gemv_mode.
  if (const std::int32_t mode = enum_bits(g.mode); mode != NF4_GEMV_EXACT && mode != NF4_GEMV_FAST)
    fail(NF4_ERR_INVALID_ARGUMENT, "gemv: mode must be NF4_GEMV_EXACT (0) or NF4_GEMV_FAST (1), got {}", mode);
  if (g.workspace_bytes < 0) fail(NF4_ERR_INVALID_ARGUMENT, "gemv: workspace_bytes must be >= 0, got {}", g.workspace_bytes);
  if (!g.workspace && g.workspace_bytes != 0)
    fail(NF4_ERR_NULL_POINTER, "gemv: workspace is NULL but workspace_bytes is {} (0 without a workspace)", g.workspace_bytes);
  check_gemv_y(g, v.sizes);
  return v;
}

bool gemv_wants_fast(const nf4_gemv_desc& g) {
  return g.mode == NF4_GEMV_FAST && (g.x_dtype == NF4_DTYPE_F16 || g.x_dtype == NF4_DTYPE_BF16);
}

ValidGemv gemv_rows(const ValidGemv& g, std::int32_t first, std::int32_t rows) {
  ValidGemv s = g;
  const std::int64_t xs = nf4_dtype_size(g.desc.x_dtype), ys = nf4_dtype_size(g.desc.y_dtype);
  s.desc.m = rows;
  s.desc.x = static_cast<const unsigned char*>(g.desc.x) + first * g.desc.k * xs;
  s.desc.y = static_cast<unsigned char*>(g.desc.y) + first * g.desc.n * ys;
  s.sizes.x_bytes = rows * g.desc.k * xs;
  s.sizes.y_bytes = rows * g.desc.n * ys;
  s.desc.y_bytes = s.sizes.y_bytes;
  return s;
}

void check_gemv_y(const nf4_gemv_desc& g, const GemvSizes& s) {
  // y is written while x and the weight are read, in parallel.
  if (ranges_overlap(g.y, s.y_bytes, g.x, s.x_bytes)) fail(NF4_ERR_ALIASING, "gemv: y overlaps x");
  if (const char* field = overlapping_field(g.y, s.y_bytes, *g.weight, s.weight, /*include_output=*/false))
    fail(NF4_ERR_ALIASING, "gemv (y): out overlaps the weight's {}", field);
  // The workspace is written while x and the weight are read and y is written.
  if (g.workspace_bytes <= 0) return;  // no workspace, or one of no bytes
  if (ranges_overlap(g.workspace, g.workspace_bytes, g.x, s.x_bytes)) fail(NF4_ERR_ALIASING, "gemv: workspace overlaps x");
  if (ranges_overlap(g.workspace, g.workspace_bytes, g.y, s.y_bytes)) fail(NF4_ERR_ALIASING, "gemv: workspace overlaps y");
  if (const char* field = overlapping_field(g.workspace, g.workspace_bytes, *g.weight, s.weight, /*include_output=*/false))
    fail(NF4_ERR_ALIASING, "gemv: workspace overlaps the weight's {}", field);
}

}  // namespace nf4

#include "core/backend.h"

namespace nf4 {

void Backend::gemv(const ValidGemv&) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no raw device pointers for gemv: use nf4_gemv_host() or its native API",
       backend_name(kind()));
}

void Backend::gemv_host(const ValidGemv&) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no matrix-vector product", backend_name(kind()));
}

std::unique_ptr<PreparedGemv> Backend::prepare_gemv(const ValidGemv&) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no raw pointers for a prepared gemv: use its native API", backend_name(kind()));
}

}  // namespace nf4
