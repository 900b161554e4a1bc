// SPDX-License-Identifier: MIT
// The dispatch plan: how the work of one call (one tensor or a group) is split into launches,
// chunks and workgroups. Computed once here, read by every backend, so CUDA and Vulkan split the
// same way and the limits (grid size, storage-buffer range, loop lengths) are handled in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace nf4 {

// What a backend tells the planner about its kernel and device (see each backend's tuning table).
struct PlanParams {
  std::int64_t elements_per_item = 8;    // outputs one thread/invocation writes (even)
  std::int64_t items_per_group = 256;    // threads per block / invocations per workgroup
  std::int64_t max_groups = 0x7fffffff;  // workgroups one dispatch may have
  std::int64_t max_elements_per_chunk = std::int64_t{1} << 62;  // e.g. from maxStorageBufferRange
  std::int64_t chunk_alignment = 1;      // chunk starts are multiples of this (elements)
  std::size_t max_chunks_per_dispatch = 1;  // > 1: grouped launches (one kernel, many tensors)
};

// A contiguous element range [first_element, first_element + element_count) of one tensor,
// processed by `groups` workgroups starting at `first_group` of its dispatch.
struct Chunk {
  std::size_t tensor;
  std::int64_t first_element;
  std::int64_t element_count;
  std::int64_t first_group;
  std::int64_t groups;
};

// One kernel launch / vkCmdDispatch.
struct Dispatch {
  std::vector<Chunk> chunks;
  std::int64_t groups = 0;
};

struct Plan {
  PlanParams params;
  std::vector<Dispatch> dispatches;
};

// Splits the work of tensors of `numels[i]` elements (already validated: 1..NF4_MAX_ELEMENTS).
Plan make_plan(std::span<const std::int64_t> numels, const PlanParams& params);
// The same for a validated call.
Plan make_plan(std::span<const ValidTensor> tensors, const PlanParams& params);

}  // namespace nf4
