// SPDX-License-Identifier: MIT
// Small helpers shared by the bench runners (bench/bench.h), the CUDA tuner and `nf4 bench`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "nf4/nf4.h"

namespace nf4::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Bytes a dequantization must move (docs/DESIGN.md section 4): codes + absmax (+ nested) + output.
inline std::int64_t minimum_bytes(const nf4_tensor& t) {
  const TensorSizes s = validate_inputs(t);
  return s.packed_bytes + s.absmax_count * (t.nested ? 1 : 4) + s.nested_absmax_count * 4 + s.out_bytes;
}

// A deep copy of host tensors' inputs with freshly allocated outputs, so a runner can rotate
// among several copies (defeating the caches) without touching the caller's buffers.
struct HostTensorCopy {
  std::vector<nf4_tensor> tensors;
  std::vector<std::vector<std::uint8_t>> storage;

  HostTensorCopy(const nf4_tensor* src, std::size_t count) {
    tensors.assign(src, src + count);
    storage.reserve(count * 6);
    for (nf4_tensor& t : tensors) {
      const TensorSizes s = expected_sizes(t);
      t.packed = static_cast<const std::uint8_t*>(copy(t.packed, s.packed_bytes));
      t.absmax = copy(t.absmax, s.absmax_count * (t.nested ? 1 : 4));
      if (t.quant_map) t.quant_map = static_cast<const float*>(copy(t.quant_map, 16 * 4));
      if (t.nested) {
        t.nested_absmax = static_cast<const float*>(copy(t.nested_absmax, s.nested_absmax_count * 4));
        t.nested_code = static_cast<const float*>(copy(t.nested_code, 256 * 4));
        if (t.nested_offset_ptr) t.nested_offset_ptr = static_cast<const float*>(copy(t.nested_offset_ptr, 4));
      }
      storage.emplace_back(s.out_bytes);
      t.out = storage.back().data();
      t.out_bytes = s.out_bytes;
    }
  }

 private:
  const void* copy(const void* p, std::int64_t bytes) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    storage.emplace_back(b, b + bytes);
    return storage.back().data();
  }
};

}  // namespace nf4::bench
