// SPDX-License-Identifier: MIT
// The embedding API (include/nf4/nf4_vulkan.h): validation of buffer-described tensors, jobs that
// record into the application's command buffers. No exception crosses it.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/vulkan/vk_kernels.h"
#include "core/c_api_errors.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/tensor.h"
#include "core/types.h"
#include "nf4/nf4_vulkan.h"

struct nf4_vulkan_context {
  std::unique_ptr<nf4::vk::Kernels> kernels;
  std::string device_name;
  std::mutex job_mutex;
  nf4::ErrorSlots errors;
};

struct nf4_vulkan_job {
  // One Kernels job, or one per kGemvExactRows rows of x for a longer exact product.
  std::vector<std::unique_ptr<nf4::vk::Job>> jobs;
  nf4_gemv_mode mode = NF4_GEMV_EXACT;
};

namespace {

// Every entry point reports through the shared C-API error slots (core/c_api_errors.h).
nf4_status guarded(const nf4_vulkan_context* ctx, auto&& f) noexcept {
  return nf4::guarded(ctx ? &const_cast<nf4_vulkan_context*>(ctx)->errors : nullptr, f);
}

nf4::vk::Region region(const nf4_vulkan_buffer& b) { return {b.buffer, b.offset, b.size}; }

// Checks one buffer range: present, aligned, large enough for `bytes` rounded up to a word.
void check_buffer(const nf4_vulkan_buffer& b, const char* what, const char* field, std::int64_t bytes, VkDeviceSize align,
                  nf4_status too_small) {
  if (b.buffer == VK_NULL_HANDLE) nf4::fail(NF4_ERR_NULL_POINTER, "{}: {}.buffer is VK_NULL_HANDLE", what, field);
  if (b.offset % align != 0)
    nf4::fail(NF4_ERR_INVALID_ARGUMENT, "{}: {}.offset must be a multiple of {} bytes, got {}", what, field, align, b.offset);
  const auto need = static_cast<VkDeviceSize>((bytes + 3) / 4 * 4);
  if (b.size < need)
    nf4::fail(too_small, "{}: {}.size must be at least {} bytes ({} bytes rounded up to 4), got {}", what, field, need, bytes, b.size);
  if (b.offset > ~VkDeviceSize{0} - b.size) nf4::fail(NF4_ERR_INVALID_ARGUMENT, "{}: {}.offset + size overflows", what, field);
}

// The first buffer range of `t` (with include_output, also its output) that shares bytes with
// `out`'s first `out_bytes` bytes, or nullptr.
const char* overlapped_field(const nf4_vulkan_buffer& out, std::int64_t out_bytes, const nf4_vulkan_tensor& t, const nf4::TensorSizes& s,
                             bool include_output) {
  const auto overlaps = [&](const nf4_vulkan_buffer& in, std::int64_t bytes) {
    return in.buffer != VK_NULL_HANDLE && in.buffer == out.buffer && in.offset < out.offset + static_cast<VkDeviceSize>(out_bytes) &&
           out.offset < in.offset + static_cast<VkDeviceSize>(bytes);
  };
  if (overlaps(t.packed, s.packed_bytes)) return "packed";
  if (overlaps(t.absmax, s.absmax_count * (t.nested ? 1 : 4))) return "absmax";
  if (overlaps(t.quant_map, 64)) return "quant_map";
  if (t.nested) {
    if (overlaps(t.nested_absmax, s.nested_absmax_count * 4)) return "nested_absmax";
    if (overlaps(t.nested_code, 1024)) return "nested_code";
    if (overlaps(t.nested_offset_buffer, 4)) return "nested_offset_buffer";
  }
  if (include_output && overlaps(t.out, s.out_bytes)) return "out";
  return nullptr;
}

// The weight's input buffers: present, aligned, large enough.
void check_input_buffers(const nf4_vulkan_tensor& v, const char* what, const nf4::TensorSizes& sizes) {
  check_buffer(v.packed, what, "packed", sizes.packed_bytes, 4, NF4_ERR_PACKED_SIZE);
  check_buffer(v.absmax, what, "absmax", sizes.absmax_count * (v.nested ? 1 : 4), 4, NF4_ERR_ABSMAX_SIZE);
  if (v.quant_map.buffer || nf4::uses_quant_map(v.quant_type)) check_buffer(v.quant_map, what, "quant_map", 64, 4, NF4_ERR_QUANT_MAP_SIZE);
  if (v.nested) {
    check_buffer(v.nested_absmax, what, "nested_absmax", sizes.nested_absmax_count * 4, 4, NF4_ERR_NESTED_ABSMAX_SIZE);
    check_buffer(v.nested_code, what, "nested_code", 1024, 4, NF4_ERR_NESTED_CODE_SIZE);
    if (v.nested_offset_buffer.buffer) check_buffer(v.nested_offset_buffer, what, "nested_offset_buffer", 4, 4, NF4_ERR_INVALID_ARGUMENT);
  }
}

// The DeviceTensor of a buffer description (no checks).
nf4::vk::DeviceTensor device_tensor(const nf4_vulkan_tensor& v) {
  nf4::vk::DeviceTensor t;
  // Enums copied as bits: an out-of-range value is the validation's to report (enum_bits).
  std::memcpy(&t.quant_type, &v.quant_type, sizeof t.quant_type);
  std::memcpy(&t.out_dtype, &v.out_dtype, sizeof t.out_dtype);
  t.numel = v.numel;
  t.blocksize = v.blocksize;
  t.nested = v.nested != 0;
  t.nested_blocksize = v.nested_blocksize;
  t.nested_offset = v.nested_offset;
  t.packed = region(v.packed);
  t.absmax = region(v.absmax);
  t.quant_map = region(v.quant_map);
  t.out = region(v.out);
  if (v.nested) {
    t.nested_absmax = region(v.nested_absmax);
    t.nested_code = region(v.nested_code);
    t.offset = region(v.nested_offset_buffer);
  }
  return t;
}

// The scalars of a buffer description, for core's validation.
nf4::Geometry geometry_of(const nf4_vulkan_tensor& v) {
  return nf4::Geometry{nf4::enum_bits(v.quant_type), nf4::enum_bits(v.out_dtype), v.numel, v.blocksize, v.nested, v.nested_blocksize};
}

nf4::vk::DeviceTensor validated(const nf4_vulkan_tensor& v, const char* what, nf4::TensorSizes* sizes_out) {
  const nf4::vk::DeviceTensor t = device_tensor(v);
  // The scalars through core's validation (the same checks and messages as nf4.h), then the
  // buffers by their own rules.
  const nf4::TensorSizes sizes = nf4::validate_geometry(geometry_of(v), what);

  check_input_buffers(v, what, sizes);
  check_buffer(v.out, what, "out", sizes.out_bytes, 16, NF4_ERR_OUTPUT_TOO_SMALL);

  // The output must not share bytes with an input (the kernels read and write in parallel).
  if (const char* field = overlapped_field(v.out, sizes.out_bytes, v, sizes, false)) nf4::fail(NF4_ERR_ALIASING, "{}: out overlaps {}", what, field);
  *sizes_out = sizes;
  return t;
}

// A product: the scalars through core's validation (the weight's, the shape and the dtypes: the
// same checks and messages as nf4_gemv_validate), then the buffers by their own rules.
nf4::vk::GemvView validated_gemv(const nf4_vulkan_gemv& g) {
  if (!g.weight) nf4::fail(NF4_ERR_NULL_POINTER, "gemv: weight is NULL");
  const nf4::GemvSizes sizes =
      nf4::validate_gemv_geometry(nf4::GemvGeometry{geometry_of(*g.weight), g.n, g.k, g.m, nf4::enum_bits(g.x_dtype), nf4::enum_bits(g.y_dtype)});
  // The mode as its integer (enum_bits): a value outside the enum is the caller's, not a valid load.
  if (const std::int32_t mode = nf4::enum_bits(g.mode); mode != NF4_GEMV_EXACT && mode != NF4_GEMV_FAST)
    nf4::fail(NF4_ERR_INVALID_ARGUMENT, "gemv: mode must be NF4_GEMV_EXACT (0) or NF4_GEMV_FAST (1), got {}", mode);
  nf4::vk::GemvView view;
  view.weight = device_tensor(*g.weight);
  view.weight.out = {};
  view.weight.out_dtype = NF4_DTYPE_F32;  // not used by the product
  check_input_buffers(*g.weight, "gemv weight", sizes.weight);
  check_buffer(g.x, "gemv", "x", sizes.x_bytes, 4, NF4_ERR_INVALID_ARGUMENT);
  check_buffer(g.y, "gemv", "y", sizes.y_bytes, 4, NF4_ERR_OUTPUT_TOO_SMALL);
  // y must share no byte with x or with any of the weight's buffers.
  const bool y_over_x = g.x.buffer == g.y.buffer && g.x.offset < g.y.offset + static_cast<VkDeviceSize>(sizes.y_bytes) &&
                        g.y.offset < g.x.offset + static_cast<VkDeviceSize>(sizes.x_bytes);
  if (y_over_x) nf4::fail(NF4_ERR_ALIASING, "gemv: y overlaps x");
  if (const char* field = overlapped_field(g.y, sizes.y_bytes, *g.weight, sizes.weight, false))
    nf4::fail(NF4_ERR_ALIASING, "gemv: y overlaps the weight's {}", field);
  view.n = g.n;
  view.k = g.k;
  view.m = g.m;
  view.x_dtype = g.x_dtype;
  view.y_dtype = g.y_dtype;
  view.x = {g.x.buffer, g.x.offset, static_cast<VkDeviceSize>(sizes.x_bytes)};
  view.y = {g.y.buffer, g.y.offset, static_cast<VkDeviceSize>(sizes.y_bytes)};
  return view;
}

}  // namespace

