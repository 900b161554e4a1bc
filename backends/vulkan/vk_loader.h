// SPDX-License-Identifier: MIT
// The Vulkan loader, opened at run time (dlopen("libvulkan.so.1")) so that the library and the
// CLI run on machines without Vulkan, and the function tables nf4 calls through. No Vulkan
// prototype is ever linked: everything goes through vkGetInstanceProcAddr / vkGetDeviceProcAddr,
// the loader's or the application's (embedded use).
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include <string>

namespace nf4::vk {

#define NF4_VK_GLOBAL_FUNCTIONS(X)          \
  X(vkCreateInstance)                       \
  X(vkEnumerateInstanceLayerProperties)     \
  X(vkEnumerateInstanceExtensionProperties)

#define NF4_VK_INSTANCE_FUNCTIONS(X)          \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define NF4_VK_DEVICE_FUNCTIONS(X)     \
  X(vkDestroyDevice)                   \
  X(vkGetDeviceQueue)                  \
  X(vkDeviceWaitIdle)                  \
  X(vkCreateBuffer)                    \
  X(vkDestroyBuffer)                   \
  X(vkGetBufferMemoryRequirements)     \
  X(vkAllocateMemory)                  \
  X(vkFreeMemory)                      \
  X(vkBindBufferMemory)                \
  X(vkMapMemory)                       \
  X(vkUnmapMemory)                     \
  X(vkFlushMappedMemoryRanges)         \
  X(vkInvalidateMappedMemoryRanges)    \
  X(vkCreateShaderModule)              \
  X(vkDestroyShaderModule)             \
  X(vkCreateDescriptorSetLayout)       \
  X(vkDestroyDescriptorSetLayout)      \
  X(vkCreatePipelineLayout)            \
  X(vkDestroyPipelineLayout)           \
  X(vkCreateComputePipelines)          \
  X(vkDestroyPipeline)                 \
  X(vkCreateDescriptorPool)            \
  X(vkDestroyDescriptorPool)           \
  X(vkAllocateDescriptorSets)          \
  X(vkUpdateDescriptorSets)            \
  X(vkCreateCommandPool)               \
  X(vkDestroyCommandPool)              \
  X(vkResetCommandPool)                \
  X(vkAllocateCommandBuffers)          \
  X(vkBeginCommandBuffer)              \
  X(vkEndCommandBuffer)                \
  X(vkCmdBindPipeline)                 \
  X(vkCmdBindDescriptorSets)           \
  X(vkCmdPushConstants)                \
  X(vkCmdDispatch)                     \
  X(vkCmdPipelineBarrier)              \
  X(vkCmdCopyBuffer)                   \
  X(vkCmdFillBuffer)                   \
  X(vkCmdWriteTimestamp)               \
  X(vkCmdResetQueryPool)               \
  X(vkCreateQueryPool)                 \
  X(vkDestroyQueryPool)                \
  X(vkGetQueryPoolResults)             \
  X(vkQueueSubmit)                     \
  X(vkCreateFence)                     \
  X(vkDestroyFence)                    \
  X(vkWaitForFences)                   \
  X(vkResetFences)

#define NF4_VK_DECLARE(name) PFN_##name name = nullptr;

struct GlobalFns {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  NF4_VK_GLOBAL_FUNCTIONS(NF4_VK_DECLARE)
  // Optional: Vulkan 1.1 loaders have it; absent means 1.0.
  PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion = nullptr;
};

struct InstanceFns {
  NF4_VK_INSTANCE_FUNCTIONS(NF4_VK_DECLARE)
  // Optional (VK_EXT_debug_utils, only with the validation layer).
  PFN_vkCreateDebugUtilsMessengerEXT vkCreateDebugUtilsMessengerEXT = nullptr;
  PFN_vkDestroyDebugUtilsMessengerEXT vkDestroyDebugUtilsMessengerEXT = nullptr;
  // Optional: the features query (Vulkan 1.1 core) and VK_KHR_cooperative_matrix's property
  // list (vk_coop.h's PFN_GetCoopMatrixProps), for the fast product.
  PFN_vkGetPhysicalDeviceFeatures2 vkGetPhysicalDeviceFeatures2 = nullptr;
  PFN_vkVoidFunction vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR = nullptr;
};

struct DeviceFns {
  NF4_VK_DEVICE_FUNCTIONS(NF4_VK_DECLARE)
  // Optional (VK_KHR_pipeline_executable_properties): the compiled shaders' statistics and the
  // driver's internal representations, which NF4_VULKAN_PIPELINE_STATS=1 and 2 print (development only).
  PFN_vkGetPipelineExecutablePropertiesKHR vkGetPipelineExecutablePropertiesKHR = nullptr;
  PFN_vkGetPipelineExecutableStatisticsKHR vkGetPipelineExecutableStatisticsKHR = nullptr;
  PFN_vkGetPipelineExecutableInternalRepresentationsKHR vkGetPipelineExecutableInternalRepresentationsKHR = nullptr;
};

// The system loader, opened once per process and never closed. Throws nf4::Error
// (NF4_ERR_BACKEND_UNAVAILABLE) with dlerror()'s text when libvulkan.so.1 is missing.
const GlobalFns& system_loader();

// Loads the tables. Missing required functions throw nf4::Error naming the function.
GlobalFns load_global(PFN_vkGetInstanceProcAddr gipa);
InstanceFns load_instance(PFN_vkGetInstanceProcAddr gipa, VkInstance instance);
DeviceFns load_device(PFN_vkGetDeviceProcAddr gdpa, VkDevice device);

// Throws nf4::Error for a failed call: NF4_ERR_OUT_OF_MEMORY for the out-of-memory results,
// NF4_ERR_DEVICE otherwise; `what` names the call.
void check(VkResult result, const char* what);
const char* result_name(VkResult result);

}  // namespace nf4::vk
