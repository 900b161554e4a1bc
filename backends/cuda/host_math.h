// SPDX-License-Identifier: MIT
// Small host-side helpers shared by the cuda backend's launch code (plain C++).
#pragma once

#include <cstdint>

namespace nf4::cuda {

// log2 of a power of two (validated blocksizes), as the kernels' shift counts.
inline int log2_exact(std::int64_t v) {
  int l = 0;
  while ((std::int64_t{1} << l) < v) ++l;
  return l;
}

}  // namespace nf4::cuda
