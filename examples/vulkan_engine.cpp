// SPDX-License-Identifier: MIT
// An engine-style program that owns its Vulkan device and embeds nf4 (include/nf4/nf4_vulkan.h):
// it uploads a bitsandbytes 4-bit weight and a batch of activations into its own device-local
// buffers once, then each frame records into its own command buffer: its work before (clear the
// outputs), nf4's dequantization and nf4's product y = x W^T (4 tokens, the fast contract asked
// for: it reports which contract ran), its work after (copy the results out for a readback), with
// the barriers between, submits and checks both against nf4's CPU backend (the oracle: the same
// bits under the exact contract, the stated bound under the fast one). nf4 never submits or
// waits: the engine does. Only the installed headers are used (nf4/nf4.h, nf4/nf4_vulkan.h).
//
//   nf4_vulkan_engine_example [rows cols]      (default 512 x 1536, bf16 output)
// Environment: NF4_VULKAN_DEVICE=index|name picks the device (default: the first discrete GPU,
// else device 0). The validation layer is enabled when installed; any message fails the run.
#include <vulkan/vulkan.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nf4/nf4.h"
#include "nf4/nf4_vulkan.h"

namespace {

int g_validation_messages = 0;

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT, VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
  ++g_validation_messages;
  std::fprintf(stderr, "validation: %s\n", data->pMessage);
  return VK_FALSE;
}