extern "C" {

nf4_status nf4_vulkan_gemv_job_create(nf4_vulkan_context* ctx, const nf4_vulkan_gemv* gemv, nf4_vulkan_job** job) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(ctx, [&] {
    if (!job) nf4::fail(NF4_ERR_NULL_POINTER, "job is NULL");
    *job = nullptr;
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    nf4::vk::GemvView view = validated_gemv(*gemv);
    view.mode = nf4::enum_bits(gemv->mode) == NF4_GEMV_FAST && ctx->kernels->gemv_fast(view.x_dtype) ? NF4_GEMV_FAST : NF4_GEMV_EXACT;
    std::lock_guard lock(ctx->job_mutex);
    auto j = std::make_unique<nf4_vulkan_job>();
    j->mode = view.mode;
    // The exact shader holds kGemvExactRows rows of x: longer x runs as slices (each row depends
    // on its own row of x alone, so slicing changes no bit).
    const std::int32_t step = view.mode == NF4_GEMV_FAST ? view.m : nf4::kGemvExactRows;
    const VkDeviceSize xs = nf4_dtype_size(view.x_dtype), ys = nf4_dtype_size(view.y_dtype);
    for (std::int32_t first = 0; first < view.m; first += step) {
      nf4::vk::GemvView slice = view;
      slice.m = std::min(step, view.m - first);
      const auto rows = static_cast<VkDeviceSize>(first);
      slice.x = {view.x.buffer, view.x.offset + rows * static_cast<VkDeviceSize>(view.k) * xs, static_cast<VkDeviceSize>(slice.m * view.k) * xs};
      slice.y = {view.y.buffer, view.y.offset + rows * static_cast<VkDeviceSize>(view.n) * ys, static_cast<VkDeviceSize>(slice.m * view.n) * ys};
      j->jobs.push_back(ctx->kernels->prepare_gemv(slice));
    }
    *job = j.release();
  });
}

