// SPDX-License-Identifier: MIT
// The few declarations of VK_KHR_cooperative_matrix and VK_KHR_shader_bfloat16 that the fast
// product needs, for Vulkan headers older than those extensions (Debian 12 ships 1.3.239; the
// extensions came in 1.3.255 and 1.4.311). Values from the Vulkan registry; the headers' own
// definitions are used where present.
#pragma once

#include "backends/vulkan/vk_loader.h"

namespace nf4::vk {

#ifdef VK_KHR_cooperative_matrix
using CoopMatrixProps = VkCooperativeMatrixPropertiesKHR;
using CoopMatrixFeatures = VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
#else
struct CoopMatrixProps {
  VkStructureType sType;
  void* pNext;
  std::uint32_t MSize, NSize, KSize;
  std::int32_t AType, BType, CType, ResultType;  // VkComponentTypeKHR
  VkBool32 saturatingAccumulation;
  std::int32_t scope;  // VkScopeKHR
};
struct CoopMatrixFeatures {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};
#endif
struct Bfloat16Features {
  VkStructureType sType;
  void* pNext;
  VkBool32 shaderBFloat16Type;
  VkBool32 shaderBFloat16DotProduct;
  VkBool32 shaderBFloat16CooperativeMatrix;
};
using PFN_GetCoopMatrixProps = VkResult(VKAPI_PTR*)(VkPhysicalDevice, std::uint32_t*, CoopMatrixProps*);

inline constexpr const char* kCoopMatrixExtension = "VK_KHR_cooperative_matrix";
inline constexpr const char* kBfloat16Extension = "VK_KHR_shader_bfloat16";
inline constexpr auto kStypeCoopMatrixFeatures = static_cast<VkStructureType>(1000506000);
inline constexpr auto kStypeCoopMatrixProps = static_cast<VkStructureType>(1000506001);
inline constexpr auto kStypeBfloat16Features = static_cast<VkStructureType>(1000141000);
// VkComponentTypeKHR and VkScopeKHR values.
inline constexpr std::int32_t kComponentF16 = 0, kComponentF32 = 1, kComponentBf16 = 1000141000;
inline constexpr std::int32_t kScopeSubgroup = 3;

}  // namespace nf4::vk