#define VK_OK(call)                                                              \
  do {                                                                           \
    const VkResult r_ = (call);                                                  \
    if (r_ != VK_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s failed: VkResult %d\n", #call, static_cast<int>(r_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

// VK_KHR_cooperative_matrix's and VK_KHR_shader_bfloat16's feature structures (what nf4's fast
// product needs enabled on the device, nf4_vulkan.h NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX), declared
// here for Vulkan headers older than those extensions (Debian 12 ships 1.3.239); layouts and
// structure types from the Vulkan registry.
struct CoopMatrixFeatures {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};
struct Bfloat16Features {
  VkStructureType sType;
  void* pNext;
  VkBool32 shaderBFloat16Type;
  VkBool32 shaderBFloat16DotProduct;
  VkBool32 shaderBFloat16CooperativeMatrix;
};
constexpr auto kStypeCoopMatrixFeatures = static_cast<VkStructureType>(1000506000);
constexpr auto kStypeBfloat16Features = static_cast<VkStructureType>(1000141000);

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
};

struct Engine {
  VkInstance instance = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  VkPhysicalDevice gpu = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  std::uint32_t family = 0;
  std::uint32_t api_version = VK_API_VERSION_1_1;  // the instance's
  bool coop = false;  // the device was created with the fast product's features (bf16 matrices included)
  VkQueue queue = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkPipelineCache cache = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory{};
  std::vector<Buffer> buffers;

  // false: no Vulkan device here (the example then has nothing to show).
  bool init() {
    std::uint32_t n = 0;
    vkEnumerateInstanceLayerProperties(&n, nullptr);
    std::vector<VkLayerProperties> layers(n);
    vkEnumerateInstanceLayerProperties(&n, layers.data());
    bool validation = false;
    for (const auto& l : layers) validation |= std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
    const char* layer = "VK_LAYER_KHRONOS_validation";
    const char* ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    // Vulkan 1.3 where the loader has it: nf4's fast product needs it (cooperative matrices below
    // 1.3 need full-subgroup pipelines).
    std::uint32_t loader_version = VK_API_VERSION_1_0;
    vkEnumerateInstanceVersion(&loader_version);
    api_version = loader_version >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_1;
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, "nf4 engine example", 1, "example engine", 1, api_version};
    VkDebugUtilsMessengerCreateInfoEXT mi{};
    mi.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = on_message;
    VkInstanceCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    if (validation) {
      ci.pNext = &mi;
      ci.enabledLayerCount = 1;
      ci.ppEnabledLayerNames = &layer;
      ci.enabledExtensionCount = 1;
      ci.ppEnabledExtensionNames = &ext;
    }
    if (vkCreateInstance(&ci, nullptr, &instance) != VK_SUCCESS) return false;
    if (validation) {
      auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
      VK_OK(create(instance, &mi, nullptr, &messenger));
    }
    std::printf("validation layer: %s\n", validation ? "on" : "not installed");

    vkEnumeratePhysicalDevices(instance, &n, nullptr);
    if (n == 0) return false;
    std::vector<VkPhysicalDevice> gpus(n);
    vkEnumeratePhysicalDevices(instance, &n, gpus.data());
    gpu = gpus[0];
    const char* want = std::getenv("NF4_VULKAN_DEVICE");
    for (std::uint32_t i = 0; i < n; ++i) {
      VkPhysicalDeviceProperties p;
      vkGetPhysicalDeviceProperties(gpus[i], &p);
      const bool match = want && *want ? (std::to_string(i) == want || std::strstr(p.deviceName, want))
                                       : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
      if (match) {
        gpu = gpus[i];
        break;
      }
    }
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(gpu, &props);
    std::printf("device: %s\n", props.deviceName);
    vkGetPhysicalDeviceQueueFamilyProperties(gpu, &n, nullptr);
    std::vector<VkQueueFamilyProperties> fams(n);
    vkGetPhysicalDeviceQueueFamilyProperties(gpu, &n, fams.data());
    while (family < n && !(fams[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
    if (family == n) return false;
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, nullptr, 0, family, 1, &prio};
    VkDeviceCreateInfo di{};
    di.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    // nf4's fast product (bf16 activations on cooperative matrices) where the device has every
    // piece: the two extensions and the features they and nf4 need.
    std::vector<const char*> extensions;
    VkPhysicalDeviceVulkan12Features v12{};
    v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    CoopMatrixFeatures coop_features{kStypeCoopMatrixFeatures, nullptr, VK_FALSE, VK_FALSE};
    Bfloat16Features bf16_features{kStypeBfloat16Features, nullptr, VK_FALSE, VK_FALSE, VK_FALSE};
    if (api_version >= VK_API_VERSION_1_3 && props.apiVersion >= VK_API_VERSION_1_3) {
      vkEnumerateDeviceExtensionProperties(gpu, nullptr, &n, nullptr);
      std::vector<VkExtensionProperties> exts(n);
      vkEnumerateDeviceExtensionProperties(gpu, nullptr, &n, exts.data());
      bool has_coop = false, has_bf16 = false;
      for (const auto& e : exts) {
        has_coop |= std::strcmp(e.extensionName, "VK_KHR_cooperative_matrix") == 0;
        has_bf16 |= std::strcmp(e.extensionName, "VK_KHR_shader_bfloat16") == 0;
      }
      if (has_coop && has_bf16) {
        v12.pNext = &coop_features;
        coop_features.pNext = &bf16_features;
        VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v12, {}};
        vkGetPhysicalDeviceFeatures2(gpu, &f2);
        coop = v12.vulkanMemoryModel && v12.vulkanMemoryModelDeviceScope && v12.shaderFloat16 && coop_features.cooperativeMatrix &&
               bf16_features.shaderBFloat16Type &&
               bf16_features.shaderBFloat16CooperativeMatrix;
      }
    }
    if (coop) {
      // Exactly these features on, nothing else the query reported.
      v12 = VkPhysicalDeviceVulkan12Features{};
      v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
      // The memory model with its Device scope: nf4's other shaders use Device-scope atomics.
      v12.vulkanMemoryModel = VK_TRUE;
      v12.vulkanMemoryModelDeviceScope = VK_TRUE;
      v12.shaderFloat16 = VK_TRUE;
      v12.pNext = &coop_features;
      coop_features = {kStypeCoopMatrixFeatures, &bf16_features, VK_TRUE, VK_FALSE};
      bf16_features = {kStypeBfloat16Features, nullptr, VK_TRUE, VK_FALSE, VK_TRUE};
      extensions = {"VK_KHR_cooperative_matrix", "VK_KHR_shader_bfloat16"};
      di.pNext = &v12;
      di.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
      di.ppEnabledExtensionNames = extensions.data();
    }
    std::printf("cooperative matrices (bf16): %s\n", coop ? "enabled" : "not available");
    VK_OK(vkCreateDevice(gpu, &di, nullptr, &device));
    vkGetDeviceQueue(device, family, 0, &queue);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr, VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, family};
    VK_OK(vkCreateCommandPool(device, &pi, nullptr, &pool));
    VkPipelineCacheCreateInfo pc{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, nullptr, 0, 0, nullptr};
    VK_OK(vkCreatePipelineCache(device, &pc, nullptr, &cache));  // nf4 builds its pipelines through it
    vkGetPhysicalDeviceMemoryProperties(gpu, &memory);
    return true;
  }

  Buffer buffer(VkDeviceSize size, VkMemoryPropertyFlags flags) {
    Buffer b;
    VkBufferCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    ci.size = size;
    ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VK_OK(vkCreateBuffer(device, &ci, nullptr, &b.buffer));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device, b.buffer, &req);
    std::uint32_t type = 0;
    while (type < memory.memoryTypeCount &&
           (!(req.memoryTypeBits & (1u << type)) || (memory.memoryTypes[type].propertyFlags & flags) != flags))
      ++type;
    if (type == memory.memoryTypeCount) {
      std::fprintf(stderr, "no memory type with flags 0x%x\n", flags);
      std::exit(1);
    }
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, req.size, type};
    VK_OK(vkAllocateMemory(device, &ai, nullptr, &b.memory));
    VK_OK(vkBindBufferMemory(device, b.buffer, b.memory, 0));
    if (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) VK_OK(vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped));
    buffers.push_back(b);
    return b;
  }

  // Records one command buffer with `record`, submits it, waits (a real engine would pace frames
  // with fences and keep several in flight).
  template <typename F>
  void submit(F&& record) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr, pool, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    VkCommandBuffer cmd;
    VK_OK(vkAllocateCommandBuffers(device, &ai, &cmd));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
    VK_OK(vkBeginCommandBuffer(cmd, &bi));
    record(cmd);
    VK_OK(vkEndCommandBuffer(cmd));
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, nullptr, 0};
    VkFence fence;
    VK_OK(vkCreateFence(device, &fi, nullptr, &fence));
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    VK_OK(vkQueueSubmit(queue, 1, &si, fence));
    VK_OK(vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX));
    vkDestroyFence(device, fence, nullptr);
    vkFreeCommandBuffers(device, pool, 1, &cmd);
  }

  void shutdown() {
    if (device) {
      vkDeviceWaitIdle(device);
      for (Buffer& b : buffers) {
        vkDestroyBuffer(device, b.buffer, nullptr);
        vkFreeMemory(device, b.memory, nullptr);
      }
      vkDestroyPipelineCache(device, cache, nullptr);
      vkDestroyCommandPool(device, pool, nullptr);
      vkDestroyDevice(device, nullptr);
    }
    if (messenger) {
      auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
      destroy(instance, messenger, nullptr);
    }
    if (instance) vkDestroyInstance(instance, nullptr);
  }
};

