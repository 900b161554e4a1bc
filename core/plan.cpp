// SPDX-License-Identifier: MIT
#include "core/plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace nf4 {

Plan make_plan(std::span<const std::int64_t> numels, const PlanParams& params) {
  NF4_CHECK(params.elements_per_item > 0 && params.elements_per_item % 2 == 0);
  NF4_CHECK(params.items_per_group > 0 && params.max_groups > 0 && params.chunk_alignment > 0);
  NF4_CHECK(params.max_chunks_per_dispatch > 0);

  Plan plan;
  plan.params = params;
  const std::int64_t per_group = params.elements_per_item * params.items_per_group;
  // Largest chunk: bounded by the element limit and the group limit, rounded down to the alignment
  // (and to whole groups so that only a tensor's last chunk has a partial group).
  std::int64_t max_chunk = std::min(params.max_elements_per_chunk, params.max_groups * per_group);
  const std::int64_t align = std::lcm(params.chunk_alignment, per_group);
  max_chunk = max_chunk / align * align;
  NF4_CHECK(max_chunk > 0);

  Dispatch current;
  const auto flush = [&] {
    if (!current.chunks.empty()) plan.dispatches.push_back(std::move(current));
    current = Dispatch{};
  };
  for (std::size_t i = 0; i < numels.size(); ++i) {
    NF4_CHECK(numels[i] >= 1 && numels[i] <= NF4_MAX_ELEMENTS);
    for (std::int64_t first = 0; first < numels[i]; first += max_chunk) {
      const std::int64_t n = std::min(max_chunk, numels[i] - first);
      const std::int64_t groups = ceil_div(n, per_group);
      if (current.chunks.size() == params.max_chunks_per_dispatch || current.groups + groups > params.max_groups) flush();
      current.chunks.push_back(Chunk{i, first, n, current.groups, groups});
      current.groups += groups;
    }
  }
  flush();
  return plan;
}

Plan make_plan(std::span<const ValidTensor> tensors, const PlanParams& params) {
  std::vector<std::int64_t> numels;
  numels.reserve(tensors.size());
  for (const ValidTensor& v : tensors) numels.push_back(v.t.numel);
  return make_plan(numels, params);
}

}  // namespace nf4