nf4_status nf4_vulkan_context_create(const nf4_vulkan_context_info* info, nf4_vulkan_context** out) {
  return guarded(nullptr, [&] {
    if (!out) nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL");
    *out = nullptr;
    if (!info) nf4::fail(NF4_ERR_NULL_POINTER, "info is NULL");
    if (!info->instance) nf4::fail(NF4_ERR_NULL_POINTER, "info->instance is VK_NULL_HANDLE");
    if (!info->physical_device) nf4::fail(NF4_ERR_NULL_POINTER, "info->physical_device is VK_NULL_HANDLE");
    if (!info->device) nf4::fail(NF4_ERR_NULL_POINTER, "info->device is VK_NULL_HANDLE");
    PFN_vkGetInstanceProcAddr gipa = info->get_instance_proc_addr;
    if (!gipa) gipa = nf4::vk::system_loader().vkGetInstanceProcAddr;
    const nf4::vk::InstanceFns ifn = nf4::vk::load_instance(gipa, info->instance);
    PFN_vkGetDeviceProcAddr gdpa = info->get_device_proc_addr ? info->get_device_proc_addr : ifn.vkGetDeviceProcAddr;
    const nf4::vk::DeviceFns dfn = nf4::vk::load_device(gdpa, info->device);

    const std::uint32_t api = info->api_version ? info->api_version : VK_API_VERSION_1_1;
    const nf4::vk::DeviceInfo dev = nf4::vk::query_device(ifn, info->physical_device, api);
    if (dev.api_version < VK_API_VERSION_1_1)
      nf4::fail(NF4_ERR_UNSUPPORTED, "nf4 needs Vulkan 1.1; the instance or device '{}' offers {}.{}", dev.name(),
                VK_API_VERSION_MAJOR(dev.api_version), VK_API_VERSION_MINOR(dev.api_version));
    std::uint32_t families = 0;
    ifn.vkGetPhysicalDeviceQueueFamilyProperties(info->physical_device, &families, nullptr);
    std::vector<VkQueueFamilyProperties> props(families);
    ifn.vkGetPhysicalDeviceQueueFamilyProperties(info->physical_device, &families, props.data());
    if (info->queue_family_index >= families)
      nf4::fail(NF4_ERR_INVALID_ARGUMENT, "queue_family_index must be < {} (the device's queue families), got {}", families,
                info->queue_family_index);
    if (!(props[info->queue_family_index].queueFlags & VK_QUEUE_COMPUTE_BIT))
      nf4::fail(NF4_ERR_INVALID_ARGUMENT, "queue family {} has no VK_QUEUE_COMPUTE_BIT", info->queue_family_index);

    auto ctx = std::make_unique<nf4_vulkan_context>();
    ctx->kernels = std::make_unique<nf4::vk::Kernels>(dfn, info->device, dev, info->pipeline_cache, nf4::vk::tuning_for(dev));
    // nf4 never submits to the application's queue, so it cannot run the rounding checks here: a
    // hardware conversion is used only if a standalone context of this process proved it on the
    // same device and driver (vk_kernels.h, f16_verdict); otherwise the integer rounding.
    for (const nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_BF16})
      if (nf4::vk::f16_verdict(dev, d) == 1) ctx->kernels->enable_hardware_rounding(d);
    // The fast product only where the application enabled its features (nf4 cannot see which
    // features a VkDevice was created with) and the device has them (coop_enable).
    nf4::vk::CoopEnable coop;
    nf4::vk::coop_enable(dev, coop);
    if ((info->features & NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX) && coop.chain) ctx->kernels->enable_coop();
    ctx->device_name = dev.describe();
    *out = ctx.release();
  });
}

