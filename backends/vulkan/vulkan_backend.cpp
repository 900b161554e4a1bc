// SPDX-License-Identifier: MIT
// The standalone Vulkan backend: its own instance, device and queue (the chosen device, else the
// one NF4_VULKAN_DEVICE names, else the best), its own buffers; dequantize_host streams the plan's chunks through a
// device arena in batches, so memory stays bounded for any tensor size.
//
// Environment:
//   NF4_VULKAN_DEVICE=index|name substring   pick the device of a context made without one
//                                           (nf4_context_create; default: discrete > integrated >
//                                           virtual > other > CPU such as lavapipe); a context on
//                                           a chosen device (nf4_context_create_on_device) ignores it
//   NF4_VULKAN_VALIDATION=1                  enable VK_LAYER_KHRONOS_validation; any warning or
//                                           error it reports makes the next call fail (tests)
//   NF4_VULKAN_STAGED=1                      never map device buffers, even where device-local
//                                           memory is host-visible (lavapipe, UMA): the staging
//                                           copies of a discrete GPU, testable on any device
//                                           (read when a context is made)
//   NF4_VULKAN_TUNE, NF4_VULKAN_MAX_STORAGE_RANGE, NF4_VULKAN_MAX_GROUPS: see vk_kernels.h
#include <algorithm>
#include <bit>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_kernels.h"
#include "core/backend.h"
#include "core/env.h"
#include "core/log.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/plan.h"
#include "core/tensor.h"
#include "core/types.h"

namespace nf4::vk {
namespace {

std::atomic<std::uint64_t> g_validation_messages{0};

bool validation_requested() { return env_enabled(EnvVar::kVulkanValidation); }

VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                VkDebugUtilsMessageTypeFlagsEXT types,
                                                const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  const bool counted = (types & (VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)) != 0;
  if (counted) g_validation_messages.fetch_add(1);
  log(severity >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT ? NF4_LOG_ERROR : NF4_LOG_WARNING, "vulkan {}: {}",
      counted ? "validation" : "loader", data && data->pMessage ? data->pMessage : "");
  return VK_FALSE;
}

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

// ---- instance and device choice ---------------------------------------------------------------
struct Instance {
  GlobalFns g;
  InstanceFns f;
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  std::uint32_t api = 0;

