// SPDX-License-Identifier: MIT
#include "core/plan.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace nf4 {

Plan make_plan(const nf4_tensor* tensors, std::size_t count, const PlanParams& params) {
  if (count > 0 && !tensors) fail(NF4_ERR_NULL_POINTER, "tensors is NULL");
  NF4_CHECK(params.elements_per_item > 0 && params.elements_per_item % 2 == 0);
  NF4_CHECK(params.items_per_group > 0 && params.max_groups > 0 && params.chunk_alignment > 0);
  NF4_CHECK(params.max_chunks_per_dispatch > 0);

  Plan plan;
  plan.params = params;
  plan.sizes.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::string what = count == 1 ? std::string("tensor") : "tensor " + std::to_string(i);
    plan.sizes.push_back(validate(tensors[i], what.c_str()));
  }
  // Within a group, no output may overlap what another tensor reads or writes: they all run in
  // one launch.
  for (std::size_t i = 0; params.check_group_aliasing && i < count; ++i)
    for (std::size_t j = 0; j < count; ++j)
      if (i != j)
        check_disjoint(tensors[i].out, plan.sizes[i].out_bytes, tensors[j], plan.sizes[j], /*include_output=*/true,
                       ("tensor " + std::to_string(i)).c_str(), "tensor " + std::to_string(j) + "'s ");

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
  for (std::size_t i = 0; i < count; ++i) {
    for (std::int64_t first = 0; first < tensors[i].numel; first += max_chunk) {
      const std::int64_t n = std::min(max_chunk, tensors[i].numel - first);
      const std::int64_t groups = ceil_div(n, per_group);
      if (current.chunks.size() == params.max_chunks_per_dispatch || current.groups + groups > params.max_groups) flush();
      current.chunks.push_back(Chunk{i, first, n, current.groups, groups});
      current.groups += groups;
    }
  }
  flush();
  return plan;
}

}  // namespace nf4