void nf4_vulkan_context_destroy(nf4_vulkan_context* ctx) { delete ctx; }

const char* nf4_vulkan_last_error(const nf4_vulkan_context* ctx) {
  return ctx ? ctx->errors.get() : nf4::thread_last_error().c_str();
}

const char* nf4_vulkan_device_name(const nf4_vulkan_context* ctx) { return ctx ? ctx->device_name.c_str() : ""; }

nf4_status nf4_vulkan_job_create(nf4_vulkan_context* ctx, const nf4_vulkan_tensor* tensors, size_t count, nf4_vulkan_job** job) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(ctx, [&] {
    if (!job) nf4::fail(NF4_ERR_NULL_POINTER, "job is NULL");
    *job = nullptr;
    if (count > 0 && !tensors) nf4::fail(NF4_ERR_NULL_POINTER, "tensors is NULL");
    std::vector<nf4::vk::DeviceTensor> ts;
    std::vector<nf4::TensorSizes> sizes;
    std::vector<std::int64_t> numels;
    for (std::size_t i = 0; i < count; ++i) {
      nf4::TensorSizes s{};
      ts.push_back(validated(tensors[i], nf4::tensor_label(i, count).c_str(), &s));
      sizes.push_back(s);
      numels.push_back(ts.back().numel);
    }
    // One job records all its dispatches without barriers between them: no tensor's output may
    // share bytes with any buffer of another tensor of the job.
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t j = 0; j < count; ++j)
        if (i != j)
          if (const char* field = overlapped_field(tensors[i].out, sizes[i].out_bytes, tensors[j], sizes[j], true))
            nf4::fail(NF4_ERR_ALIASING, "{}: out overlaps {}'s {}", nf4::tensor_label(i, count), nf4::tensor_label(j, count), field);
    std::lock_guard lock(ctx->job_mutex);
    const nf4::Plan plan = nf4::make_plan(numels, ctx->kernels->plan_params());
    std::vector<nf4::vk::ChunkView> views;
    for (std::size_t i = 0; i < ts.size(); ++i) {
      auto v = nf4::vk::chunk_views(ts[i], plan, i);
      views.insert(views.end(), v.begin(), v.end());
    }
    auto j = std::make_unique<nf4_vulkan_job>();
    j->jobs.push_back(ctx->kernels->prepare(views));
    *job = j.release();
  });
}

nf4_status nf4_vulkan_job_record(const nf4_vulkan_job* job, VkCommandBuffer cmd) {
  return guarded(nullptr, [&] {
    if (!job) nf4::fail(NF4_ERR_NULL_POINTER, "job is NULL");
    if (!cmd) nf4::fail(NF4_ERR_NULL_POINTER, "cmd is VK_NULL_HANDLE");
    for (const auto& j : job->jobs) j->record(cmd);
  });
}

size_t nf4_vulkan_job_dispatch_count(const nf4_vulkan_job* job) {
  std::size_t n = 0;
  if (job)
    for (const auto& j : job->jobs) n += j->dispatch_count();
  return n;
}

nf4_gemv_mode nf4_vulkan_job_gemv_mode(const nf4_vulkan_job* job) { return job ? job->mode : NF4_GEMV_EXACT; }

void nf4_vulkan_job_destroy(nf4_vulkan_job* job) { delete job; }

}  // extern "C"