  Instance() {
    g = system_loader();
    std::uint32_t loader_api = VK_API_VERSION_1_0;
    if (g.vkEnumerateInstanceVersion) g.vkEnumerateInstanceVersion(&loader_api);
    if (loader_api < VK_API_VERSION_1_1)
      fail(NF4_ERR_BACKEND_UNAVAILABLE, "the Vulkan loader offers version {}.{}; nf4 needs 1.1", VK_API_VERSION_MAJOR(loader_api),
           VK_API_VERSION_MINOR(loader_api));
    api = std::min<std::uint32_t>(VK_MAKE_API_VERSION(0, VK_API_VERSION_MAJOR(loader_api), VK_API_VERSION_MINOR(loader_api), 0),
                                  VK_API_VERSION_1_3);
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "nf4";
    app.pEngineName = "nf4";
    app.apiVersion = api;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkDebugUtilsMessengerCreateInfoEXT mi{};
    mi.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = on_debug_message;
    const bool validation = validation_requested();
    if (validation) {
      std::uint32_t n = 0;
      g.vkEnumerateInstanceLayerProperties(&n, nullptr);
      std::vector<VkLayerProperties> layers(n);
      g.vkEnumerateInstanceLayerProperties(&n, layers.data());
      if (std::none_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) { return std::strcmp(l.layerName, layer) == 0; }))
        fail(NF4_ERR_BACKEND_UNAVAILABLE,
             "NF4_VULKAN_VALIDATION is set but {} is not installed (Debian: vulkan-validationlayers; or set VK_LAYER_PATH)", layer);
      ci.enabledLayerCount = 1;
      ci.ppEnabledLayerNames = &layer;
      ci.enabledExtensionCount = 1;
      ci.ppEnabledExtensionNames = &ext;
      ci.pNext = &mi;  // also reports on vkCreateInstance / vkDestroyInstance
    }
    const VkResult r = g.vkCreateInstance(&ci, nullptr, &instance);
    if (r != VK_SUCCESS)
      fail(NF4_ERR_BACKEND_UNAVAILABLE, "vkCreateInstance failed: {}{}", result_name(r),
           r == VK_ERROR_INCOMPATIBLE_DRIVER ? " (no Vulkan driver / ICD found)" : "");
    try {
      f = load_instance(g.vkGetInstanceProcAddr, instance);
      if (validation) {
        if (!f.vkCreateDebugUtilsMessengerEXT) fail(NF4_ERR_BACKEND_UNAVAILABLE, "VK_EXT_debug_utils is missing");
        check(f.vkCreateDebugUtilsMessengerEXT(instance, &mi, nullptr, &messenger), "vkCreateDebugUtilsMessengerEXT");
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Instance() { destroy(); }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  void destroy() {
    if (messenger) f.vkDestroyDebugUtilsMessengerEXT(instance, messenger, nullptr);
    messenger = VK_NULL_HANDLE;
    if (instance) {
      auto destroy_instance = reinterpret_cast<PFN_vkDestroyInstance>(g.vkGetInstanceProcAddr(instance, "vkDestroyInstance"));
      destroy_instance(instance, nullptr);
    }
    instance = VK_NULL_HANDLE;
  }
};

// One VkInstance per process, made on first use and never destroyed: creating one is slow (more
// so with the validation layer), and some drivers (lavapipe) leave allocations behind when the
// loader unloads them at vkDestroyInstance, which leak checkers then report. Instance-level calls
// nf4 makes on it are thread-safe by Vulkan's rules. Each context makes its own VkDevice.
const Instance& shared_instance() {
  static std::once_flag once;
  static Instance* instance = nullptr;
  static std::string error;
  static nf4_status status = NF4_OK;
  std::call_once(once, [] {
    try {
      instance = new Instance();
    } catch (const Error& e) {
      error = e.what();
      status = e.status();
    } catch (const std::exception& e) {
      error = e.what();
      status = NF4_ERR_BACKEND_UNAVAILABLE;
    }
  });
  if (!instance) fail(status, "{}", error);
  return *instance;
}

struct Candidate {
  VkPhysicalDevice pd = VK_NULL_HANDLE;
  DeviceInfo info;
  std::uint32_t family = 0;
  std::uint32_t timestamp_bits = 0;
  std::size_t index = 0;  // among the usable devices (nf4.h's device index)
};

int type_score(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 5;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;  // lavapipe: only when nothing else, or asked for
    default: return 2;
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The usable devices (Vulkan 1.1, a compute queue) in the order the instance lists them, and in
// `listing` every device with its index or why it is not usable (messages).
std::vector<Candidate> usable_devices(const Instance& inst, std::string& listing) {
  std::uint32_t n = 0;
  check(inst.f.vkEnumeratePhysicalDevices(inst.instance, &n, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> pds(n);
  check(inst.f.vkEnumeratePhysicalDevices(inst.instance, &n, pds.data()), "vkEnumeratePhysicalDevices");
  pds.resize(n);
  std::vector<Candidate> all;
  for (VkPhysicalDevice pd : pds) {
    Candidate c;
    c.pd = pd;
    c.info = query_device(inst.f, pd, inst.api);
    const std::string sep = listing.empty() ? "" : "; ";
    if (c.info.api_version < VK_API_VERSION_1_1) {
      listing += sep + c.info.describe() + " [not usable: Vulkan 1.0]";
      continue;
    }
    std::uint32_t nf = 0;
    inst.f.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, nullptr);
    std::vector<VkQueueFamilyProperties> fams(nf);
    inst.f.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, fams.data());
    int best = -1;
    for (std::uint32_t i = 0; i < nf; ++i) {
      if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
      // Prefer a family with timestamps (the bench needs them).
      if (best < 0 || (fams[i].timestampValidBits > 0 && fams[static_cast<std::size_t>(best)].timestampValidBits == 0))
        best = static_cast<int>(i);
    }
    if (best < 0) {
      listing += sep + c.info.describe() + " [not usable: no compute queue]";
      continue;
    }
    listing += fmt::format("{}{}: {}", sep, all.size(), c.info.describe());
    c.family = static_cast<std::uint32_t>(best);
    c.timestamp_bits = fams[c.family].timestampValidBits;
    c.index = all.size();
    all.push_back(c);
  }
  if (all.empty())
    fail(NF4_ERR_BACKEND_UNAVAILABLE, "no Vulkan 1.1 device with a compute queue ({} found{}{})", n, n ? ": " : "", listing);
  return all;
}

// The device a backend is made on: the chosen one (the registry checked the index), else the one
// NF4_VULKAN_DEVICE names, else the first of the best type.
Candidate choose_device(const Instance& inst, DeviceChoice chosen = std::nullopt) {
  std::string listing;
  const std::vector<Candidate> all = usable_devices(inst, listing);
  if (chosen) {
    NF4_CHECK(*chosen < all.size());
    return all[*chosen];
  }
  if (const char* want = env_value(EnvVar::kVulkanDevice); want && *want) {
    const std::string w(want);
    if (w.find_first_not_of("0123456789") == std::string::npos) {
      // An index; one of more than 9 digits matches no device (and must not overflow the parse).
      if (const std::size_t i = w.size() <= 9 ? std::stoul(w) : all.size(); i < all.size()) return all[i];
    } else {
      for (const Candidate& c : all)
        if (lower(c.info.name()).find(lower(w)) != std::string::npos) return c;
    }
    fail(NF4_ERR_BACKEND_UNAVAILABLE, "NF4_VULKAN_DEVICE='{}' matches no usable device (devices: {})", w, listing);
  }
  return *std::max_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return type_score(a.info.props.deviceType) < type_score(b.info.props.deviceType);  // first of the best kind
  });
}

}  // namespace

