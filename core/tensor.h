// SPDX-License-Identifier: MIT
// Validation of an nf4_tensor, and the sizes derived from it. Every backend validates through
// here before touching memory, so a description that passes is safe to run on any backend.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "nf4/nf4.h"

namespace nf4 {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
inline bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// A C caller may store any int in an enum field or argument, and loading an out-of-range value
// through the C++ enum type is undefined (UBSan -fsanitize=enum; found by tests/fuzz/fuzz_capi),
// so enums from the C API are read through their integer representation.
template <typename E>
std::int32_t enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(std::int32_t));
  std::int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// Sizes every valid tensor must have.
struct TensorSizes {
  std::int64_t packed_bytes;
  std::int64_t absmax_count;
  std::int64_t nested_absmax_count;  // 0 when flat
  std::int64_t out_bytes;
};

// The sizes implied by quant_type, numel, blocksize, nested, nested_blocksize and out_dtype,
// assuming those fields are valid (validate() checks them first).
TensorSizes expected_sizes(const nf4_tensor& t);

// Throws nf4::Error with the field, the expected and the actual value. `what` prefixes the
// message (e.g. "tensor 3") for grouped calls. Checks pointers only for non-null-ness.
TensorSizes validate(const nf4_tensor& t, const char* what = "tensor");
// The same checks without the output (out, out_bytes, aliasing): for describing stored data.
TensorSizes validate_inputs(const nf4_tensor& t, const char* what = "tensor");

// Fails with NF4_ERR_ALIASING when [out, out + out_bytes) overlaps a buffer `t` reads (and, with
// include_output, the one it writes). `whose` prefixes the field in the message ("tensor 2's ").
void check_disjoint(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output,
                    const char* what, const std::string& whose);

// The 16 values a code maps to, as the kernels use them: NF4 -> quant_map, FP4 -> bnb's table.
// `quant_map` must be host memory here (NF4 only).
void value_table(const nf4_tensor& t, float out[16]);

}  // namespace nf4
