// SPDX-License-Identifier: MIT
// The Vulkan backend beyond the registry cross-check (test_backends.cpp covers dequantize_host on
// the golden cases and random sizes): embedded recording into an application's command buffer at
// buffer offsets, every variant, chunking, a tensor past lavapipe's 65,535-iteration limit, the
// integer fp16/bf16 rounding, subnormals. The Khronos validation layer is on for the whole test
// binary (NF4_VULKAN_VALIDATION=1, set below before the registry is built) and for the test's own
// "application" instance: any validation message fails the test.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <vector>

#include "backends/cpu/oracle.h"
#include "testdata/quantizer.h"
#include "backends/vulkan/vk_kernels.h"
#include "backends/vulkan/vk_loader.h"
#include "core/backend.h"
#include "core/half.h"
#include "core/tensor.h"
#include "nf4/nf4.hpp"
#include "nf4/nf4_vulkan.h"
#include "tests/support/gemv.h"
#include "tests/support/common.h"
#include "tests/support/env.h"

using namespace nf4;

namespace {

// Before main(): the backend reads it when the registry is first built.
const bool g_validation_env = [] {
  setenv("NF4_VULKAN_VALIDATION", "1", 0);
  return true;
}();

std::atomic<int> g_app_messages{0};

VKAPI_ATTR VkBool32 VKAPI_CALL app_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT types,
                                           const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  if (types & (VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)) ++g_app_messages;
  std::fprintf(stderr, "app validation: %s\n", data->pMessage);
  return VK_FALSE;
}

bool vulkan_available() { return test::backend_ready(NF4_BACKEND_VULKAN); }

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

using test::ScopedEnv;

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
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = &layer;
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

  nf4_vulkan_context* nf4_context() {
    nf4_vulkan_context_info ci{};
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

nf4_vulkan_tensor describe(const cpu::QuantizedWeight& w, nf4_dtype d, App::Buffer& in, App::Buffer& out, Placement& p,
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

std::vector<std::uint8_t> oracle(const cpu::QuantizedWeight& w, nf4_dtype d) {
  std::vector<std::uint8_t> e(static_cast<std::size_t>(w.numel) * nf4_dtype_size(d));
  cpu::oracle_dequantize(w.describe(d, e.data(), static_cast<std::int64_t>(e.size())));
  return e;
}

cpu::QuantizedWeight weight(std::int64_t n, nf4_quant_type qt, int bs, bool nested, int nbs, std::uint64_t seed) {
  const auto x = cpu::random_normal(n, seed, 0.02f);
  return cpu::quantize(x.data(), n, cpu::QuantizeOptions{qt, bs, nested, nbs});
}

// Records fill (app work) -> nf4 -> copy (app work) into one frame and checks every output and
// every byte around them (the poison must survive: nothing written outside an output).
void run_embedded(App& app, nf4_vulkan_context* ctx, const std::vector<cpu::QuantizedWeight>& ws, const std::vector<nf4_dtype>& dtypes,
                  std::size_t* dispatches = nullptr) {
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
  app.frame([&](VkCommandBuffer cmd) {
    app.d.vkCmdFillBuffer(cmd, out.buffer, 0, VK_WHOLE_SIZE, 0xA5A5A5A5u);  // the app's own work before
    app.barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    REQUIRE(nf4_vulkan_job_record(job, cmd) == NF4_OK);
    app.barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_TRANSFER_READ_BIT);
    const VkBufferCopy all{0, 0, out.size};
    app.d.vkCmdCopyBuffer(cmd, out.buffer, readback.buffer, 1, &all);  // ... and after
    app.barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  });
  nf4_vulkan_job_destroy(job);

  std::vector<bool> owned(readback.size, false);
  for (std::size_t k = 0; k < ws.size(); ++k) {
    const auto expected = oracle(ws[k], dtypes[k]);
    const std::uint8_t* got = readback.data + ts[k].out.offset;
    CHECK_MESSAGE(test::differing_elements(expected.data(), got, ws[k].numel, dtypes[k]) == 0,
                  "n=" << ws[k].numel << " qt=" << ws[k].quant_type << " bs=" << ws[k].blocksize << " nested=" << ws[k].nested
                       << " nbs=" << ws[k].nested_blocksize << " " << std::string(test::dtype_label(dtypes[k])));
    for (std::size_t b = 0; b < expected.size(); ++b) owned[ts[k].out.offset + b] = true;
  }
  std::size_t clobbered = 0;
  for (VkDeviceSize b = 0; b < readback.size; ++b) clobbered += !owned[b] && readback.data[b] != 0xA5;
  CHECK_MESSAGE(clobbered == 0, clobbered << " bytes outside the outputs were written");
}

void check_no_validation_messages() {
  CHECK(g_app_messages.load() == 0);
  CHECK(vk::validation_message_count() == 0);
}

}  // namespace

