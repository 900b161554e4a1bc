// SPDX-License-Identifier: MIT
// The CUDA kernels load each array through its element type, and a misaligned device access
// faults: every entry of this backend checks the arrays it hands a kernel against that rule (a
// rule of this backend, not of the format, so not the core's validation). Arrays aligned to their
// element type, as any C array of that type is, pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace nf4::cuda {

// Whether p is null or `alignment`-byte aligned.
inline bool aligned(const void* p, std::size_t alignment) { return !p || reinterpret_cast<std::uintptr_t>(p) % alignment == 0; }

// A weight's statistics and tables that the kernels read: f(pointer, alignment, field name) for
// each one the weight has (the caller reports a misaligned one in its own words).
template <class F>
void for_each_weight_array(const nf4_tensor& t, F&& f) {
  if (!t.nested) f(t.absmax, 4, "absmax (float array)");
  if (uses_quant_map(t.quant_type)) f(t.quant_map, 4, "quant_map");
  if (t.nested) {
    f(t.nested_absmax, 4, "nested_absmax");
    f(t.nested_code, 4, "nested_code");
    f(t.nested_offset_ptr, 4, "nested_offset_ptr");
  }
}

}  // namespace nf4::cuda
