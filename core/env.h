// SPDX-License-Identifier: MIT
// Every environment variable libnf4 reads, in one list, and the one reader (env_value). A ctest
// fails on a getenv anywhere else under core/ and backends/.
//
// Settings are the library's documented behaviour (README, nf4.h). Development knobs are for
// tuning, A/B runs and tests on the lab's machines (lab/, docs/PERFORMANCE.md): they choose which
// kernel, configuration or path runs, or shrink a device limit so a test reaches a rare path. No
// release promises to keep one, and an application should not set them.
#pragma once

#include <cstdlib>

namespace nf4 {

enum class EnvKind { kSetting, kDevelopmentKnob };

// X(id, name, kind, what it does)
#define NF4_ENV_VARS(X)                                                                                                    \
  X(kBackend, "NF4_BACKEND", kSetting, "auto|cpu|cuda|vulkan: what NF4_BACKEND_AUTO resolves to (core/registry.cpp)")      \
  X(kCpuThreads, "NF4_CPU_THREADS", kSetting, "the CPU backend's threads when the context options give none")               \
  X(kLog, "NF4_LOG", kSetting, "error|warning|info|debug: log messages printed on stderr (core/log.cpp)")                  \
  X(kVulkanDevice, "NF4_VULKAN_DEVICE", kSetting, "index or name part of the Vulkan device a context takes")               \
  X(kVulkanValidation, "NF4_VULKAN_VALIDATION", kDevelopmentKnob, "1: the Khronos validation layer, messages logged")      \
  X(kVulkanStaged, "NF4_VULKAN_STAGED", kDevelopmentKnob, "1: host calls through staging copies on every device")          \
  X(kVulkanMaxStorageRange, "NF4_VULKAN_MAX_STORAGE_RANGE", kDevelopmentKnob, "bytes: a smaller storage-buffer range")     \
  X(kVulkanMaxGroups, "NF4_VULKAN_MAX_GROUPS", kDevelopmentKnob, "a smaller workgroup count per dispatch")                 \
  X(kVulkanF16Check, "NF4_VULKAN_F16_CHECK", kDevelopmentKnob, "auto|off|full: the packHalf2x16 check (vk_kernels.h)")    \
  X(kVulkanTune, "NF4_VULKAN_TUNE", kDevelopmentKnob, "key=value list replacing the dequantize tuning (vk_kernels.cpp)")   \
  X(kVulkanGemvTune, "NF4_VULKAN_GEMV_TUNE", kDevelopmentKnob, "key=value list replacing the product's tuning")            \
  X(kVulkanCoop, "NF4_VULKAN_COOP", kDevelopmentKnob, "1: the cooperative-matrix shader for the fast product")             \
  X(kVulkanCoopTune, "NF4_VULKAN_COOP_TUNE", kDevelopmentKnob, "key=value list replacing gemv_coop.comp's schedule")       \
  X(kVulkanPipelineStats, "NF4_VULKAN_PIPELINE_STATS", kDevelopmentKnob, "1: the coop pipelines' driver statistics; 2: also the driver's internal representations")      \
  X(kCudaConfig, "NF4_CUDA_CONFIG", kDevelopmentKnob, "a kernel configuration replacing the tuning table (tuning.h)")      \
  X(kCudaConfigLive, "NF4_CUDA_CONFIG_LIVE", kDevelopmentKnob, "1: NF4_CUDA_CONFIG read for every call planned")          \
  X(kGemvConfig, "NF4_GEMV_CONFIG", kDevelopmentKnob, "the exact product's CUDA kernel and geometry (gemv_launch.h)")      \
  X(kGemvMma, "NF4_GEMV_MMA", kDevelopmentKnob, "the fast product's CUDA kernel and schedule (gemv_launch.h)")

enum class EnvVar {
#define NF4_ENV_ID(id, name, kind, what) id,
  NF4_ENV_VARS(NF4_ENV_ID)
#undef NF4_ENV_ID
};

struct EnvVarInfo {
  const char* name;
  EnvKind kind;
  const char* what;
};

inline constexpr EnvVarInfo kEnvVars[] = {
#define NF4_ENV_INFO(id, name, kind, what) {name, EnvKind::kind, what},
    NF4_ENV_VARS(NF4_ENV_INFO)
#undef NF4_ENV_INFO
};

constexpr const EnvVarInfo& env_info(EnvVar v) { return kEnvVars[static_cast<int>(v)]; }
constexpr const char* env_name(EnvVar v) { return env_info(v).name; }

// The variable's value as the environment holds it; nullptr where unset.
inline const char* env_value(EnvVar v) { return std::getenv(env_name(v)); }

// Whether an on/off variable is on: set to anything but "" or "0".
inline bool env_enabled(EnvVar v) {
  const char* s = env_value(v);
  return s && *s && !(s[0] == '0' && s[1] == 0);
}

}  // namespace nf4