TEST_CASE("vulkan: embedded recording into the app's command buffer at buffer offsets, every variant") {
  if (!vulkan_available()) return;
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    MESSAGE("vulkan device: " << std::string(nf4_vulkan_device_name(ctx)));
    std::mt19937_64 rng(42);
    std::uint64_t seed = 1000;
    const int blocksizes[] = {32, 64, 128, 256, 1024, 4096};
    const int nested_blocksizes[] = {256, 1, 4, 1024};
    for (nf4_quant_type qt : test::kQuantTypes)
      for (bool nested : {false, true}) {
        std::vector<cpu::QuantizedWeight> ws;
        std::vector<nf4_dtype> ds;
        for (std::int64_t n : {1, 2, 3, 7, 8, 9, 31, 33, 63, 64, 65, 255, 1000, 4097, 8191, 8193, 16385})
          for (nf4_dtype d : test::kDTypes) {
            ws.push_back(weight(n, qt, blocksizes[rng() % 6], nested, nested_blocksizes[rng() % 4], seed++));
            ds.push_back(d);
          }
        for (int r = 0; r < 6; ++r) {  // random sizes
          ws.push_back(weight(1 + static_cast<std::int64_t>(rng() % 60000), qt, blocksizes[rng() % 6], nested, nested_blocksizes[rng() % 4],
                              seed++));
          ds.push_back(test::kDTypes[rng() % 3]);
        }
        run_embedded(app, ctx, ws, ds);
      }
    nf4_vulkan_context_destroy(ctx);
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: chunking around maxStorageBufferRange and maxComputeWorkGroupCount") {
  if (!vulkan_available()) return;
  // Lower the limits: 64 KiB bindings and 2 workgroups per dispatch give 8192-element chunks.
  setenv("NF4_VULKAN_MAX_STORAGE_RANGE", "65536", 1);
  setenv("NF4_VULKAN_MAX_GROUPS", "2", 1);
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    // Nested blocks that straddle chunk boundaries (1024 blocks of 64 span 8 chunks).
    const std::vector<cpu::QuantizedWeight> ws = {weight(70001, NF4_QUANT_NF4, 64, true, 1024, 7), weight(50000, NF4_QUANT_FP4, 32, true, 512, 8),
                                                  weight(40961, NF4_QUANT_NF4, 4096, false, 256, 9)};
    std::size_t dispatches = 0;
    run_embedded(app, ctx, ws, {NF4_DTYPE_F16, NF4_DTYPE_F32, NF4_DTYPE_BF16}, &dispatches);
    CHECK(dispatches >= 9 + 7 + 6);
    nf4_vulkan_context_destroy(ctx);

    // The standalone backend under the same limits.
    Context c(NF4_BACKEND_VULKAN);
    const auto w = weight(100003, NF4_QUANT_NF4, 64, true, 1024, 10);
    std::vector<std::uint16_t> got(100003), expected(100003);
    cpu::oracle_dequantize(w.describe(NF4_DTYPE_BF16, expected.data(), 100003 * 2));
    c.dequantize_host(w.describe(NF4_DTYPE_BF16, got.data(), 100003 * 2));
    CHECK(got == expected);
  }
  unsetenv("NF4_VULKAN_MAX_STORAGE_RANGE");
  unsetenv("NF4_VULKAN_MAX_GROUPS");
  check_no_validation_messages();
}

