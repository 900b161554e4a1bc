// SPDX-License-Identifier: MIT
#include "backends/cpu/oracle.h"

#include <cstring>

#include "core/dtype.h"
#include "core/format.h"
#include "core/tensor.h"

namespace nf4::cpu {

float oracle_absmax(const nf4_tensor& t, std::int64_t block) {
  if (!t.nested) return static_cast<const float*>(t.absmax)[block];
  const std::uint8_t q = static_cast<const std::uint8_t*>(t.absmax)[block];
  const float offset = t.nested_offset_ptr ? *t.nested_offset_ptr : t.nested_offset;
  const float scaled = t.nested_code[q] * t.nested_absmax[block / t.nested_blocksize];  // fl32, rounded here
  return scaled + offset;                                                              // fl32, never an FMA
}

float oracle_weight(const nf4_tensor& t, const float values[16], std::int64_t i) {
  const unsigned q = format::code_of(t.packed[i / 2], (i & 1) != 0);
  return values[q] * oracle_absmax(t, i / t.blocksize);  // fl32
}

void oracle_dequantize_range(const nf4_tensor& t, std::int64_t first, std::int64_t count) {
  float values[16];
  value_table(t, values);
  dispatch_dtype(t.out_dtype, [&](auto dtype) {
    for (std::int64_t i = first; i < first + count; ++i)
      store_element<decltype(dtype)::value>(t.out, i, oracle_weight(t, values, i));  // fl32, then RNE to the dtype
  });
}

void oracle_dequantize(const nf4_tensor& t) {
  validate(t);
  oracle_dequantize_range(t, 0, t.numel);
}

}  // namespace nf4::cpu
