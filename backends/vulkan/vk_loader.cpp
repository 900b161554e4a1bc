// SPDX-License-Identifier: MIT
#include "backends/vulkan/vk_loader.h"

#include <dlfcn.h>

#include <mutex>

#include "core/error.h"

namespace nf4::vk {

const char* result_name(VkResult r) {
  switch (r) {
#define NF4_VK_RESULT(name) \
  case name: return #name;
    NF4_VK_RESULT(VK_SUCCESS)
    NF4_VK_RESULT(VK_NOT_READY)
    NF4_VK_RESULT(VK_TIMEOUT)
    NF4_VK_RESULT(VK_INCOMPLETE)
    NF4_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
    NF4_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    NF4_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
    NF4_VK_RESULT(VK_ERROR_DEVICE_LOST)
    NF4_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
    NF4_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
    NF4_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
    NF4_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
    NF4_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
    NF4_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
    NF4_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
    NF4_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
    NF4_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
    NF4_VK_RESULT(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    NF4_VK_RESULT(VK_ERROR_FRAGMENTATION)
    NF4_VK_RESULT(VK_ERROR_UNKNOWN)
#undef NF4_VK_RESULT
    default: return "VkResult (unnamed)";
  }
}

void check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return;
  const nf4_status s = (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY) ? NF4_ERR_OUT_OF_MEMORY : NF4_ERR_DEVICE;
  fail(s, "{} failed: {} ({})", what, result_name(r), static_cast<int>(r));
}

const GlobalFns& system_loader() {
  static std::once_flag once;
  static GlobalFns fns;
  static std::string error;
  std::call_once(once, [] {
    // Never closed: Vulkan objects may outlive any nf4 object, and closing a loader while a
    // driver's threads run is unsafe.
    void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      error = std::string("cannot load the Vulkan loader libvulkan.so.1: ") + (e ? e : "unknown error");
      return;
    }
    auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
    if (!gipa) {
      error = "libvulkan.so.1 has no vkGetInstanceProcAddr";
      return;
    }
    try {
      fns = load_global(gipa);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  if (!error.empty()) fail(NF4_ERR_BACKEND_UNAVAILABLE, "{}", error);
  return fns;
}

GlobalFns load_global(PFN_vkGetInstanceProcAddr gipa) {
  GlobalFns f;
  f.vkGetInstanceProcAddr = gipa;
#define NF4_VK_LOAD(name)                                                                     \
  f.name = reinterpret_cast<PFN_##name>(gipa(VK_NULL_HANDLE, #name));                         \
  if (!f.name) fail(NF4_ERR_BACKEND_UNAVAILABLE, "the Vulkan loader lacks {}", #name);
  NF4_VK_GLOBAL_FUNCTIONS(NF4_VK_LOAD)
#undef NF4_VK_LOAD
  f.vkEnumerateInstanceVersion = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(gipa(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
  return f;
}

InstanceFns load_instance(PFN_vkGetInstanceProcAddr gipa, VkInstance instance) {
  InstanceFns f;
#define NF4_VK_LOAD(name)                                                                           \
  f.name = reinterpret_cast<PFN_##name>(gipa(instance, #name));                                     \
  if (!f.name) fail(NF4_ERR_DEVICE, "vkGetInstanceProcAddr found no {} (Vulkan 1.1 is required)", #name);
  NF4_VK_INSTANCE_FUNCTIONS(NF4_VK_LOAD)
#undef NF4_VK_LOAD
  f.vkCreateDebugUtilsMessengerEXT =
      reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(gipa(instance, "vkCreateDebugUtilsMessengerEXT"));
  f.vkDestroyDebugUtilsMessengerEXT =
      reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(gipa(instance, "vkDestroyDebugUtilsMessengerEXT"));
  f.vkGetPhysicalDeviceFeatures2 = reinterpret_cast<PFN_vkGetPhysicalDeviceFeatures2>(gipa(instance, "vkGetPhysicalDeviceFeatures2"));
  f.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR = gipa(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
  return f;
}

DeviceFns load_device(PFN_vkGetDeviceProcAddr gdpa, VkDevice device) {
  DeviceFns f;
#define NF4_VK_LOAD(name)                                                                    \
  f.name = reinterpret_cast<PFN_##name>(gdpa(device, #name));                                \
  if (!f.name) fail(NF4_ERR_DEVICE, "vkGetDeviceProcAddr found no {}", #name);
  NF4_VK_DEVICE_FUNCTIONS(NF4_VK_LOAD)
#undef NF4_VK_LOAD
  f.vkGetPipelineExecutablePropertiesKHR =
      reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(gdpa(device, "vkGetPipelineExecutablePropertiesKHR"));
  f.vkGetPipelineExecutableStatisticsKHR =
      reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(gdpa(device, "vkGetPipelineExecutableStatisticsKHR"));
  f.vkGetPipelineExecutableInternalRepresentationsKHR = reinterpret_cast<PFN_vkGetPipelineExecutableInternalRepresentationsKHR>(
      gdpa(device, "vkGetPipelineExecutableInternalRepresentationsKHR"));
  return f;
}

}  // namespace nf4::vk
