// SPDX-License-Identifier: MIT
// The standalone Vulkan backend's device access (vulkan_backend.cpp), as an extension
// (Backend::extension<DeviceExtension>()) for code outside the library that records its own work
// on the backend's device: the bench runner (bench/vulkan/vulkan_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/vulkan/vk_kernels.h"
#include "backends/vulkan/vk_loader.h"
#include "core/gemv.h"
#include "nf4/nf4.h"

namespace nf4::vk {

// A buffer with its own memory, freed on every path.
struct Buffer {
  const DeviceFns* d = nullptr;
  VkDevice device = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceSize size = 0;
  void* mapped = nullptr;

  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      d = o.d;
      device = o.device;
      buffer = std::exchange(o.buffer, VK_NULL_HANDLE);
      memory = std::exchange(o.memory, VK_NULL_HANDLE);
      size = std::exchange(o.size, 0);
      mapped = std::exchange(o.mapped, nullptr);
    }
    return *this;
  }
  ~Buffer() { release(); }
  void release() {
    if (buffer) d->vkDestroyBuffer(device, buffer, nullptr);
    if (memory) d->vkFreeMemory(device, memory, nullptr);  // unmaps too
    buffer = VK_NULL_HANDLE;
    memory = VK_NULL_HANDLE;
    mapped = nullptr;
    size = 0;
  }
};

constexpr VkBufferUsageFlags kUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

// Host bytes to copy into a device buffer: (offset in the buffer, (source, bytes)).
using UploadPieces = std::vector<std::pair<VkDeviceSize, std::pair<const void*, std::size_t>>>;

// A device copy of the weight and x of a validated host product, and a y buffer (host-visible
// when `host_y`), described for Kernels::prepare_gemv.
struct GemvBuffers {
  Buffer inputs, y;
  GemvView view;
};

class DeviceExtension {
 public:
  static constexpr std::string_view kId = "vulkan.device";
  virtual const DeviceFns& fns() const = 0;
  virtual VkDevice device() const = 0;
  // Valid bits of the queue's timestamps (0: none) and nanoseconds per tick.
  virtual std::uint32_t timestamp_bits() const = 0;
  virtual double timestamp_period_ns() const = 0;
  virtual Kernels& kernels() = 0;
  // host: host-visible and mapped; else device-local (mapped too where that memory is host-visible).
  virtual Buffer make_buffer(VkDeviceSize size, bool host) = 0;
  // Records with `fill` into one command buffer, submits it and waits.
  virtual void run_commands(const std::function<void(VkCommandBuffer)>& fill) = 0;
  virtual void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                       VkAccessFlags dst_access) = 0;
  // Copies host bytes into `dst` (staged unless it is mapped) and waits.
  virtual void upload(Buffer& dst, const UploadPieces& pieces) = 0;
  virtual GemvBuffers upload_gemv(const ValidGemv& g, bool host_y) = 0;

 protected:
  ~DeviceExtension() = default;
};

}  // namespace nf4::vk