TEST_CASE("vulkan: a tensor past lavapipe's 65,535 loop iterations per invocation") {
  if (!vulkan_available()) return;
  // lavapipe silently ends an invocation after 65,535 loop iterations in total. nf4's loops are
  // bounded per invocation (units, table entries), whatever the tensor size; this tensor has more
  // than 65,535 units per workgroup-column, so a grid-stride loop would have crossed it.
  {
    ScopedEnv tune("NF4_VULKAN_TUNE", "wg=16,units=1");
    Context c(NF4_BACKEND_VULKAN);
    const std::int64_t n = 65536 * 16 + 4099;  // > 65,535 invocations' worth of 16 elements
    for (nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_F32}) {
      const auto w = weight(n, NF4_QUANT_FP4, 64, true, 256, 11);
      std::vector<std::uint8_t> got(static_cast<std::size_t>(n) * nf4_dtype_size(d), 0x5A);
      const auto expected = oracle(w, d);
      c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
      CHECK(test::differing_elements(expected.data(), got.data(), n, d) == 0);
    }
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: both shader strategies on every variant (per-block table and per-element rounding)") {
  if (!vulkan_available()) return;
  for (const char* tune : {"table=000,wg=64,units=2", "table=111,wg=128,units=3", "table=101,wg=256,units=8",
                           "table=000,wg=128,units=4,nt=3,f16hw=0", "table=010,wg=32,units=5,nt=1,pair=0"}) {
    ScopedEnv env("NF4_VULKAN_TUNE", tune);
    Context c(NF4_BACKEND_VULKAN);
    std::uint64_t seed = 500;
    for (std::int64_t n : {1, 5, 64, 1000, 33333})
      for (nf4_quant_type qt : test::kQuantTypes)
        for (bool nested : {false, true})
          for (int bs : {32, 64, 4096})
            for (nf4_dtype d : test::kDTypes) {
              const auto w = weight(n, qt, bs, nested, 256, seed++);
              std::vector<std::uint8_t> got(static_cast<std::size_t>(n) * nf4_dtype_size(d));
              c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
              CHECK_MESSAGE(test::differing_elements(oracle(w, d).data(), got.data(), n, d) == 0,
                            std::string(tune) << " n=" << n << " qt=" << qt << " nested=" << nested << " bs=" << bs << " " << std::string(test::dtype_label(d)));
            }
  }
  check_no_validation_messages();
}

namespace {

// A flat NF4 weight whose quant_map is {1 + q * 2^-20} and whose absmax sweeps fp32 bit
// patterns: every output is RNE(fl32(absmax * (1 + q 2^-20))), exercising the shaders' integer
// rounding on every exponent, both signs, the fp16 overflow, subnormal and tie boundaries.
void rounding_sweep(Context& c, const std::vector<std::uint32_t>& patterns, const std::vector<std::uint32_t>& quant_map_bits = {}) {
  cpu::QuantizedWeight w;
  w.quant_type = NF4_QUANT_NF4;
  w.blocksize = 32;
  w.nested = false;
  w.numel = static_cast<std::int64_t>(patterns.size()) * 32;
  w.quant_map.resize(16);
  for (int q = 0; q < 16; ++q) w.quant_map[q] = 1.0f + static_cast<float>(q) * (1.0f / 1048576.0f);
  for (std::size_t q = 0; q < quant_map_bits.size() && q < 16; ++q) w.quant_map[q] = bits_float(quant_map_bits[q]);
  w.absmax_f32.resize(patterns.size());
  for (std::size_t b = 0; b < patterns.size(); ++b) w.absmax_f32[b] = bits_float(patterns[b]);
  w.packed.resize(static_cast<std::size_t>(w.numel / 2));
  for (std::size_t j = 0; j < w.packed.size(); ++j) w.packed[j] = static_cast<std::uint8_t>(j * 0x1d + (j >> 4));
  for (nf4_dtype d : test::kDTypes) {
    std::vector<std::uint8_t> got(static_cast<std::size_t>(w.numel) * nf4_dtype_size(d));
    c.dequantize_host(w.describe(d, got.data(), static_cast<std::int64_t>(got.size())));
    CHECK_MESSAGE(test::differing_elements(oracle(w, d).data(), got.data(), w.numel, d) == 0, std::string(test::dtype_label(d)));
  }
}

}  // namespace

TEST_CASE("vulkan: the shaders' integer fp16/bf16 rounding matches core/half.h") {
  if (!vulkan_available()) return;
  Context c(NF4_BACKEND_VULKAN);
  std::vector<std::uint32_t> patterns;
  const std::uint32_t lows[] = {0x0000, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xefff, 0xffff};
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    const std::uint32_t exp = (hi >> 7) & 0xff;
    if (exp == 0 || exp == 0xff) continue;  // subnormals: next test; inf/NaN: below
    for (std::uint32_t lo : lows) patterns.push_back(hi << 16 | lo);
  }
  for (std::uint32_t s : {0u, 0x80000000u}) patterns.insert(patterns.end(), {s | 0x7f800000u, s});  // +-inf, +-0
  rounding_sweep(c, patterns);
  check_no_validation_messages();
}

