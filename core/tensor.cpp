// SPDX-License-Identifier: MIT
#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "core/types.h"

namespace nf4 {

TensorSizes expected_sizes(const nf4_tensor& t) {
  TensorSizes s{};
  s.packed_bytes = ceil_div(t.numel, 2);
  s.absmax_count = ceil_div(t.numel, t.blocksize);
  s.nested_absmax_count = t.nested ? ceil_div(s.absmax_count, t.nested_blocksize) : 0;
  s.out_bytes = t.numel * static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  return s;
}

bool ranges_overlap(const void* a, std::int64_t a_bytes, const void* b, std::int64_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a && b && x < y + static_cast<std::uintptr_t>(b_bytes) && y < x + static_cast<std::uintptr_t>(a_bytes);
}

const char* overlapping_field(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output) {
  const auto overlaps = [&](const void* p, std::int64_t bytes) { return ranges_overlap(out, out_bytes, p, bytes); };
  if (overlaps(t.packed, s.packed_bytes)) return "packed";
  if (overlaps(t.absmax, s.absmax_count * (t.nested ? 1 : 4))) return "absmax";
  // The tables too: kernels read them while others write (found by tests/fuzz/fuzz_capi).
  if (overlaps(t.quant_map, format::kQuantMapSize * 4)) return "quant_map";
  if (t.nested) {
    if (overlaps(t.nested_absmax, s.nested_absmax_count * 4)) return "nested_absmax";
    if (overlaps(t.nested_code, format::kNestedCodeSize * 4)) return "nested_code";
    if (overlaps(t.nested_offset_ptr, 4)) return "nested_offset_ptr";
  }
  if (include_output && overlaps(t.out, s.out_bytes)) return "out";
  return nullptr;
}

void check_disjoint(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output,
                    const char* what, const std::string& whose) {
  if (const char* field = overlapping_field(out, out_bytes, t, s, include_output))
    fail(NF4_ERR_ALIASING, "{}: out overlaps {}{}", what, whose, field);
}

Geometry geometry_of(const nf4_tensor& t) {
  return Geometry{enum_bits(t.quant_type), enum_bits(t.out_dtype), t.numel, t.blocksize, t.nested, t.nested_blocksize};
}

TensorSizes validate_geometry(const Geometry& g, const char* what) {
  if (!find_quant_type(g.quant_type))
    fail(NF4_ERR_QUANT_TYPE, "{}: quant_type must be {}, got {}", what, quant_type_choices(), g.quant_type);
  const DtypeInfo* dtype = find_dtype(g.out_dtype);
  if (!dtype) fail(NF4_ERR_DTYPE, "{}: out_dtype must be {}, got {}", what, dtype_choices(), g.out_dtype);
  if (g.numel < 1 || g.numel > NF4_MAX_ELEMENTS)
    fail(NF4_ERR_ELEMENT_COUNT, "{}: numel must be in [1, 2^56], got {}", what, g.numel);
  if (!is_power_of_two(g.blocksize) || g.blocksize < format::kMinBlocksize || g.blocksize > format::kMaxBlocksize)
    fail(NF4_ERR_BLOCKSIZE, "{}: blocksize must be a power of two in [32, 4096], got {}", what, g.blocksize);
  if (g.nested != 0 && g.nested != 1)
    fail(NF4_ERR_INVALID_ARGUMENT, "{}: nested must be 0 or 1, got {}", what, g.nested);
  if (g.nested && (!is_power_of_two(g.nested_blocksize) || g.nested_blocksize > format::kMaxNestedBlocksize))
    fail(NF4_ERR_NESTED_BLOCKSIZE, "{}: nested_blocksize must be a power of two in [1, 2^20], got {}", what, g.nested_blocksize);
  TensorSizes s{};
  s.packed_bytes = ceil_div(g.numel, 2);
  s.absmax_count = ceil_div(g.numel, g.blocksize);
  s.nested_absmax_count = g.nested ? ceil_div(s.absmax_count, g.nested_blocksize) : 0;
  s.out_bytes = g.numel * static_cast<std::int64_t>(dtype->size);
  return s;
}

namespace {
// What check() looks at: the scalars and counts only (stored data described before any of it is
// read), also the input pointers, or everything including the output.
enum class Checks { Counts, Inputs, All };

TensorSizes check(const nf4_tensor& t, const char* what, Checks checks) {
  const TensorSizes s = validate_geometry(geometry_of(t), what);
  const bool pointers = checks != Checks::Counts;

  if (pointers && !t.packed) fail(NF4_ERR_NULL_POINTER, "{}: packed is NULL", what);
  if (pointers && !t.absmax) fail(NF4_ERR_NULL_POINTER, "{}: absmax is NULL", what);
  if (checks == Checks::All && !t.out) fail(NF4_ERR_NULL_POINTER, "{}: out is NULL", what);
  if (pointers && uses_quant_map(t.quant_type) && !t.quant_map)
    fail(NF4_ERR_NULL_POINTER, "{}: quant_map is NULL (required for {})", what, find_quant_type(t.quant_type)->enum_name);

  if (t.packed_bytes != s.packed_bytes)
    fail(NF4_ERR_PACKED_SIZE, "{}: packed_bytes must be ceil(numel/2) = {} for numel {}, got {}", what, s.packed_bytes, t.numel, t.packed_bytes);
  if (t.absmax_count != s.absmax_count)
    fail(NF4_ERR_ABSMAX_SIZE, "{}: absmax_count must be ceil(numel/blocksize) = {} (numel {}, blocksize {}), got {}", what,
         s.absmax_count, t.numel, t.blocksize, t.absmax_count);
  if ((t.quant_map || !pointers) && t.quant_map_count != format::kQuantMapSize)
    fail(NF4_ERR_QUANT_MAP_SIZE, "{}: quant_map_count must be 16, got {}", what, t.quant_map_count);

  if (t.nested) {
    if (pointers && !t.nested_absmax) fail(NF4_ERR_NULL_POINTER, "{}: nested_absmax is NULL (nested = 1)", what);
    if (pointers && !t.nested_code) fail(NF4_ERR_NULL_POINTER, "{}: nested_code is NULL (nested = 1)", what);
    if (t.nested_absmax_count != s.nested_absmax_count)
      fail(NF4_ERR_NESTED_ABSMAX_SIZE,
           "{}: nested_absmax_count must be ceil(absmax_count/nested_blocksize) = {} (absmax_count {}, nested_blocksize {}), got {}",
           what, s.nested_absmax_count, s.absmax_count, t.nested_blocksize, t.nested_absmax_count);
    if (t.nested_code_count != format::kNestedCodeSize)
      fail(NF4_ERR_NESTED_CODE_SIZE, "{}: nested_code_count must be 256, got {}", what, t.nested_code_count);
  }

  if (checks != Checks::All) return s;
  if (t.out_bytes < s.out_bytes)
    fail(NF4_ERR_OUTPUT_TOO_SMALL, "{}: out_bytes must be at least numel * {} = {}, got {}", what,
         nf4_dtype_size(t.out_dtype), s.out_bytes, t.out_bytes);

  // The output must not overlap an input: the kernels read and write in parallel.
  check_disjoint(t.out, s.out_bytes, t, s, /*include_output=*/false, what, "");
  return s;
}

// Within one call, no output may overlap what another tensor reads or writes: they all run in
// one launch (or, with mixed dtypes, in launches that may overlap on the device).
void check_group(std::span<const ValidTensor> ts, void* const* outs, const nf4_buffers* buffers) {
  const std::size_t n = ts.size();
  if (n < 2) return;
  const auto fail_overlap = [&](std::size_t o, std::size_t other, const char* field) {
    fail(NF4_ERR_ALIASING, "{}: out overlaps {}'s {}", tensor_label(o, n), tensor_label(other, n), field);
  };
  // Small groups (an MLP, a layer) compare every pair without allocating (prepared launches run
  // this on every call); large ones sort the ranges first.
  if (n <= 64) {
    for (std::size_t i = 0; i < n; ++i) {
      const nf4_tensor ti = with_buffers(ts[i], i, outs, buffers);
      for (std::size_t j = 0; j < n; ++j)
        if (i != j)
          if (const char* f = overlapping_field(ti.out, ts[i].sizes.out_bytes, with_buffers(ts[j], j, outs, buffers), ts[j].sizes, true))
            fail_overlap(i, j, f);
    }
    return;
  }
  std::vector<nf4_tensor> with(n);
  for (std::size_t i = 0; i < n; ++i) with[i] = with_buffers(ts[i], i, outs, buffers);
  struct Range {
    std::uintptr_t begin, end;
    std::size_t tensor;
    bool output;
  };
  std::vector<Range> ranges;
  const auto add = [&](const void* p, std::int64_t bytes, std::size_t i, bool out) {
    if (p) ranges.push_back({reinterpret_cast<std::uintptr_t>(p), reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(bytes), i, out});
  };
  for (std::size_t i = 0; i < n; ++i) {
    const nf4_tensor& t = with[i];
    const TensorSizes& s = ts[i].sizes;
    add(t.packed, s.packed_bytes, i, false);
    add(t.absmax, s.absmax_count * (t.nested ? 1 : 4), i, false);
    add(t.quant_map, format::kQuantMapSize * 4, i, false);
    if (t.nested) {
      add(t.nested_absmax, s.nested_absmax_count * 4, i, false);
      add(t.nested_code, format::kNestedCodeSize * 4, i, false);
      add(t.nested_offset_ptr, 4, i, false);
    }
    add(t.out, s.out_bytes, i, true);
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // Every overlapping pair of ranges is found by scanning, for each range, the ones that start
  // before it ends; a pair matters when one of them is an output of another tensor.
  for (std::size_t a = 0; a < ranges.size(); ++a)
    for (std::size_t b = a + 1; b < ranges.size() && ranges[b].begin < ranges[a].end; ++b) {
      const Range& x = ranges[a];
      const Range& y = ranges[b];
      if (x.tensor == y.tensor || (!x.output && !y.output)) continue;
      const std::size_t o = x.output ? x.tensor : y.tensor, other = x.output ? y.tensor : x.tensor;
      if (const char* f = overlapping_field(with[o].out, ts[o].sizes.out_bytes, with[other], ts[other].sizes, true)) fail_overlap(o, other, f);
    }
}
}  // namespace

std::string tensor_label(std::size_t i, std::size_t count) { return count == 1 ? std::string("tensor") : "tensor " + std::to_string(i); }

std::vector<ValidTensor> validate_call(const nf4_tensor* tensors, std::size_t count) {
  if (count > 0 && !tensors) fail(NF4_ERR_NULL_POINTER, "tensors is NULL");
  std::vector<ValidTensor> v;
  v.reserve(count);
  for (std::size_t i = 0; i < count; ++i) v.push_back(ValidTensor{tensors[i], validate(tensors[i], tensor_label(i, count).c_str())});
  check_group(v, nullptr, nullptr);
  return v;
}

nf4_tensor with_buffers(const ValidTensor& v, std::size_t i, void* const* outs, const nf4_buffers* buffers) {
  nf4_tensor t = v.t;
  if (outs) {
    t.out = outs[i];
  } else if (buffers) {
    const nf4_buffers& b = buffers[i];
    t.packed = b.packed;
    t.absmax = b.absmax;
    t.quant_map = b.quant_map;
    t.nested_absmax = b.nested_absmax;
    t.nested_code = b.nested_code;
    t.nested_offset_ptr = b.nested_offset_ptr;
    t.nested_offset = b.nested_offset;
    t.out = b.out;
  }
  return t;
}

void check_launch_buffers(std::span<const ValidTensor> prepared, void* const* outs, const nf4_buffers* buffers) {
  if (!outs && !buffers) return;  // the prepared buffers, checked when prepared
  const std::size_t n = prepared.size();
  for (std::size_t i = 0; i < n; ++i) {
    const ValidTensor& p = prepared[i];
    const nf4_tensor t = with_buffers(p, i, outs, buffers);
    if (!t.out) fail(NF4_ERR_NULL_POINTER, "{}: out is NULL", tensor_label(i, n));
    if (buffers) {
      const auto same_presence = [&](const void* now, const void* then, const char* field) {
        if ((now == nullptr) != (then == nullptr))
          fail(now ? NF4_ERR_INVALID_ARGUMENT : NF4_ERR_NULL_POINTER, "{}: {} is {} but was {} when prepared", tensor_label(i, n), field,
               now ? "set" : "NULL", then ? "set" : "NULL");
      };
      same_presence(t.packed, p.t.packed, "packed");
      same_presence(t.absmax, p.t.absmax, "absmax");
      same_presence(t.quant_map, p.t.quant_map, "quant_map");
      if (p.t.nested) {
        same_presence(t.nested_absmax, p.t.nested_absmax, "nested_absmax");
        same_presence(t.nested_code, p.t.nested_code, "nested_code");
        same_presence(t.nested_offset_ptr, p.t.nested_offset_ptr, "nested_offset_ptr");
      }
    }
    if (const char* f = overlapping_field(t.out, p.sizes.out_bytes, t, p.sizes, false))
      fail(NF4_ERR_ALIASING, "{}: out overlaps {}", tensor_label(i, n), f);
  }
  check_group(prepared, outs, buffers);
}

TensorSizes validate(const nf4_tensor& t, const char* what) { return check(t, what, Checks::All); }
TensorSizes validate_inputs(const nf4_tensor& t, const char* what) { return check(t, what, Checks::Inputs); }
TensorSizes validate_counts(const nf4_tensor& t, const char* what) { return check(t, what, Checks::Counts); }

void value_table(const nf4_tensor& t, float out[16]) {
  const float* values = find_quant_type(enum_bits(t.quant_type))->builtin_values;
  if (!values) values = t.quant_map;
  for (unsigned q = 0; q < 16; ++q) out[q] = values[q];
}

}  // namespace nf4