std::uint64_t validation_message_count() { return g_validation_messages.load(); }

namespace {

// Buffers are VkBuffers (nf4_vulkan.h), not addresses: only the _host calls take pointers. The
// fast contract where the device has cooperative matrices for x's dtype (gemv_coop.comp).
constexpr BackendCaps kVulkanCaps{.gemv_fast = GemvFastSupport::some};

class VulkanBackend final : public Backend, public DeviceExtension {
 public:
  explicit VulkanBackend(DeviceChoice device) : inst_(shared_instance()), dev_(choose_device(inst_, device)) {
    try {
      const float priority = 1.0f;
      VkDeviceQueueCreateInfo qi{};
      qi.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
      qi.queueFamilyIndex = dev_.family;
      qi.queueCount = 1;
      qi.pQueuePriorities = &priority;
      VkDeviceCreateInfo ci{};
      ci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
      ci.queueCreateInfoCount = 1;
      ci.pQueueCreateInfos = &qi;
      // The fast product's extensions and features, where the device has them all.
      CoopEnable coop;
      coop_enable(dev_.info, coop);
      ci.enabledExtensionCount = static_cast<std::uint32_t>(coop.extensions.size());
      ci.ppEnabledExtensionNames = coop.extensions.data();
      ci.pNext = coop.chain;
      check(inst_.f.vkCreateDevice(dev_.pd, &ci, nullptr, &device_), "vkCreateDevice");
      d_ = load_device(inst_.f.vkGetDeviceProcAddr, device_);
      d_.vkGetDeviceQueue(device_, dev_.family, 0, &queue_);
      VkCommandPoolCreateInfo pi{};
      pi.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
      pi.queueFamilyIndex = dev_.family;
      check(d_.vkCreateCommandPool(device_, &pi, nullptr, &pool_), "vkCreateCommandPool");
      VkFenceCreateInfo fi{};
      fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
      check(d_.vkCreateFence(device_, &fi, nullptr, &fence_), "vkCreateFence");
      inst_.f.vkGetPhysicalDeviceMemoryProperties(dev_.pd, &memory_);
      kernels_ = std::make_unique<Kernels>(d_, device_, dev_.info, VK_NULL_HANDLE, tuning_for(dev_.info));
      if (coop.chain) kernels_->enable_coop();
      log(NF4_LOG_INFO, "vulkan fast product on {}: fp16 x: {}; bf16 x: {}", dev_.info.name(), kernels_->gemv_fast_status(NF4_DTYPE_F16),
          kernels_->gemv_fast_status(NF4_DTYPE_BF16));
      prove_hardware_rounding();
      check_validation();
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~VulkanBackend() override { destroy(); }

  nf4_backend_kind kind() const override { return NF4_BACKEND_VULKAN; }
  std::string device_name() const override { return dev_.info.describe(); }
  std::optional<std::size_t> device_index() const override { return dev_.index; }
  BackendCaps capabilities() const override { return kVulkanCaps; }
  bool gemv_fast(const ValidGemv& g) override { return kernels_->gemv_fast(g.desc.x_dtype); }

  void dequantize_host(std::span<const ValidTensor> tensors) override;

  // ---- matrix-vector product (shaders/gemv.comp) ----
  // Inputs in one device buffer, y in a host-visible one; one submission.
  void gemv_host(const ValidGemv& g) override;
  GemvBuffers upload_gemv(const ValidGemv& g, bool host_y) override;

  // ---- device access, also the DeviceExtension the bench runner uses ----
  Buffer make_buffer(VkDeviceSize size, bool host) override {
    Buffer b;
    b.d = &d_;
    b.device = device_;
    b.size = size;
    VkBufferCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    ci.size = size;
    ci.usage = kUsage;
    ci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(d_.vkCreateBuffer(device_, &ci, nullptr, &b.buffer), "vkCreateBuffer");
    VkMemoryRequirements req;
    d_.vkGetBufferMemoryRequirements(device_, b.buffer, &req);
    // host: visible + coherent, cached preferred (read back). device: device-local, and if that
    // memory is also host-visible, coherent and cached (lavapipe, UMA), map it and skip staging.
    const VkMemoryPropertyFlags need = host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                            : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags direct = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                         VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int best = -1, best_score = -1;
    for (std::uint32_t i = 0; i < memory_.memoryTypeCount; ++i) {
      const VkMemoryPropertyFlags fl = memory_.memoryTypes[i].propertyFlags;
      if (!(req.memoryTypeBits & (1u << i)) || (fl & need) != need) continue;
      const int score = host ? ((fl & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) ? 2 : 1) : ((fl & direct) == direct ? 2 : 1);
      if (score > best_score) best = static_cast<int>(i), best_score = score;
    }
    if (best < 0) fail(NF4_ERR_DEVICE, "no suitable Vulkan memory type for a {} buffer", host ? "staging" : "device");
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = static_cast<std::uint32_t>(best);
    check(d_.vkAllocateMemory(device_, &ai, nullptr, &b.memory), "vkAllocateMemory");
    check(d_.vkBindBufferMemory(device_, b.buffer, b.memory, 0), "vkBindBufferMemory");
    const VkMemoryPropertyFlags fl = memory_.memoryTypes[best].propertyFlags;
    if (host || ((fl & direct) == direct && !staged_)) check(d_.vkMapMemory(device_, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
    return b;
  }

  // Records with `fill`, submits, waits.
  template <typename F>
  void submit_and_wait(F&& fill) {
    VkCommandBufferAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    check(d_.vkResetCommandPool(device_, pool_, 0), "vkResetCommandPool");
    check(d_.vkAllocateCommandBuffers(device_, &ai, &cmd), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(d_.vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    fill(cmd);
    check(d_.vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    check(d_.vkQueueSubmit(queue_, 1, &si, fence_), "vkQueueSubmit");
    check(d_.vkWaitForFences(device_, 1, &fence_, VK_TRUE, ~std::uint64_t{0}), "vkWaitForFences");
    check(d_.vkResetFences(device_, 1, &fence_), "vkResetFences");
    check_validation();
  }

  void run_commands(const std::function<void(VkCommandBuffer)>& fill) override { submit_and_wait(fill); }

  void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
               VkAccessFlags dst_access) override {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = src_access;
    mb.dstAccessMask = dst_access;
    d_.vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  // Copies host bytes into a device buffer (staged unless the buffer is mapped).
  void upload(Buffer& dst, const UploadPieces& pieces) override {
    if (dst.mapped) {
      for (const auto& [off, p] : pieces) std::memcpy(static_cast<char*>(dst.mapped) + off, p.first, p.second);
      return;
    }
    VkDeviceSize total = 0;
    for (const auto& [off, p] : pieces) total = std::max<VkDeviceSize>(total, off + p.second);
    Buffer staging = make_buffer(std::max<VkDeviceSize>(total, 16), true);
    for (const auto& [off, p] : pieces) std::memcpy(static_cast<char*>(staging.mapped) + off, p.first, p.second);
    submit_and_wait([&](VkCommandBuffer cmd) {
      VkBufferCopy region{0, 0, total};  // vkCmdCopyBuffer takes any size within both buffers
      d_.vkCmdCopyBuffer(cmd, staging.buffer, dst.buffer, 1, &region);
    });
  }

  void check_validation() const {
    if (validation_requested() && g_validation_messages.load() > 0)
      fail(NF4_ERR_DEVICE, "the Vulkan validation layer reported {} message(s) (printed on stderr)", g_validation_messages.load());
  }

  // The hardware conversions, only where proven: shaders/f16_check.comp compares the conversion to
  // fp16 (packHalf2x16; the direct dequantize kernel and the fast product) and, where the fast
  // product runs on bf16 x, to bf16 with the integer rounding on every fp32 input (a few ms on a
  // GPU; once per process, device, driver and dtype), and the kernels use one only if no non-NaN
  // input differed and every workgroup ran.
  void prove_hardware_rounding() {
    for (const nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_BF16}) {
      const bool f16 = d == NF4_DTYPE_F16;
      const bool wanted = f16 ? kernels_->tuning().f16_hardware : kernels_->tuning().bf16_hardware && kernels_->gemv_fast(d);
      if (!wanted) continue;
      int verdict = f16_verdict(dev_.info, d);
      if (verdict < 0) {
        const F16CheckPlan plan = f16_check_plan(dev_.info);
        if (plan.groups == 0) continue;  // not checked on this device: integer rounding
        Buffer result = make_buffer(16, true);
        const std::uint32_t init[4] = {0, 0xffffffffu, 0, 0};
        std::memcpy(result.mapped, init, sizeof init);
        const std::unique_ptr<Job> job = kernels_->prepare_f16_check({result.buffer, 0, 16}, plan.groups, plan.stride, d);
        const auto t0 = std::chrono::steady_clock::now();
        submit_and_wait([&](VkCommandBuffer cmd) {
          job->record(cmd);
          barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        });
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::uint32_t r[4];
        std::memcpy(r, result.mapped, sizeof r);
        const bool exact = r[0] == 0 && r[2] == plan.groups;
        set_f16_verdict(dev_.info, d, exact);
        verdict = exact ? 1 : 0;
        log(!exact && r[2] != plan.groups ? NF4_LOG_WARNING : NF4_LOG_INFO,
            "vulkan: {} check on {}: {} inputs (stride {}), {} non-NaN mismatches (first 0x{:08x}), {} of {} workgroups ran, {:.1f} ms: {}",
            f16 ? "fp16" : "bf16", dev_.info.name(), static_cast<unsigned long long>(plan.groups) * Kernels::kF16CheckPerGroup, plan.stride,
            r[0], r[1], r[2], plan.groups, ms,
            !exact ? "integer rounding" : f16 ? "packHalf2x16 is exact, used for fp16" : "the conversion is exact, used for the fast product's bf16 weights");
      }
      if (verdict == 1) kernels_->enable_hardware_rounding(d);
    }
  }

  const DeviceFns& fns() const override { return d_; }
  VkDevice device() const override { return device_; }
  std::uint32_t timestamp_bits() const override { return dev_.timestamp_bits; }
  double timestamp_period_ns() const override { return dev_.info.props.limits.timestampPeriod; }
  Kernels& kernels() override { return *kernels_; }

 protected:
  void* find_extension(std::string_view id) override {
    return id == DeviceExtension::kId ? static_cast<DeviceExtension*>(this) : nullptr;
  }

 private:
  void destroy() {
    if (device_) d_.vkDeviceWaitIdle(device_);
    arena_.release();
    staging_.release();
    kernels_.reset();
    if (fence_) d_.vkDestroyFence(device_, fence_, nullptr);
    if (pool_) d_.vkDestroyCommandPool(device_, pool_, nullptr);
    if (device_) d_.vkDestroyDevice(device_, nullptr);
    fence_ = VK_NULL_HANDLE;
    pool_ = VK_NULL_HANDLE;
    device_ = VK_NULL_HANDLE;
  }

  const Instance& inst_;
  Candidate dev_;
  VkDevice device_ = VK_NULL_HANDLE;
  DeviceFns d_{};
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory_{};
  const bool staged_ = env_enabled(EnvVar::kVulkanStaged);  // read once, when the context is made
  std::unique_ptr<Kernels> kernels_;
  Buffer arena_, staging_;  // grown on demand, kept between calls
};

// dequantize_host: the plan's chunks (at most kChunkElements each) go through the arena in
// batches of about kBatchBytes: upload the chunks' slices, one dispatch per chunk, download.
constexpr std::int64_t kChunkElements = std::int64_t{1} << 26;
constexpr VkDeviceSize kBatchBytes = VkDeviceSize{256} << 20;

void VulkanBackend::dequantize_host(std::span<const ValidTensor> valid) {
  PlanParams params = kernels_->plan_params();
  params.max_elements_per_chunk = std::min(params.max_elements_per_chunk, kChunkElements);
  const Plan plan = make_plan(valid, params);
  const auto tensors = [&](std::size_t i) -> const nf4_tensor& { return valid[i].t; };
  const VkDeviceSize align = kernels_->descriptor_alignment();

  struct Slot {
    const Chunk* chunk;
    ChunkView view;
    std::vector<std::pair<VkDeviceSize, std::pair<const void*, std::size_t>>> inputs;
    VkDeviceSize out_offset, out_bytes;
  };
  std::vector<const Chunk*> chunks;
  for (const Dispatch& d : plan.dispatches)
    for (const Chunk& c : d.chunks) chunks.push_back(&c);

  for (std::size_t next = 0; next < chunks.size();) {
    // Lay out one batch: inputs first, outputs after them.
    std::vector<Slot> batch;
    VkDeviceSize in_end = 0, out_total = 0;
    while (next < chunks.size()) {
      const Chunk& c = *chunks[next];
      const nf4_tensor& t = tensors(c.tensor);
      const std::int64_t bs = t.blocksize, nbs = t.nested ? t.nested_blocksize : 1;
      const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
      const std::int64_t first_block = c.first_element / bs, blocks = ceil_div(c.element_count, bs);
      const std::int64_t nfirst = first_block / nbs, nlast = (first_block + blocks - 1) / nbs;
      const VkDeviceSize in_bytes = round_up(ceil_div(c.element_count, 2), align) + round_up(blocks * 4, align) +
                                    (t.nested ? round_up((nlast - nfirst + 1) * 4, align) + 1024 : 0) + 64 + 4 * align;
      const VkDeviceSize out_bytes = round_up(c.element_count * es, align);
      if (!batch.empty() && in_end + in_bytes + out_total + out_bytes > kBatchBytes) break;

      Slot s{&c, {}, {}, 0, static_cast<VkDeviceSize>(c.element_count * es)};
      ChunkView& v = s.view;
      v.out_dtype = t.out_dtype;
      v.quant_type = t.quant_type;
      v.nested = t.nested != 0;
      v.n = static_cast<std::uint32_t>(c.element_count);
      v.log2_bs = static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(bs)));
      v.log2_nbs = static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(nbs)));
      v.groups = static_cast<std::uint32_t>(c.groups);
      VkDeviceSize at = in_end;
      const auto place = [&](Region& r, const void* src, std::int64_t bytes) {
        r = {VK_NULL_HANDLE, at, static_cast<VkDeviceSize>(bytes)};
        s.inputs.push_back({at, {src, static_cast<std::size_t>(bytes)}});
        at += round_up(static_cast<VkDeviceSize>(bytes), align);
      };
      place(v.packed, t.packed + c.first_element / 2, ceil_div(c.element_count, 2));
      const std::int64_t absmax_es = t.nested ? 1 : 4;
      place(v.absmax, static_cast<const std::uint8_t*>(t.absmax) + first_block * absmax_es, blocks * absmax_es);
      if (uses_quant_map(v.quant_type)) place(v.quant_map, t.quant_map, 64);
      if (t.nested) {
        place(v.nested_absmax, t.nested_absmax + nfirst, (nlast - nfirst + 1) * 4);
        place(v.nested_code, t.nested_code, 1024);
        v.block_rem = static_cast<std::uint32_t>(first_block % nbs);
        v.offset_value = t.nested_offset_ptr ? *t.nested_offset_ptr : t.nested_offset;  // host memory here
      }
      NF4_CHECK(at - in_end <= in_bytes);
      in_end += in_bytes;
      s.out_offset = out_total;
      out_total += out_bytes;
      batch.push_back(std::move(s));
      ++next;
    }

    const VkDeviceSize total = in_end + out_total;
    if (arena_.size < total) {
      // Grow geometrically (fewer reallocations across calls), never much past one batch.
      const VkDeviceSize want = std::max(total, std::min<VkDeviceSize>(arena_.size * 2, kBatchBytes + kBatchBytes / 2));
      arena_.release();
      arena_ = make_buffer(want, false);
    }
    const bool direct = arena_.mapped != nullptr;
    if (!direct && staging_.size < total) {
      staging_.release();
      staging_ = make_buffer(arena_.size, true);
    }
    char* host = static_cast<char*>(direct ? arena_.mapped : staging_.mapped);
    std::vector<ChunkView> views;
    for (Slot& s : batch) {
      for (const auto& [off, p] : s.inputs) std::memcpy(host + off, p.first, p.second);
      Region* regions[] = {&s.view.packed, &s.view.absmax, &s.view.quant_map, &s.view.nested_absmax, &s.view.nested_code};
      for (Region* r : regions)
        if (r->bytes) r->buffer = arena_.buffer;
      s.view.out = {arena_.buffer, in_end + s.out_offset, s.out_bytes};
      views.push_back(s.view);
    }
    const std::unique_ptr<Job> job = kernels_->prepare(views);
    submit_and_wait([&](VkCommandBuffer cmd) {
      if (!direct) {
        VkBufferCopy up{0, 0, in_end};
        d_.vkCmdCopyBuffer(cmd, staging_.buffer, arena_.buffer, 1, &up);
        barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      }
      job->record(cmd);
      if (!direct) {
        barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_TRANSFER_READ_BIT);
        VkBufferCopy down{in_end, in_end, out_total};
        d_.vkCmdCopyBuffer(cmd, arena_.buffer, staging_.buffer, 1, &down);
        barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
      } else {
        barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
      }
    });
    for (const Slot& s : batch) {
      const nf4_tensor& t = tensors(s.chunk->tensor);
      const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
      std::memcpy(static_cast<char*>(t.out) + s.chunk->first_element * es, host + in_end + s.out_offset, s.out_bytes);
    }
  }
}

// ---- matrix-vector product ------------------------------------------------------------------
GemvBuffers VulkanBackend::upload_gemv(const ValidGemv& valid, bool host_y) {
  const nf4_gemv_desc& g = valid.desc;
  const GemvSizes& s = valid.sizes;
  const nf4_tensor& t = *g.weight;
  const VkDeviceSize align = kernels_->descriptor_alignment();
  GemvBuffers b;
  GemvView& v = b.view;
  std::vector<std::pair<VkDeviceSize, std::pair<const void*, std::size_t>>> pieces;
  VkDeviceSize in = 0;
  const auto place = [&](Region& r, const void* p, std::int64_t bytes) {
    r = {VK_NULL_HANDLE, in, static_cast<VkDeviceSize>(bytes)};
    pieces.push_back({in, {p, static_cast<std::size_t>(bytes)}});
    in += round_up(static_cast<VkDeviceSize>(bytes), align);
  };
  DeviceTensor& w = v.weight;
  w.quant_type = t.quant_type;
  w.numel = t.numel;
  w.blocksize = t.blocksize;
  w.nested = t.nested != 0;
  w.nested_blocksize = t.nested_blocksize;
  w.nested_offset = t.nested_offset_ptr ? *t.nested_offset_ptr : t.nested_offset;  // host memory here
  place(w.packed, t.packed, s.weight.packed_bytes);
  place(w.absmax, t.absmax, s.weight.absmax_count * (t.nested ? 1 : 4));
  if (uses_quant_map(t.quant_type)) place(w.quant_map, t.quant_map, 64);
  if (t.nested) {
    place(w.nested_absmax, t.nested_absmax, s.weight.nested_absmax_count * 4);
    place(w.nested_code, t.nested_code, 1024);
  }
  place(v.x, g.x, s.x_bytes);
  b.inputs = make_buffer(std::max<VkDeviceSize>(in, 16), false);
  upload(b.inputs, pieces);
  for (Region* r : {&w.packed, &w.absmax, &w.quant_map, &w.nested_absmax, &w.nested_code, &v.x})
    if (r->bytes) r->buffer = b.inputs.buffer;
  b.y = make_buffer(round_up(static_cast<VkDeviceSize>(s.y_bytes), 16), host_y);
  v.y = {b.y.buffer, 0, static_cast<VkDeviceSize>(s.y_bytes)};
  v.n = g.n;
  v.k = g.k;
  v.m = g.m;
  v.x_dtype = g.x_dtype;
  v.y_dtype = g.y_dtype;
  v.mode = g.mode;  // resolved by core: NF4_GEMV_FAST only where gemv_fast said yes
  return b;
}

void VulkanBackend::gemv_host(const ValidGemv& g) {
  GemvBuffers b = upload_gemv(g, true);
  const std::unique_ptr<Job> job = kernels_->prepare_gemv(b.view);
  submit_and_wait([&](VkCommandBuffer cmd) {
    job->record(cmd);
    barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
  });
  std::memcpy(g.desc.y, b.y.mapped, static_cast<std::size_t>(g.sizes.y_bytes));
}

// ---- registration -----------------------------------------------------------------------------
nf4_device_type device_type(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return NF4_DEVICE_TYPE_DISCRETE_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return NF4_DEVICE_TYPE_INTEGRATED_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return NF4_DEVICE_TYPE_CPU;
    default: return NF4_DEVICE_TYPE_OTHER;
  }
}

std::vector<DeviceDescription> enumerate_devices() {
  const Instance& inst = shared_instance();
  std::string listing;
  std::vector<DeviceDescription> out;
  for (const Candidate& c : usable_devices(inst, listing)) {
    DeviceDescription d;
    d.name = c.info.name();
    d.description = c.info.describe();
    d.type = device_type(c.info.props.deviceType);
    VkPhysicalDeviceMemoryProperties memory{};
    inst.f.vkGetPhysicalDeviceMemoryProperties(c.pd, &memory);
    for (std::uint32_t h = 0; h < memory.memoryHeapCount; ++h)
      if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) d.memory_bytes = std::max<std::uint64_t>(d.memory_bytes, memory.memoryHeaps[h].size);
    d.uuid = c.info.device_uuid;
    d.caps = kVulkanCaps;
    // The fast contract needs cooperative matrices for fp16 or bf16 x (and NF4_VULKAN_COOP=1, see
    // Kernels::gemv_fast); a device without them runs every product under the exact one.
    const bool coop = c.info.coop && (c.info.coop_shape[0].m != 0 || (c.info.coop_bf16 && c.info.coop_shape[1].m != 0));
    if (!coop) d.caps.gemv_fast = GemvFastSupport::never;
    out.push_back(std::move(d));
  }
  return out;
}

struct ProbeResult {
  bool available = false;
  bool gpu = false;
  std::string text;
};

const ProbeResult& probe_once() {
  static const ProbeResult r = [] {
    ProbeResult p;
    try {
      const Candidate c = choose_device(shared_instance());
      p.available = true;
      p.gpu = c.info.props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
      p.text = c.info.describe();
    } catch (const std::exception& e) {
      p.text = e.what();
    }
    return p;
  }();
  return r;
}

}  // namespace
}  // namespace nf4::vk

nf4::BackendEntry nf4::vulkan_backend_entry() {
  // `auto` prefers a Vulkan GPU to the CPU backend, but not lavapipe (a CPU device) to it.
  const int priority = vk::probe_once().gpu ? 20 : 5;
  return BackendEntry{"vulkan", NF4_BACKEND_VULKAN, priority,
                      [](std::string* device_or_reason) {
                        *device_or_reason = vk::probe_once().text;
                        return vk::probe_once().available;
                      },
                      vk::enumerate_devices, [](DeviceChoice device) { return std::unique_ptr<Backend>(new vk::VulkanBackend(device)); }};
}