TEST_CASE("vulkan: inf and NaN in quant_map or absmax take the full conversion (both kernels)") {
  if (!vulkan_available()) return;
  // The direct kernel converts a unit without the NaN case only when its absmax and every
  // quant_map value are finite. NaN inputs here are the canonical 0x7fffffff, which a product keeps
  // on the CPU and on GPUs alike (inf * 0, whose NaN bits differ by platform, never occurs).
  std::vector<std::uint32_t> patterns = {0x7fffffffu, 0x7f800000u, 0xff800000u, 0x3f800000u, 0xbf123456u, 0x477fe000u, 0x33000001u};
  for (std::uint32_t k = 0; k < 200; ++k) {
    const std::uint32_t p = 0x30000000u + k * 0x00a5a5a5u;
    const std::uint32_t exp = (p >> 23) & 0xff;
    if (exp != 0 && exp != 0xff) patterns.push_back(p);  // finite, not zero (inf * 0 is NaN) nor subnormal
  }
  for (const char* tune : {"table=000,wg=64,units=2", "table=110,wg=128,units=2"}) {
    ScopedEnv env("NF4_VULKAN_TUNE", tune);
    Context c(NF4_BACKEND_VULKAN);
    rounding_sweep(c, patterns);                                   // non-finite absmax, finite values
    rounding_sweep(c, patterns, {0x3f800000u, 0x7f800000u});       // +inf among the values
    rounding_sweep(c, patterns, {0x3f800000u, 0x40000000u, 0x7fffffffu});  // NaN among the values
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: packHalf2x16 for fp16 only where the check proved it exact (sampled on CPU devices)") {
  if (!vulkan_available()) return;
  App app;
  // GPUs run the exhaustive check (auto); a CPU device (lavapipe) runs the strided sample, which
  // is a test hook and no proof, so that CI covers the hardware path and the check shader too.
  const bool cpu_device = app.info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  ScopedEnv mode("NF4_VULKAN_F16_CHECK", cpu_device ? "sample" : "auto");
  ScopedEnv tune("NF4_VULKAN_TUNE", "table=000,wg=64,units=2,pair=0");
  Context c(NF4_BACKEND_VULKAN);
  const int verdict = vk::f16_verdict(app.info);
  REQUIRE(verdict >= 0);  // the check ran in this process
  MESSAGE(app.info.name() << ": packHalf2x16 " << std::string(verdict ? "equals" : "differs from") << " the integer fp16 rounding on "
                          << std::string(cpu_device ? "a sample of" : "all") << " the non-NaN fp32 inputs"
                          << std::string(verdict ? ": the direct fp16 kernel uses it" : ": integer rounding kept"));
  std::vector<std::uint32_t> patterns;
  const std::uint32_t lows[] = {0x0000, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x8000, 0xffff};
  for (std::uint32_t hi = 0; hi < 0x10000; hi += cpu_device ? 7 : 1) {
    const std::uint32_t exp = (hi >> 7) & 0xff;
    if (exp == 0 || exp == 0xff) continue;
    for (std::uint32_t lo : lows) patterns.push_back(hi << 16 | lo);
  }
  rounding_sweep(c, patterns);
  // An embedded context on the same device and driver takes the verdict of this process.
  nf4_vulkan_context* ctx = app.nf4_context();
  run_embedded(app, ctx, {weight(40000, NF4_QUANT_NF4, 64, true, 256, 77), weight(999, NF4_QUANT_FP4, 32, false, 256, 78)},
               {NF4_DTYPE_F16, NF4_DTYPE_F16});
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}

TEST_CASE("vulkan: subnormal absmax (IEEE where the device preserves fp32 denormals)") {
  if (!vulkan_available()) return;
  App app;
  if (!app.info.denorm_preserve32) {
    MESSAGE("skipped: " << app.info.name() << " does not let nf4 ask for IEEE fp32 denormals (" << app.info.float_controls
                        << "); it may flush fp32 subnormals, as bitsandbytes does");
    return;
  }
  Context c(NF4_BACKEND_VULKAN);
  std::vector<std::uint32_t> patterns;
  for (std::uint32_t m = 1; m < 0x800000u; m = m * 3 + 1) patterns.insert(patterns.end(), {m, 0x80000000u | m});
  for (std::uint32_t e : {1u, 2u, 3u}) patterns.push_back(e << 23 | 0x123456u);  // products near the subnormal edge
  rounding_sweep(c, patterns);
  check_no_validation_messages();
}

TEST_CASE("vulkan: the embedding API rejects bad buffers with the right status") {
  if (!vulkan_available()) return;
  {
    App app;
    nf4_vulkan_context* ctx = app.nf4_context();
    App::Buffer& in = app.buffer(1 << 16);
    App::Buffer& out = app.buffer(1 << 16);
    const auto w = weight(1001, NF4_QUANT_NF4, 64, true, 256, 3);
    Placement p;
    const nf4_vulkan_tensor good = describe(w, NF4_DTYPE_F16, in, out, p);
    const auto expect = [&](nf4_vulkan_tensor t, nf4_status want, const char* mentions) {
      nf4_vulkan_job* job = reinterpret_cast<nf4_vulkan_job*>(std::uintptr_t{1});
      CHECK(nf4_vulkan_job_create(ctx, &t, 1, &job) == want);
      CHECK(job == nullptr);
      CHECK_MESSAGE(std::string(nf4_vulkan_last_error(ctx)).find(mentions) != std::string::npos, std::string(nf4_vulkan_last_error(ctx)));
    };
    nf4_vulkan_tensor t = good;
    t.packed.buffer = VK_NULL_HANDLE;
    expect(t, NF4_ERR_NULL_POINTER, "packed");
    t = good;
    t.packed.size -= 4;
    expect(t, NF4_ERR_PACKED_SIZE, "packed.size");
    t = good;
    t.absmax.size = 8;
    expect(t, NF4_ERR_ABSMAX_SIZE, "absmax.size");
    t = good;
    t.nested_absmax.size = 0;
    expect(t, NF4_ERR_NESTED_ABSMAX_SIZE, "nested_absmax.size");
    t = good;
    t.nested_code.size = 1020;
    expect(t, NF4_ERR_NESTED_CODE_SIZE, "nested_code.size");
    t = good;
    t.quant_map.size = 60;
    expect(t, NF4_ERR_QUANT_MAP_SIZE, "quant_map.size");
    t = good;
    t.out.size = 2000;
    expect(t, NF4_ERR_OUTPUT_TOO_SMALL, "out.size");
    t = good;
    t.out.offset += 4;
    expect(t, NF4_ERR_INVALID_ARGUMENT, "out.offset must be a multiple of 16");
    t = good;
    t.packed.offset += 2;
    expect(t, NF4_ERR_INVALID_ARGUMENT, "packed.offset must be a multiple of 4");
    t = good;
    t.blocksize = 48;
    expect(t, NF4_ERR_BLOCKSIZE, "blocksize");
    t = good;
    t.numel = 0;
    expect(t, NF4_ERR_ELEMENT_COUNT, "numel");
    t = good;
    t.out = {in.buffer, good.packed.offset / 16 * 16, 4096};
    expect(t, NF4_ERR_ALIASING, "overlaps packed");
    nf4_vulkan_job* job = nullptr;
    CHECK(nf4_vulkan_job_create(ctx, nullptr, 1, &job) == NF4_ERR_NULL_POINTER);
    CHECK(nf4_vulkan_job_record(nullptr, VK_NULL_HANDLE) == NF4_ERR_NULL_POINTER);
    nf4_vulkan_context_info bad{};
    nf4_vulkan_context* c2 = nullptr;
    CHECK(nf4_vulkan_context_create(&bad, &c2) == NF4_ERR_NULL_POINTER);
    CHECK(c2 == nullptr);
    nf4_vulkan_context_destroy(ctx);
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan: NF4_VULKAN_DEVICE picks a device by index or name, and names the choices when wrong") {
  if (!vulkan_available()) return;
  const char* previous = std::getenv("NF4_VULKAN_DEVICE");
  const std::string saved = previous ? previous : "";
  setenv("NF4_VULKAN_DEVICE", "no such device anywhere", 1);
  nf4_context* c = nullptr;
  CHECK(nf4_context_create(NF4_BACKEND_VULKAN, &c) == NF4_ERR_BACKEND_UNAVAILABLE);
  CHECK(std::string(nf4_last_error(nullptr)).find("matches no usable device") != std::string::npos);
  setenv("NF4_VULKAN_DEVICE", "0", 1);
  REQUIRE(nf4_context_create(NF4_BACKEND_VULKAN, &c) == NF4_OK);
  nf4_context_destroy(c);
  if (previous) setenv("NF4_VULKAN_DEVICE", saved.c_str(), 1);
  else unsetenv("NF4_VULKAN_DEVICE");
  check_no_validation_messages();
}

TEST_CASE("vulkan: more than 2^31 elements (NF4_VULKAN_LARGE=1, about 10 GB of host memory)") {
  if (!std::getenv("NF4_VULKAN_LARGE")) {
    MESSAGE("skipped: set NF4_VULKAN_LARGE=1 (GPU machine)");
    return;
  }
  if (!vulkan_available()) return;
  // A synthetic nested NF4 weight (random codes and statistics: quantizing 2^31 values would take
  // longer than the test), fp16 out, an odd count past 2^31; checked against the oracle on
  // windows at the start, around 2^31 and at the end, and at random places.
  const std::int64_t n = (std::int64_t{1} << 31) + 4099;
  cpu::QuantizedWeight w;
  w.quant_type = NF4_QUANT_NF4;
  w.numel = n;
  w.blocksize = 64;
  w.nested = true;
  w.nested_blocksize = 256;
  w.quant_map = cpu::saved_quant_map(NF4_QUANT_NF4);
  w.nested_code = cpu::dynamic_code_map();
  w.nested_offset = 0.0519833f;
  std::uint64_t s = 0x9E3779B97F4A7C15ull;
  const auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  w.packed.resize(static_cast<std::size_t>(ceil_div(n, 2)));
  for (std::size_t i = 0; i + 8 <= w.packed.size(); i += 8) {
    const std::uint64_t v = next();
    std::memcpy(&w.packed[i], &v, 8);
  }
  w.packed.back() &= 0xf0;
  w.absmax_u8.resize(static_cast<std::size_t>(ceil_div(n, 64)));
  for (auto& a : w.absmax_u8) a = static_cast<std::uint8_t>(next());
  w.nested_absmax.resize(static_cast<std::size_t>(ceil_div(ceil_div(n, 64), 256)));
  for (auto& a : w.nested_absmax) a = 0.01f + static_cast<float>(next() % 1000) * 1e-4f;

  std::vector<std::uint16_t> got(static_cast<std::size_t>(n), 0x7777), expected(static_cast<std::size_t>(n), 0x7777);
  Context c(NF4_BACKEND_VULKAN);
  c.dequantize_host(w.describe(NF4_DTYPE_F16, got.data(), n * 2));
  const nf4_tensor t = w.describe(NF4_DTYPE_F16, expected.data(), n * 2);
  std::vector<std::int64_t> starts = {0, (std::int64_t{1} << 31) - (1 << 20), n - (1 << 20)};
  for (int k = 0; k < 16; ++k) starts.push_back(static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n - (1 << 16))));
  for (std::int64_t first : starts) {
    const std::int64_t count = std::min<std::int64_t>(1 << 20, n - first);
    cpu::oracle_dequantize_range(t, first, count);
    CHECK_MESSAGE(std::memcmp(&expected[static_cast<std::size_t>(first)], &got[static_cast<std::size_t>(first)], static_cast<std::size_t>(count) * 2) == 0,
                  "window at " << first);
  }
  check_no_validation_messages();
}

