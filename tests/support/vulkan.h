// SPDX-License-Identifier: MIT
// Fixtures of the Vulkan tests (tests/test_vulkan_*.cpp): a minimal Vulkan application with its own
// instance, device and host-visible buffers, into whose command buffers nf4's jobs are recorded;
// weights placed in its buffers at odd offsets; the embedded run checked against the oracle and
// for bytes written outside the outputs. The Khronos validation layer is on for the whole test
// binary (NF4_VULKAN_VALIDATION=1, set below before the registry is built) and for the test's own
// "application" instance: any validation message fails the test that saw it.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/oracle.h"
#include "backends/vulkan/vk_kernels.h"
#include "backends/vulkan/vk_loader.h"
#include "nf4/nf4.h"
#include "nf4/nf4_vulkan.h"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/env.h"

namespace nf4::test {

// NF4_VULKAN_TUNE's table setting, one character per row of kDtypes: `pattern` repeated over the
// rows ("table=101" for three rows, "table=1011" for four).
inline std::string tune_table(std::string_view pattern) {
  std::string s = "table=";
  for (std::size_t i = 0; i < std::size(kDtypes); ++i) s += pattern[i % pattern.size()];
  return s;
}

// Before main(): the backend reads it when the registry is first built.
// NF4_TEST_VALIDATION=0 (see App) leaves the backend's layer off too.
inline const bool g_vulkan_validation_env = [] {
  const char* validate = std::getenv("NF4_TEST_VALIDATION");
  if (!(validate && validate[0] == '0' && validate[1] == 0)) setenv("NF4_VULKAN_VALIDATION", "1", 0);
  return true;
}();

// Validation and performance messages reported to the test applications' messengers.
inline std::atomic<int> g_app_messages{0};

inline VKAPI_ATTR VkBool32 VKAPI_CALL app_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT types,
                                                  const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (types & (VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)) ++g_app_messages;
  std::fprintf(stderr, "app validation: %s\n", data->pMessage);
  return VK_FALSE;
}

inline bool vulkan_available() { return backend_ready(NF4_BACKEND_VULKAN); }

inline VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

// A minimal Vulkan application: its own instance (validation layer on), device, queue, buffers in
// host-visible memory, one command buffer per "frame".
struct App {
  vk::GlobalFns g;
  vk::InstanceFns i;
  vk::DeviceFns d;
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  std::uint32_t family = 0, api = 0;
  VkQueue queue = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  vk::DeviceInfo info;
  bool coop = false;  // the device was created with the fast product's features
  VkPhysicalDeviceMemoryProperties memory{};

  struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    std::uint8_t* data = nullptr;
    VkDeviceSize size = 0;
  };
  std::deque<Buffer> buffers;  // stable references

  App() {
    g = vk::system_loader();
    std::uint32_t loader = VK_API_VERSION_1_1;
    if (g.vkEnumerateInstanceVersion) g.vkEnumerateInstanceVersion(&loader);
    api = std::min<std::uint32_t>(loader, VK_API_VERSION_1_3);
    VkApplicationInfo ai{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, "nf4-test", 1, nullptr, 0, api};
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkDebugUtilsMessengerCreateInfoEXT mi{};
    mi.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = app_message;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pNext = &mi;
    ci.pApplicationInfo = &ai;
    // NF4_TEST_VALIDATION=0 runs without the layer: for a machine that has none, or only one too old
    // for the extensions the device enables (Debian 12's 1.3.239 predates VK_KHR_cooperative_matrix).
    const char* validate = std::getenv("NF4_TEST_VALIDATION");
    const bool with_layer = !(validate && std::string(validate) == "0");
    ci.enabledLayerCount = with_layer ? 1 : 0;
    ci.ppEnabledLayerNames = with_layer ? &layer : nullptr;
    ci.enabledExtensionCount = 1;
    ci.ppEnabledExtensionNames = &ext;
    vk::check(g.vkCreateInstance(&ci, nullptr, &instance), "vkCreateInstance (test app)");
    i = vk::load_instance(g.vkGetInstanceProcAddr, instance);
    vk::check(i.vkCreateDebugUtilsMessengerEXT(instance, &mi, nullptr, &messenger), "vkCreateDebugUtilsMessengerEXT");

    // The same device the standalone backend picks: NF4_VULKAN_DEVICE, else a GPU before a CPU.
    std::uint32_t n = 0;
    i.vkEnumeratePhysicalDevices(instance, &n, nullptr);
    std::vector<VkPhysicalDevice> pds(n);
    i.vkEnumeratePhysicalDevices(instance, &n, pds.data());
    REQUIRE(n > 0);
    pd = pds[0];
    const char* want = std::getenv("NF4_VULKAN_DEVICE");
    for (std::size_t k = 0; k < pds.size(); ++k) {
      VkPhysicalDeviceProperties p;
      i.vkGetPhysicalDeviceProperties(pds[k], &p);
      if (want && *want) {
        if (std::to_string(k) == want || std::string(p.deviceName).find(want) != std::string::npos) {
          pd = pds[k];
          break;
        }
      } else if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) {
        pd = pds[k];
        break;
      }
    }
    info = vk::query_device(i, pd, api);
    std::uint32_t nf = 0;
    i.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, nullptr);
    std::vector<VkQueueFamilyProperties> fams(nf);
    i.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, fams.data());
    while (family < nf && !(fams[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
    REQUIRE(family < nf);
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, nullptr, 0, family, 1, &prio};
    VkDeviceCreateInfo di{};
    di.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    // Like an application that wants nf4's fast product: the cooperative-matrix extensions and
    // features where the device has them (then nf4_context passes NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX).
    vk::CoopEnable coop_features;
    vk::coop_enable(info, coop_features);
    di.enabledExtensionCount = static_cast<std::uint32_t>(coop_features.extensions.size());
    di.ppEnabledExtensionNames = coop_features.extensions.data();
    di.pNext = coop_features.chain;
    coop = coop_features.chain != nullptr;
    vk::check(i.vkCreateDevice(pd, &di, nullptr, &device), "vkCreateDevice (test app)");
    d = vk::load_device(i.vkGetDeviceProcAddr, device);
    d.vkGetDeviceQueue(device, family, 0, &queue);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr, VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, family};
    vk::check(d.vkCreateCommandPool(device, &pi, nullptr, &pool), "vkCreateCommandPool");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, nullptr, 0};
    vk::check(d.vkCreateFence(device, &fi, nullptr, &fence), "vkCreateFence");
    i.vkGetPhysicalDeviceMemoryProperties(pd, &memory);
  }

  ~App() {
    d.vkDeviceWaitIdle(device);
    for (Buffer& b : buffers) {
      d.vkDestroyBuffer(device, b.buffer, nullptr);
      d.vkFreeMemory(device, b.memory, nullptr);
    }
    d.vkDestroyFence(device, fence, nullptr);
    d.vkDestroyCommandPool(device, pool, nullptr);
    d.vkDestroyDevice(device, nullptr);
    i.vkDestroyDebugUtilsMessengerEXT(instance, messenger, nullptr);
    i.vkDestroyInstance(instance, nullptr);
  }

  Buffer& buffer(VkDeviceSize size) {
    Buffer b;
    b.size = round_up(size, 16);
    VkBufferCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    ci.size = b.size;
    ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    vk::check(d.vkCreateBuffer(device, &ci, nullptr, &b.buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    d.vkGetBufferMemoryRequirements(device, b.buffer, &req);
    const VkMemoryPropertyFlags need = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    std::uint32_t type = 0;
    while (type < memory.memoryTypeCount &&
           (!(req.memoryTypeBits & (1u << type)) || (memory.memoryTypes[type].propertyFlags & need) != need))
      ++type;
    REQUIRE(type < memory.memoryTypeCount);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, req.size, type};
    vk::check(d.vkAllocateMemory(device, &ai, nullptr, &b.memory), "vkAllocateMemory");
    vk::check(d.vkBindBufferMemory(device, b.buffer, b.memory, 0), "vkBindBufferMemory");
    void* p = nullptr;
    vk::check(d.vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
    b.data = static_cast<std::uint8_t*>(p);
    buffers.push_back(b);
    return buffers.back();
  }

  // One "frame": records with f into a fresh command buffer, submits, waits.
  void frame(const std::function<void(VkCommandBuffer)>& f) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr, pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    VkCommandBuffer cmd;
    vk::check(d.vkAllocateCommandBuffers(device, &ai, &cmd), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
    vk::check(d.vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    f(cmd);
    vk::check(d.vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    vk::check(d.vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
    vk::check(d.vkWaitForFences(device, 1, &fence, VK_TRUE, ~std::uint64_t{0}), "vkWaitForFences");
    vk::check(d.vkResetFences(device, 1, &fence), "vkResetFences");
    // The pool is reset with the command buffer (RESET_COMMAND_BUFFER_BIT not needed: freed here).
    d.vkResetCommandPool(device, pool, 0);
  }

  void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags sa, VkPipelineStageFlags dst, VkAccessFlags da) {
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, sa, da};
    d.vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  // One frame of the application's own work around an nf4 job: fills `out` with 0xA5 (the poison
  // that must survive outside the job's outputs), records the job, copies `out` into `readback`.
  void run_between(nf4_vulkan_job* job, Buffer& out, Buffer& readback) {
    frame([&](VkCommandBuffer cmd) {
      d.vkCmdFillBuffer(cmd, out.buffer, 0, VK_WHOLE_SIZE, 0xA5A5A5A5u);  // the app's own work before
      barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      REQUIRE(nf4_vulkan_job_record(job, cmd) == NF4_OK);
      barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_TRANSFER_READ_BIT);
      const VkBufferCopy all{0, 0, out.size};
      d.vkCmdCopyBuffer(cmd, out.buffer, readback.buffer, 1, &all);  // ... and after
      barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    });
  }

  // fast: tell nf4 about the cooperative-matrix features where the device was created with them.
  nf4_vulkan_context* nf4_context(bool fast = true) {
    nf4_vulkan_context_info ci{};
    ci.features = fast && coop ? NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX : 0u;
    ci.instance = instance;
    ci.physical_device = pd;
    ci.device = device;
    ci.queue_family_index = family;
    ci.api_version = api;
    ci.get_instance_proc_addr = g.vkGetInstanceProcAddr;
    nf4_vulkan_context* ctx = nullptr;
    const nf4_status s = nf4_vulkan_context_create(&ci, &ctx);
    INFO(nf4_vulkan_last_error(nullptr));
    REQUIRE(s == NF4_OK);
    return ctx;
  }
};

// Places a weight's arrays in `in` (one buffer, each array at a 4-byte-aligned but otherwise odd
// offset) and its output in `out` at a 16-byte-aligned odd offset, with poisoned gaps between.
struct Placement {
  VkDeviceSize in_at = 4, out_at = 48;
  int skew = 0;

  nf4_vulkan_buffer put(App::Buffer& b, const void* src, std::int64_t bytes) {
    in_at = round_up(in_at, 4) + 4 * (1 + (skew++ % 7));
    const nf4_vulkan_buffer r{b.buffer, in_at, round_up(static_cast<VkDeviceSize>(bytes), 4)};
    REQUIRE(in_at + r.size <= b.size);
    std::memcpy(b.data + in_at, src, static_cast<std::size_t>(bytes));
    in_at += r.size;
    return r;
  }
  nf4_vulkan_buffer out(App::Buffer& b, std::int64_t bytes) {
    out_at = round_up(out_at, 16) + 16 * (1 + (skew++ % 5));
    const nf4_vulkan_buffer r{b.buffer, out_at, round_up(static_cast<VkDeviceSize>(bytes), 4)};
    REQUIRE(out_at + r.size + 16 <= b.size);
    out_at += r.size;
    return r;
  }
};

inline nf4_vulkan_tensor describe(const cpu::QuantizedWeight& w, nf4_dtype d, App::Buffer& in, App::Buffer& out, Placement& p,
                                  const float* offset_value = nullptr) {
  nf4_vulkan_tensor t{};
  t.quant_type = w.quant_type;
  t.out_dtype = d;
  t.numel = w.numel;
  t.blocksize = w.blocksize;
  t.nested = w.nested ? 1 : 0;
  t.nested_blocksize = w.nested_blocksize;
  t.nested_offset = w.nested_offset;
  t.packed = p.put(in, w.packed.data(), static_cast<std::int64_t>(w.packed.size()));
  if (w.nested) t.absmax = p.put(in, w.absmax_u8.data(), static_cast<std::int64_t>(w.absmax_u8.size()));
  else t.absmax = p.put(in, w.absmax_f32.data(), static_cast<std::int64_t>(w.absmax_f32.size() * 4));
  if (w.quant_type == NF4_QUANT_NF4) t.quant_map = p.put(in, w.quant_map.data(), 64);
  if (w.nested) {
    t.nested_absmax = p.put(in, w.nested_absmax.data(), static_cast<std::int64_t>(w.nested_absmax.size() * 4));
    t.nested_code = p.put(in, w.nested_code.data(), 1024);
    if (offset_value) {
      t.nested_offset = -1234.0f;  // must be ignored: the buffer wins
      t.nested_offset_buffer = p.put(in, offset_value, 4);
    }
  }
  t.out = p.out(out, w.numel * static_cast<std::int64_t>(nf4_dtype_size(d)));
  return t;
}

// The oracle's output for w in dtype d.
inline std::vector<std::uint8_t> oracle(const cpu::QuantizedWeight& w, nf4_dtype d) {
  std::vector<std::uint8_t> e(static_cast<std::size_t>(w.numel) * nf4_dtype_size(d));
  cpu::oracle_dequantize(w.describe(d, e.data(), static_cast<std::int64_t>(e.size())));
  return e;
}

// Records fill (app work) -> nf4 -> copy (app work) into one frame and checks every output and
// every byte around them (the poison must survive: nothing written outside an output).
inline void run_embedded(App& app, nf4_vulkan_context* ctx, const std::vector<cpu::QuantizedWeight>& ws,
                         const std::vector<nf4_dtype>& dtypes, std::size_t* dispatches = nullptr) {
  VkDeviceSize in_bytes = 4096, out_bytes = 4096;
  for (std::size_t k = 0; k < ws.size(); ++k) {
    in_bytes += ws[k].packed.size() + ws[k].absmax_f32.size() * 4 + ws[k].absmax_u8.size() + ws[k].nested_absmax.size() * 4 + 2048;
    out_bytes += static_cast<VkDeviceSize>(ws[k].numel) * nf4_dtype_size(dtypes[k]) + 128;
  }
  App::Buffer& in = app.buffer(in_bytes);
  App::Buffer& out = app.buffer(out_bytes);
  App::Buffer& readback = app.buffer(out_bytes);
  Placement p;
  std::vector<nf4_vulkan_tensor> ts;
  std::vector<float> offsets(ws.size());
  for (std::size_t k = 0; k < ws.size(); ++k) {
    offsets[k] = ws[k].nested_offset;
    ts.push_back(describe(ws[k], dtypes[k], in, out, p, k % 2 ? &offsets[k] : nullptr));
  }
  nf4_vulkan_job* job = nullptr;
  const nf4_status s = nf4_vulkan_job_create(ctx, ts.data(), ts.size(), &job);
  INFO(nf4_vulkan_last_error(ctx));
  REQUIRE(s == NF4_OK);
  if (dispatches) *dispatches = nf4_vulkan_job_dispatch_count(job);
  app.run_between(job, out, readback);
  nf4_vulkan_job_destroy(job);

  std::vector<bool> owned(readback.size, false);
  for (std::size_t k = 0; k < ws.size(); ++k) {
    const auto expected = oracle(ws[k], dtypes[k]);
    const std::uint8_t* got = readback.data + ts[k].out.offset;
    CHECK_MESSAGE(differing_elements(expected.data(), got, ws[k].numel, dtypes[k]) == 0,
                  "n=" << ws[k].numel << " qt=" << ws[k].quant_type << " bs=" << ws[k].blocksize << " nested=" << ws[k].nested
                       << " nbs=" << ws[k].nested_blocksize << " " << std::string(dtype_label(dtypes[k])));
    for (std::size_t b = 0; b < expected.size(); ++b) owned[ts[k].out.offset + b] = true;
  }
  std::size_t clobbered = 0;
  for (VkDeviceSize b = 0; b < readback.size; ++b) clobbered += !owned[b] && readback.data[b] != 0xA5;
  CHECK_MESSAGE(clobbered == 0, clobbered << " bytes outside the outputs were written");
}

// No validation message from the test applications' instances nor from nf4's own (standalone
// contexts, NF4_VULKAN_VALIDATION=1) so far in this process.
inline void check_no_validation_messages() {
  CHECK(g_app_messages.load() == 0);
  CHECK(vk::validation_message_count() == 0);
}

}  // namespace nf4::test
