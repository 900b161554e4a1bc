// SPDX-License-Identifier: MIT
// Validation of an nf4_tensor, and the sizes derived from it. Every backend validates through
// here before touching memory, so a description that passes is safe to run on any backend.
#pragma once

#include <cstdint>
#include <cstring>
#if !defined(__CUDACC__) || __cplusplus >= 202002L
#include <span>
#endif
#include <string>
#include <vector>

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

// The scalar fields of a description, without addresses: what every front end (nf4_tensor,
// nf4_vulkan_tensor, a checkpoint's quant state) has in common, and all that planning needs.
struct Geometry {
  std::int32_t quant_type;
  std::int32_t out_dtype;
  std::int64_t numel;
  std::int32_t blocksize;
  std::int32_t nested;
  std::int32_t nested_blocksize;  // read only when nested
};
Geometry geometry_of(const nf4_tensor& t);

// Checks the scalars (quant type, dtype, element count, blocksizes, the nested flag) and returns
// the sizes they imply. Throws nf4::Error naming the field, the expected and the actual value;
// `what` prefixes the message (e.g. "tensor 3").
TensorSizes validate_geometry(const Geometry& g, const char* what = "tensor");

// validate_geometry() plus the description's counts and pointers (non-null where required), the
// output's capacity and the output not overlapping the tensor's own inputs.
TensorSizes validate(const nf4_tensor& t, const char* what = "tensor");
// The same checks without the output (out, out_bytes, aliasing): for describing stored data.
TensorSizes validate_inputs(const nf4_tensor& t, const char* what = "tensor");
// The same without the pointers: the scalars and counts of a description of stored data whose
// addresses are not known (a checkpoint's tensors, validated before any of them is read).
TensorSizes validate_counts(const nf4_tensor& t, const char* what = "tensor");

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (never where either is NULL).
bool ranges_overlap(const void* a, std::int64_t a_bytes, const void* b, std::int64_t b_bytes);

// The first buffer of `t` that [out, out + out_bytes) overlaps ("packed", "absmax", ...; with
// include_output also "out"), or nullptr.
const char* overlapping_field(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output);

// Fails with NF4_ERR_ALIASING when [out, out + out_bytes) overlaps a buffer `t` reads (and, with
// include_output, the one it writes). `whose` prefixes the field in the message ("tensor 2's ").
void check_disjoint(const void* out, std::int64_t out_bytes, const nf4_tensor& t, const TensorSizes& s, bool include_output,
                    const char* what, const std::string& whose);

// The call-level interfaces below are C++20 host code; the kernels' CUDA sources (compiled as
// C++17) that include this header for the sizes above do not see them.
#if !defined(__CUDACC__) || __cplusplus >= 202002L
// A description that passed validation, with the sizes it implies. Made once, at the API
// boundary (validate_call); planning and the backends take it as given and never re-check it.
struct ValidTensor {
  nf4_tensor t;
  TensorSizes sizes;
};

// Validates every tensor of one call (naming the first bad one: "tensor 3: ...") and that no
// tensor's output overlaps any buffer of another tensor of the call, every pair, whatever their
// dtypes: one launch reads and writes them all at once.
std::vector<ValidTensor> validate_call(const nf4_tensor* tensors, std::size_t count);

// The label validation messages use for tensor i of a call of `count`.
std::string tensor_label(std::size_t i, std::size_t count);

// The pointer check of a prepared launch (nf4_prepared_launch*): each tensor's buffers are the
// prepared ones with `outs[i]` or `buffers[i]` substituted (at most one of the two is given);
// every buffer present where the prepared description had one, and the overlap rules of
// validate_call. Returns nothing; throws like validation.
void check_launch_buffers(std::span<const ValidTensor> prepared, void* const* outs, const nf4_buffers* buffers);

// Tensor i's description with the addresses of a launch substituted (see check_launch_buffers).
nf4_tensor with_buffers(const ValidTensor& v, std::size_t i, void* const* outs, const nf4_buffers* buffers);

#endif  // host code or C++20

// The 16 values a code maps to, as the kernels use them: the quant type's built-in table
// (core/types.h), else the stored quant_map, which must then be host memory.
void value_table(const nf4_tensor& t, float out[16]);

}  // namespace nf4