// ---- matrix-vector product recorded into the application's command buffer ---------------------
namespace {

// Places a product's weight, x and a poisoned y in the app's buffers, records it between the app's
// own work, and checks y against the oracle and every byte around it. Returns the dispatch count.
std::size_t run_embedded_gemv(App& app, nf4_vulkan_context* ctx, const test::GemvCase& c) {
  const cpu::QuantizedWeight& w = c.w;
  const VkDeviceSize in_bytes = w.packed.size() + w.absmax_f32.size() * 4 + w.absmax_u8.size() + w.nested_absmax.size() * 4 + c.x.size() + 4096;
  const VkDeviceSize out_bytes = static_cast<VkDeviceSize>(c.y_bytes()) + 256;
  App::Buffer& in = app.buffer(in_bytes);
  App::Buffer& out = app.buffer(out_bytes);
  App::Buffer& readback = app.buffer(out_bytes);
  App::Buffer& unused = app.buffer(static_cast<VkDeviceSize>(w.numel) * 4 + 4096);  // describe() places an output
  Placement p;
  nf4_vulkan_tensor t = describe(w, NF4_DTYPE_F32, in, unused, p);
  t.out = {};  // not used by the product
  p.out_at = 48;
  nf4_vulkan_gemv g{};
  g.weight = &t;
  g.n = c.n;
  g.k = c.k;
  g.m = c.m;
  g.x_dtype = c.x_dtype;
  g.x = p.put(in, c.x.data(), static_cast<std::int64_t>(c.x.size()));
  g.y_dtype = c.y_dtype;
  g.y = p.out(out, c.y_bytes());
  nf4_vulkan_job* job = nullptr;
  const nf4_status s = nf4_vulkan_gemv_job_create(ctx, &g, &job);
  INFO(nf4_vulkan_last_error(ctx));
  REQUIRE(s == NF4_OK);
  const std::size_t dispatches = nf4_vulkan_job_dispatch_count(job);
  app.frame([&](VkCommandBuffer cmd) {
    app.d.vkCmdFillBuffer(cmd, out.buffer, 0, VK_WHOLE_SIZE, 0xA5A5A5A5u);
    app.barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    REQUIRE(nf4_vulkan_job_record(job, cmd) == NF4_OK);
    app.barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    const VkBufferCopy all{0, 0, out.size};
    app.d.vkCmdCopyBuffer(cmd, out.buffer, readback.buffer, 1, &all);
    app.barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  });
  nf4_vulkan_job_destroy(job);
  const auto expected = c.oracle();
  CHECK_MESSAGE(test::differing_elements(expected.data(), readback.data + g.y.offset, c.m * c.n, c.y_dtype) == 0, c.label());
  std::size_t clobbered = 0;
  for (VkDeviceSize b = 0; b < readback.size; ++b)
    clobbered += (b < g.y.offset || b >= g.y.offset + static_cast<VkDeviceSize>(c.y_bytes())) && readback.data[b] != 0xA5;
  CHECK_MESSAGE(clobbered == 0, c.label() << ": " << clobbered << " bytes outside y were written");
  return dispatches;
}

}  // namespace