void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst, VkAccessFlags dst_access) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, src_access, dst_access};
  vkCmdPipelineBarrier(cmd, src, dst, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

VkDeviceSize align(VkDeviceSize v) { return (v + 255) / 256 * 256; }

// fp32 to bf16, round to nearest even (finite inputs).
std::uint16_t to_bf16(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// A weight in bitsandbytes' NF4 layout with nested absmax: codes packed two per byte (even element
// in the high nibble), one absmax per block of 64, stored as 8-bit codes of (absmax - mean) scaled
// per block of 256. A linear 8-bit table stands in for bitsandbytes' dynamic one: dequantization
// reads whichever table is stored with the weight.
struct Nf4Weight {
  static constexpr int blocksize = 64, nested_blocksize = 256;
  std::vector<std::uint8_t> packed, absmax;
  std::vector<float> quant_map, nested_absmax, nested_code;
  float nested_offset = 0.0f;
};

Nf4Weight quantize_nf4(const std::vector<float>& x) {
  static constexpr float nf4_table[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                          -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                          0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                          0.33791524171829224f, 0.44070982251167297f, 0.5626170039176941f,
                                          0.7229568362236023f, 1.0f};
  const auto nearest = [](const float* table, int count, float v) {
    return static_cast<int>(std::min_element(table, table + count, [v](float a, float b) { return std::fabs(a - v) < std::fabs(b - v); }) - table);
  };
  Nf4Weight w;
  const std::size_t n = x.size(), blocks = (n + w.blocksize - 1) / w.blocksize;
  std::vector<float> absmax(blocks, 0.0f);
  w.packed.assign((n + 1) / 2, 0);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t end = std::min(n, (b + 1) * w.blocksize);
    for (std::size_t i = b * w.blocksize; i < end; ++i) absmax[b] = std::max(absmax[b], std::fabs(x[i]));
    for (std::size_t i = b * w.blocksize; i < end; ++i) {
      const int q = nearest(nf4_table, 16, absmax[b] > 0.0f ? x[i] / absmax[b] : 0.0f);
      w.packed[i / 2] |= static_cast<std::uint8_t>(i % 2 ? q : q << 4);
    }
  }
  w.quant_map.assign(nf4_table, nf4_table + 16);
  for (int i = 0; i < 256; ++i) w.nested_code.push_back(-1.0f + 2.0f * static_cast<float>(i) / 255.0f);
  double sum = 0.0;
  for (float a : absmax) sum += a;
  w.nested_offset = static_cast<float>(sum / static_cast<double>(blocks));
  const std::size_t groups = (blocks + w.nested_blocksize - 1) / w.nested_blocksize;
  w.nested_absmax.assign(groups, 0.0f);
  w.absmax.resize(blocks);
  for (std::size_t b = 0; b < blocks; ++b)
    w.nested_absmax[b / w.nested_blocksize] = std::max(w.nested_absmax[b / w.nested_blocksize], std::fabs(absmax[b] - w.nested_offset));
  for (std::size_t b = 0; b < blocks; ++b) {
    const float scale = w.nested_absmax[b / w.nested_blocksize];
    w.absmax[b] = static_cast<std::uint8_t>(nearest(w.nested_code.data(), 256, scale > 0.0f ? (absmax[b] - w.nested_offset) / scale : 0.0f));
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t rows = argc > 2 ? std::atoll(argv[1]) : 512, cols = argc > 2 ? std::atoll(argv[2]) : 1536;
  const std::int64_t n = rows * cols;
  if (n <= 0) return 2;

  Engine engine;
  if (!engine.init()) {
    std::printf("no Vulkan device with a compute queue: nothing to show\n");
    engine.shutdown();
    return 0;
  }

  // A bitsandbytes-style NF4 weight (nested absmax, blocksize 64) of a random normal matrix.
  std::vector<float> x(static_cast<std::size_t>(n));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : x) v = normal(rng);
  const Nf4Weight w = quantize_nf4(x);
  // The product's activations: 4 tokens of `cols` features, bf16.
  constexpr int tokens = 4;
  std::vector<std::uint16_t> act(static_cast<std::size_t>(tokens * cols));
  for (auto& a : act) a = to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));

  // Upload once: the arrays packed into one device-local buffer through a staging buffer.
  struct Piece {
    const void* data;
    VkDeviceSize bytes, offset;
  };
  std::vector<Piece> pieces = {{w.packed.data(), w.packed.size(), 0},
                               {w.absmax.data(), w.absmax.size(), 0},
                               {w.quant_map.data(), 64, 0},
                               {w.nested_absmax.data(), w.nested_absmax.size() * 4, 0},
                               {w.nested_code.data(), 1024, 0}};
  VkDeviceSize total = 0;
  for (Piece& p : pieces) {
    p.offset = total;
    total = align(total + p.bytes + 3);  // +3: nf4 reads whole words
  }
  const VkDeviceSize out_bytes = static_cast<VkDeviceSize>(n) * 2;  // bf16
  const VkDeviceSize x_bytes = act.size() * 2, y_bytes = static_cast<VkDeviceSize>(tokens * rows) * 4;  // bf16 x, fp32 y
  const Buffer weights = engine.buffer(total, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const Buffer output = engine.buffer(align(out_bytes + 3), VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const Buffer xs = engine.buffer(align(x_bytes + 3), VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const Buffer ys = engine.buffer(align(y_bytes), VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  const VkMemoryPropertyFlags host_visible = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const Buffer staging = engine.buffer(std::max(total + align(x_bytes), align(out_bytes + 3)), host_visible);
  const Buffer y_readback = engine.buffer(align(y_bytes), host_visible);
  for (const Piece& p : pieces) std::memcpy(static_cast<char*>(staging.mapped) + p.offset, p.data, p.bytes);
  std::memcpy(static_cast<char*>(staging.mapped) + total, act.data(), x_bytes);
  engine.submit([&](VkCommandBuffer cmd) {
    const VkBufferCopy all{0, 0, total}, x_copy{total, 0, x_bytes};
    vkCmdCopyBuffer(cmd, staging.buffer, weights.buffer, 1, &all);
    vkCmdCopyBuffer(cmd, staging.buffer, xs.buffer, 1, &x_copy);
  });

  // nf4 on the engine's device: one context, one job for these buffers, recorded every frame.
  nf4_vulkan_context_info info{};
  info.instance = engine.instance;
  info.physical_device = engine.gpu;
  info.device = engine.device;
  info.queue_family_index = engine.family;
  info.api_version = engine.api_version;
  info.pipeline_cache = engine.cache;
  info.get_instance_proc_addr = vkGetInstanceProcAddr;
  info.get_device_proc_addr = vkGetDeviceProcAddr;
  info.features = engine.coop ? NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX : 0u;
  nf4_vulkan_context* ctx = nullptr;
  if (nf4_vulkan_context_create(&info, &ctx) != NF4_OK) {
    std::fprintf(stderr, "nf4_vulkan_context_create: %s\n", nf4_vulkan_last_error(nullptr));
    return 1;
  }
  const auto range = [&](int i) { return nf4_vulkan_buffer{weights.buffer, pieces[i].offset, total - pieces[i].offset}; };
  nf4_vulkan_tensor t{};
  t.quant_type = NF4_QUANT_NF4;
  t.out_dtype = NF4_DTYPE_BF16;
  t.numel = n;
  t.blocksize = w.blocksize;
  t.nested = 1;
  t.nested_blocksize = w.nested_blocksize;
  t.nested_offset = w.nested_offset;
  t.packed = range(0);
  t.absmax = range(1);
  t.quant_map = range(2);
  t.nested_absmax = range(3);
  t.nested_code = range(4);
  t.out = {output.buffer, 0, align(out_bytes + 3)};
  nf4_vulkan_job* job = nullptr;
  if (nf4_vulkan_job_create(ctx, &t, 1, &job) != NF4_OK) {
    std::fprintf(stderr, "nf4_vulkan_job_create: %s\n", nf4_vulkan_last_error(ctx));
    return 1;
  }
  // The product y[tokens, rows] = x[tokens, cols] W^T on the same weight buffers, the fast contract
  // asked for: where the context cannot run it (no cooperative-matrix features on the engine's
  // device) the exact contract runs and the job says so.
  nf4_vulkan_gemv g{};
  g.weight = &t;
  g.n = rows;
  g.k = cols;
  g.m = tokens;
  g.x_dtype = NF4_DTYPE_BF16;
  g.x = {xs.buffer, 0, align(x_bytes + 3)};
  g.y_dtype = NF4_DTYPE_F32;
  g.y = {ys.buffer, 0, align(y_bytes)};
  g.mode = NF4_GEMV_FAST;
  nf4_vulkan_job* product = nullptr;
  if (nf4_vulkan_gemv_job_create(ctx, &g, &product) != NF4_OK) {
    std::fprintf(stderr, "nf4_vulkan_gemv_job_create: %s\n", nf4_vulkan_last_error(ctx));
    return 1;
  }
  const nf4_gemv_mode ran = nf4_vulkan_job_gemv_mode(product);
  std::printf("product: %d tokens x %lld x %lld, fast contract asked for, %s contract runs\n", tokens, static_cast<long long>(rows),
              static_cast<long long>(cols), ran == NF4_GEMV_FAST ? "fast" : "exact");

  // The expected bits: the same weight through nf4's CPU backend, host pointers.
  std::vector<std::uint16_t> expected(static_cast<std::size_t>(n));
  nf4_tensor host{};
  host.quant_type = NF4_QUANT_NF4;
  host.out_dtype = NF4_DTYPE_BF16;
  host.numel = n;
  host.blocksize = w.blocksize;
  host.nested = 1;
  host.packed = w.packed.data();
  host.packed_bytes = static_cast<std::int64_t>(w.packed.size());
  host.absmax = w.absmax.data();
  host.absmax_count = static_cast<std::int64_t>(w.absmax.size());
  host.quant_map = w.quant_map.data();
  host.quant_map_count = 16;
  host.nested_absmax = w.nested_absmax.data();
  host.nested_absmax_count = static_cast<std::int64_t>(w.nested_absmax.size());
  host.nested_code = w.nested_code.data();
  host.nested_code_count = 256;
  host.nested_blocksize = w.nested_blocksize;
  host.nested_offset = w.nested_offset;
  host.out = expected.data();
  host.out_bytes = n * 2;
  nf4_context* cpu = nullptr;
  if (nf4_context_create(NF4_BACKEND_CPU, &cpu) != NF4_OK || nf4_dequantize_host(cpu, &host) != NF4_OK) {
    std::fprintf(stderr, "nf4 cpu backend: %s\n", nf4_last_error(cpu));
    return 1;
  }
  // The product's reference: under the exact contract the CPU backend's bits; under the fast one a
  // float64 sum of the bf16-rounded weights (the dequantized bf16 output above) times x, and the
  // contract's bound (docs/GEMV.md section 6: k 2^-22 sum |w x|, plus half an ulp of y).
  std::vector<float> y_exact(static_cast<std::size_t>(tokens * rows));
  std::vector<double> y64(y_exact.size()), y_abs(y_exact.size());
  nf4_gemv_desc d{};
  d.weight = &host;
  d.n = rows;
  d.k = cols;
  d.m = tokens;
  d.x_dtype = NF4_DTYPE_BF16;
  d.x = act.data();
  d.y_dtype = NF4_DTYPE_F32;
  d.y = y_exact.data();
  d.y_bytes = static_cast<std::int64_t>(y_bytes);
  d.mode = NF4_GEMV_EXACT;
  if (nf4_gemv_host(cpu, &d) != NF4_OK) {
    std::fprintf(stderr, "nf4 cpu backend: %s\n", nf4_last_error(cpu));
    return 1;
  }
  nf4_context_destroy(cpu);
  for (int j = 0; j < tokens; ++j)
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = 0.0, abs_sum = 0.0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(from_bf16(expected[static_cast<std::size_t>(r * cols + c)])) *
                         from_bf16(act[static_cast<std::size_t>(j * cols + c)]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      y64[static_cast<std::size_t>(j * rows + r)] = sum;
      y_abs[static_cast<std::size_t>(j * rows + r)] = abs_sum;
    }

  int failures = 0;
  for (int frame = 0; frame < 3; ++frame) {
    engine.submit([&](VkCommandBuffer cmd) {
      // The engine's own work before: clear the output (a stand-in for any producer).
      vkCmdFillBuffer(cmd, output.buffer, 0, VK_WHOLE_SIZE, 0xDEADBEEFu + static_cast<std::uint32_t>(frame));
      vkCmdFillBuffer(cmd, ys.buffer, 0, VK_WHOLE_SIZE, 0xDEADBEEFu + static_cast<std::uint32_t>(frame));
      barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      nf4_vulkan_job_record(job, cmd);      // binds nf4's pipeline and descriptor set, dispatches
      nf4_vulkan_job_record(product, cmd);  // the product reads the same weight: no barrier between
      barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_TRANSFER_READ_BIT);
      // ... and after: copy the dequantized weight and the product out (stand-ins for consumers).
      const VkBufferCopy back{0, 0, out_bytes}, y_back{0, 0, y_bytes};
      vkCmdCopyBuffer(cmd, output.buffer, staging.buffer, 1, &back);
      vkCmdCopyBuffer(cmd, ys.buffer, y_readback.buffer, 1, &y_back);
      barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    });
    const auto* got = static_cast<const std::uint16_t*>(staging.mapped);
    std::int64_t diff = 0;
    for (std::int64_t i = 0; i < n; ++i) diff += got[i] != expected[static_cast<std::size_t>(i)];
    std::printf("frame %d: %lld x %lld NF4 -> bf16 in %zu dispatch(es), %lld differing elements vs the CPU oracle\n", frame,
                static_cast<long long>(rows), static_cast<long long>(cols), nf4_vulkan_job_dispatch_count(job), static_cast<long long>(diff));
    failures += diff != 0;
    const auto* y = static_cast<const float*>(y_readback.mapped);
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < y_exact.size(); ++i) {
      if (ran == NF4_GEMV_EXACT) {
        wrong += std::memcmp(&y[i], &y_exact[i], 4) != 0;
      } else {
        const double bound = static_cast<double>(cols) * std::ldexp(y_abs[i], -22) + std::ldexp(std::fabs(y64[i]), -24);
        wrong += !(std::fabs(static_cast<double>(y[i]) - y64[i]) <= bound);
      }
    }
    std::printf("frame %d: product, %lld of %zu outputs %s\n", frame, static_cast<long long>(wrong), y_exact.size(),
                ran == NF4_GEMV_EXACT ? "differ from the CPU oracle's bits" : "outside the fast contract's bound");
    failures += wrong != 0;
  }

  nf4_vulkan_job_destroy(product);
  nf4_vulkan_job_destroy(job);  // the GPU is idle: every frame was waited for
  nf4_vulkan_context_destroy(ctx);
  engine.shutdown();
  if (g_validation_messages) std::printf("%d validation message(s)\n", g_validation_messages);
  return failures || g_validation_messages ? 1 : 0;
}
