// SPDX-License-Identifier: MIT
#include "core/tensor.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/format.h"

namespace nf4 {

TensorSizes expected_sizes(const nf4_tensor& t) {
  TensorSizes s{};
  s.packed_bytes = ceil_div(t.numel, 2);
  s.absmax_count = ceil_div(t.numel, t.blocksize);
  s.nested_absmax_count = t.nested ? ceil_div(s.absmax_count, t.nested_blocksize) : 0;
  s.out_bytes = t.numel * static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  return s;
}

void check_disjoint(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output,
                    const char* what, const std::string& whose) {
  const auto overlaps = [&](const void* p, std::int64_t bytes) {
    const auto o = reinterpret_cast<std::uintptr_t>(out), a = reinterpret_cast<std::uintptr_t>(p);
    return p && a < o + static_cast<std::uintptr_t>(out_bytes) && o < a + static_cast<std::uintptr_t>(bytes);
  };
  const auto check = [&](bool used, const void* p, std::int64_t bytes, const char* field) {
    if (used && overlaps(p, bytes)) fail(NF4_ERR_ALIASING, "{}: out overlaps {}{}", what, whose, field);
  };
  check(true, t.packed, s.packed_bytes, "packed");
  check(true, t.absmax, s.absmax_count * (t.nested ? 1 : 4), "absmax");
  check(t.nested, t.nested_absmax, s.nested_absmax_count * 4, "nested_absmax");
  // The tables too: kernels read them while others write (found by tests/fuzz/fuzz_capi).
  check(true, t.quant_map, format::kQuantMapSize * 4, "quant_map");
  check(t.nested, t.nested_code, format::kNestedCodeSize * 4, "nested_code");
  check(t.nested, t.nested_offset_ptr, 4, "nested_offset_ptr");
  check(include_output, t.out, s.out_bytes, "out");
}

namespace {
TensorSizes check(const nf4_tensor& t, const char* what, bool check_output) {
  const std::int32_t quant_type = enum_bits(t.quant_type), out_dtype = enum_bits(t.out_dtype);
  if (quant_type != NF4_QUANT_NF4 && quant_type != NF4_QUANT_FP4)
    fail(NF4_ERR_QUANT_TYPE, "{}: quant_type must be NF4 (0) or FP4 (1), got {}", what, quant_type);
  if (out_dtype != NF4_DTYPE_F16 && out_dtype != NF4_DTYPE_BF16 && out_dtype != NF4_DTYPE_F32)
    fail(NF4_ERR_DTYPE, "{}: out_dtype must be F16 (0), BF16 (1) or F32 (2), got {}", what, out_dtype);
  if (t.numel < 1 || t.numel > NF4_MAX_ELEMENTS)
    fail(NF4_ERR_ELEMENT_COUNT, "{}: numel must be in [1, 2^56], got {}", what, t.numel);
  if (!is_power_of_two(t.blocksize) || t.blocksize < format::kMinBlocksize || t.blocksize > format::kMaxBlocksize)
    fail(NF4_ERR_BLOCKSIZE, "{}: blocksize must be a power of two in [32, 4096], got {}", what, t.blocksize);
  if (t.nested != 0 && t.nested != 1)
    fail(NF4_ERR_INVALID_ARGUMENT, "{}: nested must be 0 or 1, got {}", what, t.nested);

  TensorSizes s{};
  s.packed_bytes = ceil_div(t.numel, 2);
  s.absmax_count = ceil_div(t.numel, t.blocksize);
  s.out_bytes = t.numel * static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  // nested_absmax_count is set below, once nested_blocksize is known to be valid.

  if (!t.packed) fail(NF4_ERR_NULL_POINTER, "{}: packed is NULL", what);
  if (!t.absmax) fail(NF4_ERR_NULL_POINTER, "{}: absmax is NULL", what);
  if (check_output && !t.out) fail(NF4_ERR_NULL_POINTER, "{}: out is NULL", what);
  if (t.quant_type == NF4_QUANT_NF4 && !t.quant_map) fail(NF4_ERR_NULL_POINTER, "{}: quant_map is NULL (required for NF4)", what);

  if (t.packed_bytes != s.packed_bytes)
    fail(NF4_ERR_PACKED_SIZE, "{}: packed_bytes must be ceil(numel/2) = {} for numel {}, got {}", what, s.packed_bytes, t.numel, t.packed_bytes);
  if (t.absmax_count != s.absmax_count)
    fail(NF4_ERR_ABSMAX_SIZE, "{}: absmax_count must be ceil(numel/blocksize) = {} (numel {}, blocksize {}), got {}", what,
         s.absmax_count, t.numel, t.blocksize, t.absmax_count);
  if (t.quant_map && t.quant_map_count != format::kQuantMapSize)
    fail(NF4_ERR_QUANT_MAP_SIZE, "{}: quant_map_count must be 16, got {}", what, t.quant_map_count);

  if (t.nested) {
    if (!is_power_of_two(t.nested_blocksize) || t.nested_blocksize > format::kMaxNestedBlocksize)
      fail(NF4_ERR_NESTED_BLOCKSIZE, "{}: nested_blocksize must be a power of two in [1, 2^20], got {}", what, t.nested_blocksize);
    if (!t.nested_absmax) fail(NF4_ERR_NULL_POINTER, "{}: nested_absmax is NULL (nested = 1)", what);
    if (!t.nested_code) fail(NF4_ERR_NULL_POINTER, "{}: nested_code is NULL (nested = 1)", what);
    s.nested_absmax_count = ceil_div(s.absmax_count, t.nested_blocksize);
    if (t.nested_absmax_count != s.nested_absmax_count)
      fail(NF4_ERR_NESTED_ABSMAX_SIZE,
           "{}: nested_absmax_count must be ceil(absmax_count/nested_blocksize) = {} (absmax_count {}, nested_blocksize {}), got {}",
           what, s.nested_absmax_count, s.absmax_count, t.nested_blocksize, t.nested_absmax_count);
    if (t.nested_code_count != format::kNestedCodeSize)
      fail(NF4_ERR_NESTED_CODE_SIZE, "{}: nested_code_count must be 256, got {}", what, t.nested_code_count);
  }

  if (!check_output) return s;
  if (t.out_bytes < s.out_bytes)
    fail(NF4_ERR_OUTPUT_TOO_SMALL, "{}: out_bytes must be at least numel * {} = {}, got {}", what,
         nf4_dtype_size(t.out_dtype), s.out_bytes, t.out_bytes);

  // The output must not overlap an input: the kernels read and write in parallel.
  check_disjoint(t.out, s.out_bytes, t, s, /*include_output=*/false, what, "");
  return s;
}
}  // namespace

TensorSizes validate(const nf4_tensor& t, const char* what) { return check(t, what, true); }
TensorSizes validate_inputs(const nf4_tensor& t, const char* what) { return check(t, what, false); }

void value_table(const nf4_tensor& t, float out[16]) {
  for (unsigned q = 0; q < 16; ++q)
    out[q] = t.quant_type == NF4_QUANT_FP4 ? format::fp4_value(q) : t.quant_map[q];
}

}  // namespace nf4