TEST_CASE("vulkan gemv: recorded into the app's command buffer at buffer offsets, odd sizes and every dtype") {
  if (!vulkan_available()) return;
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  std::uint64_t seed = 300;
  for (std::int64_t k : {1, 31, 64, 100, 1024, 1500})
    for (std::int64_t n : {1, 3, 8})
      for (nf4_dtype yd : test::kDTypes) {
        const std::uint64_t s = seed++;
        test::GemvCase c;
        test::make_gemv_case(c, n, k, static_cast<std::int32_t>(1 + s % 8), s % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 32 << (s % 4), s % 3 != 0,
                             test::kDTypes[(s / 3) % 3], yd, s);
        run_embedded_gemv(app, ctx, c);
      }
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}

TEST_CASE("vulkan gemv: rows split over dispatches at the workgroup-count and storage-range limits") {
  if (!vulkan_available()) return;
  ScopedEnv tune("NF4_VULKAN_GEMV_TUNE", "wg=64");           // two teams: at least 2 rows per workgroup
  ScopedEnv groups("NF4_VULKAN_MAX_GROUPS", "3");            // 6 rows per dispatch
  ScopedEnv range("NF4_VULKAN_MAX_STORAGE_RANGE", "65536");  // and bindings of at most 64 KiB
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  test::GemvCase c;
  test::make_gemv_case(c, 29, 1000, 3, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F16, 77);  // blocks straddle rows
  CHECK(run_embedded_gemv(app, ctx, c) == 5);
  test::GemvCase big;
  test::make_gemv_case(big, 40, 4096, 2, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 78);
  CHECK(run_embedded_gemv(app, ctx, big) >= 7);
  nf4_vulkan_context_destroy(ctx);
  {
    // A row of W wider than one storage range: refused with a reason, nothing written.
    Context standalone(NF4_BACKEND_VULKAN);
    test::GemvCase wide;
    test::make_gemv_case(wide, 2, 1 << 17, 1, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 79);
    std::vector<std::uint8_t> y(static_cast<std::size_t>(wide.y_bytes()), 0xEE);
    const nf4_gemv_desc g = wide.describe(y.data(), wide.y_bytes());
    CHECK(nf4_gemv_host(standalone.get(), &g) == NF4_ERR_UNSUPPORTED);
    CHECK(std::string(nf4_last_error(standalone.get())).find("storage-buffer range") != std::string::npos);
    CHECK(std::all_of(y.begin(), y.end(), [](std::uint8_t b) { return b == 0xEE; }));
  }
  check_no_validation_messages();
}

TEST_CASE("vulkan gemv: the embedding API rejects bad products with the right status") {
  if (!vulkan_available()) return;
  App app;
  nf4_vulkan_context* ctx = app.nf4_context();
  test::GemvCase c;
  test::make_gemv_case(c, 4, 96, 2, NF4_QUANT_NF4, 32, true, NF4_DTYPE_BF16, NF4_DTYPE_BF16, 5);
  App::Buffer& in = app.buffer(1 << 16);
  App::Buffer& out = app.buffer(1 << 12);
  App::Buffer& unused = app.buffer(1 << 12);
  Placement p;
  nf4_vulkan_tensor t = describe(c.w, NF4_DTYPE_F32, in, unused, p);
  p.out_at = 48;
  nf4_vulkan_gemv good{};
  good.weight = &t;
  good.n = c.n;
  good.k = c.k;
  good.m = c.m;
  good.x_dtype = c.x_dtype;
  good.x = p.put(in, c.x.data(), static_cast<std::int64_t>(c.x.size()));
  good.y_dtype = c.y_dtype;
  good.y = p.out(out, c.y_bytes());
  struct Bad {
    const char* name;
    nf4_status status;
    std::function<void(nf4_vulkan_gemv&)> mutate;
  };
  const std::vector<Bad> cases = {
      {"null weight", NF4_ERR_NULL_POINTER, [](nf4_vulkan_gemv& g) { g.weight = nullptr; }},
      {"n * k != numel", NF4_ERR_SHAPE, [](nf4_vulkan_gemv& g) { g.k += 1; }},
      {"m = 9", NF4_ERR_SHAPE, [](nf4_vulkan_gemv& g) { g.m = 9; }},
      {"x dtype", NF4_ERR_DTYPE, [](nf4_vulkan_gemv& g) { g.x_dtype = static_cast<nf4_dtype>(5); }},
      {"no x buffer", NF4_ERR_NULL_POINTER, [](nf4_vulkan_gemv& g) { g.x.buffer = VK_NULL_HANDLE; }},
      {"x too small", NF4_ERR_INVALID_ARGUMENT, [](nf4_vulkan_gemv& g) { g.x.size -= 4; }},
      {"y too small", NF4_ERR_OUTPUT_TOO_SMALL, [](nf4_vulkan_gemv& g) { g.y.size -= 4; }},
      {"y misaligned", NF4_ERR_INVALID_ARGUMENT, [](nf4_vulkan_gemv& g) { g.y.offset += 2; }},
      {"y overlaps x", NF4_ERR_ALIASING, [](nf4_vulkan_gemv& g) { g.y = g.x; }},
      {"y overlaps packed", NF4_ERR_ALIASING, [](nf4_vulkan_gemv& g) { g.y = {g.weight->packed.buffer, g.weight->packed.offset, 4096}; }},
  };
  for (const Bad& b : cases) {
    CAPTURE(b.name);
    nf4_vulkan_gemv g = good;
    b.mutate(g);
    nf4_vulkan_job* job = reinterpret_cast<nf4_vulkan_job*>(1);
    CHECK(nf4_vulkan_gemv_job_create(ctx, &g, &job) == b.status);
    CHECK(job == nullptr);
    CHECK(std::string(nf4_vulkan_last_error(ctx)).size() > 0);
  }
  nf4_vulkan_job* job = nullptr;
  CHECK(nf4_vulkan_gemv_job_create(ctx, &good, &job) == NF4_OK);
  nf4_vulkan_job_destroy(job);
  nf4_vulkan_context_destroy(ctx);
  check_no_validation_messages();
}
