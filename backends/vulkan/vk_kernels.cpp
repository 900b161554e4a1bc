// SPDX-License-Identifier: MIT
#include "backends/vulkan/vk_kernels.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <string_view>

#include "backends/vulkan/variants.h"
#include "core/env.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/tensor.h"
#include "core/types.h"
#include "nf4_spirv.h"  // generated: the shaders' SPIR-V, compiled by glslc and checked by spirv-val

namespace nf4::vk {
namespace {

constexpr std::uint32_t kNoOffsetWord = 0xffffffffu;
constexpr std::uint32_t kBindings = 7;

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

std::uint32_t version_of(std::uint32_t v) { return VK_MAKE_API_VERSION(0, VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), 0); }

std::uint64_t env_u64(EnvVar var, std::uint64_t fallback) {
  const char* v = env_value(var);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 0);
  if (*end != '\0' || x == 0) fail(NF4_ERR_INVALID_ARGUMENT, "{}='{}' is not a positive integer", env_name(var), v);
  return x;
}

// Calls fn(key, value) for each item of the comma-separated "key=value" list `text`, read from
// the environment variable `var` (named in the error for an item without '=').
template <typename Fn>
void for_each_setting(const char* var, std::string_view text, Fn&& fn) {
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) fail(NF4_ERR_INVALID_ARGUMENT, "{}: '{}' is not key=value", var, item);
    fn(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
  }
}

// A setting's value as a 32-bit unsigned number: decimal digits only, at most 2^32 - 1 (so that a
// range check on the result cannot be passed by a value that wraps).
std::uint32_t setting_u32(const char* var, const std::string& key, const std::string& value) {
  const bool digits = !value.empty() && value.size() <= 10 && value.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long long v = digits ? std::strtoull(value.c_str(), nullptr, 10) : 0;
  if (!digits || v > 0xffffffffull) fail(NF4_ERR_INVALID_ARGUMENT, "{}: {} must be a number below 2^32, got '{}'", var, key, value);
  return static_cast<std::uint32_t>(v);
}

const spirv::Module* find_module(std::string_view name) {
  for (std::size_t i = 0; i < spirv::kModuleCount; ++i)
    if (name == spirv::kModules[i].name) return &spirv::kModules[i];
  return nullptr;
}

const spirv::Module& module(std::string_view name) {
  if (const spirv::Module* m = find_module(name)) return *m;
  fail(NF4_ERR_INTERNAL, "no embedded SPIR-V module '{}'", name);
}

}  // namespace

std::string DeviceInfo::describe() const {
  const char* type = "other";
  switch (props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: type = "discrete GPU"; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: type = "integrated GPU"; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: type = "virtual GPU"; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: type = "CPU"; break;
    default: break;
  }
  return fmt::format("{} (Vulkan {}.{}.{}, {})", props.deviceName, VK_API_VERSION_MAJOR(props.apiVersion),
                     VK_API_VERSION_MINOR(props.apiVersion), VK_API_VERSION_PATCH(props.apiVersion), type);
}

namespace {

// The device's cooperative-matrix features and shapes (DeviceInfo::coop*).
void query_coop(const InstanceFns& f, VkPhysicalDevice pd, bool has_bf16, DeviceInfo& d) {
  VkPhysicalDeviceFeatures2 f2{};
  f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
  VkPhysicalDeviceVulkan12Features v12{};
  v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  CoopMatrixFeatures cm{};
  cm.sType = kStypeCoopMatrixFeatures;
  Bfloat16Features bf{};
  bf.sType = kStypeBfloat16Features;
  f2.pNext = &v12;
  v12.pNext = &cm;
  if (has_bf16) cm.pNext = &bf;
  f.vkGetPhysicalDeviceFeatures2(pd, &f2);
  // gemv_coop.comp's workgroup is whole subgroups, one row tile each.
  const bool subgroups = d.subgroup_size >= 8 && std::has_single_bit(d.subgroup_size);
  // Device scope too: once vulkanMemoryModel is enabled, every module on the device (the exact
  // shaders' atomics included, which glslang gives Device scope) may use Device scope only with
  // vulkanMemoryModelDeviceScope (VUID-RuntimeSpirv-vulkanMemoryModel-06265).
  d.coop = cm.cooperativeMatrix && v12.vulkanMemoryModel && v12.vulkanMemoryModelDeviceScope && v12.shaderFloat16 && subgroups;
  d.coop_bf16 = d.coop && has_bf16 && bf.shaderBFloat16Type && bf.shaderBFloat16CooperativeMatrix;
  const auto list = reinterpret_cast<PFN_GetCoopMatrixProps>(f.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR);
  std::uint32_t n = 0;
  if (list(pd, &n, nullptr) != VK_SUCCESS) return;
  CoopMatrixProps blank{};
  blank.sType = kStypeCoopMatrixProps;
  std::vector<CoopMatrixProps> props(n, blank);
  const VkResult r = list(pd, &n, props.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return;
  props.resize(n);
  // Per x dtype, the listed shape with fp32 accumulation at subgroup scope nearest 16 x 16 x 16
  // (the tile gemv_coop.comp's shared memory is sized for): M and N 8 or 16, K 8, 16 or 32.
  int best[2] = {-1, -1};
  for (const CoopMatrixProps& p : props) {
    const char* a = p.AType == kComponentF16 ? "f16" : p.AType == kComponentBf16 ? "bf16" : nullptr;
    if (a && p.CType == kComponentF32)
      d.coop_listing += fmt::format("{}{} {}x{}x{}", d.coop_listing.empty() ? "" : ", ", a, p.MSize, p.NSize, p.KSize);
    const int slot = p.AType == kComponentF16 ? 0 : p.AType == kComponentBf16 ? 1 : -1;
    if (slot < 0 || p.BType != p.AType || p.CType != kComponentF32 || p.ResultType != kComponentF32 || p.saturatingAccumulation ||
        p.scope != kScopeSubgroup)
      continue;
    const auto in = [](std::uint32_t v, std::initializer_list<std::uint32_t> ok) { return std::find(ok.begin(), ok.end(), v) != ok.end(); };
    if (!in(p.MSize, {8, 16}) || !in(p.NSize, {8, 16}) || !in(p.KSize, {8, 16, 32})) continue;
    const int score = (p.MSize == 16) + (p.NSize == 16) + (p.KSize == 16);
    if (score > best[slot]) {
      best[slot] = score;
      d.coop_shape[static_cast<std::size_t>(slot)] = {p.MSize, p.NSize, p.KSize};
    }
  }
}

// NF4_VULKAN_PIPELINE_STATS=1 (development): coop_enable asks for the driver's pipeline
// statistics and make_pipeline prints those of each cooperative-matrix pipeline; 2: also the
// internal representations the driver gives (its compiled code, where it exposes it).
int pipeline_stats_level() {
  static const int level = [] {
    const char* v = env_value(EnvVar::kVulkanPipelineStats);
    return v && std::strcmp(v, "1") == 0 ? 1 : v && std::strcmp(v, "2") == 0 ? 2 : 0;
  }();
  return level;
}
bool pipeline_stats_requested() { return pipeline_stats_level() > 0; }

}  // namespace

void coop_enable(const DeviceInfo& info, CoopEnable& out) {
  out = CoopEnable{};
  if (!info.coop || (info.coop_shape[0].m == 0 && (!info.coop_bf16 || info.coop_shape[1].m == 0))) return;
  out.extensions.push_back(kCoopMatrixExtension);
  out.v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
  out.v12.vulkanMemoryModel = VK_TRUE;
  out.v12.vulkanMemoryModelDeviceScope = VK_TRUE;
  out.v12.shaderFloat16 = VK_TRUE;
  out.coop.sType = kStypeCoopMatrixFeatures;
  out.coop.cooperativeMatrix = VK_TRUE;
  out.v12.pNext = &out.coop;
  if (info.coop_bf16 && info.coop_shape[1].m != 0) {
    out.extensions.push_back(kBfloat16Extension);
    out.bf16.sType = kStypeBfloat16Features;
    out.bf16.shaderBFloat16Type = VK_TRUE;
    out.bf16.shaderBFloat16CooperativeMatrix = VK_TRUE;
    out.coop.pNext = &out.bf16;
  }
  if (pipeline_stats_requested()) {
    // Development: the driver's statistics of each cooperative-matrix pipeline (registers, local
    // memory), printed when it is made. Asked for blindly: a device without the extension fails.
    out.extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    out.stats.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR;
    out.stats.pipelineExecutableInfo = VK_TRUE;
    out.stats.pNext = out.v12.pNext;
    out.v12.pNext = &out.stats;
  }
  out.chain = &out.v12;
}

std::vector<std::uint32_t> with_bfloat16(std::vector<std::uint32_t> words) {
  NF4_CHECK(words.size() > 5 && words[0] == 0x07230203u);
  // SPIR-V enumerants: OpCapability 17, OpExtension 10, OpTypeFloat 22; capabilities Float16 9,
  // BFloat16TypeKHR 5116, BFloat16CooperativeMatrixKHR 5118; FP encoding BFloat16KHR 0.
  constexpr std::uint32_t kOpCapability = 17, kOpExtension = 10, kOpTypeFloat = 22;
  std::vector<std::uint32_t> out(words.begin(), words.begin() + 5);
  bool extension_added = false, retyped = false;
  for (std::size_t i = 5; i < words.size();) {
    const std::uint32_t wc = words[i] >> 16, op = words[i] & 0xffffu;
    NF4_CHECK(wc > 0 && i + wc <= words.size());
    if (!extension_added && op != kOpCapability) {
      const char name[] = "SPV_KHR_bfloat16";  // 16 characters and the terminator: 5 words
      std::uint32_t text[5] = {};
      std::memcpy(text, name, sizeof name);
      out.push_back((6u << 16) | kOpExtension);
      out.insert(out.end(), std::begin(text), std::end(text));
      extension_added = true;
    }
    if (op == kOpCapability && wc == 2 && words[i + 1] == 9u) {
      out.insert(out.end(), {(2u << 16) | kOpCapability, 5116u, (2u << 16) | kOpCapability, 5118u});
    } else if (op == kOpTypeFloat && wc == 3 && words[i + 2] == 16u) {
      out.insert(out.end(), {(4u << 16) | kOpTypeFloat, words[i + 1], 16u, 0u});
      retyped = true;
    } else {
      out.insert(out.end(), words.begin() + static_cast<std::ptrdiff_t>(i), words.begin() + static_cast<std::ptrdiff_t>(i + wc));
    }
    i += wc;
  }
  NF4_CHECK(extension_added && retyped);
  return out;
}

DeviceInfo query_device(const InstanceFns& f, VkPhysicalDevice pd, std::uint32_t instance_api_version) {
  DeviceInfo d;
  f.vkGetPhysicalDeviceProperties(pd, &d.props);
  d.api_version = std::min(version_of(instance_api_version), version_of(d.props.apiVersion));
  if (d.api_version < VK_API_VERSION_1_1) return d;  // unusable; the caller reports it
  VkPhysicalDeviceSubgroupProperties subgroup{};
  subgroup.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
  VkPhysicalDeviceFloatControlsProperties controls{};
  controls.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES;
  VkPhysicalDeviceIDProperties ids{};
  ids.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES;
  subgroup.pNext = &ids;
  if (d.api_version >= VK_API_VERSION_1_2) ids.pNext = &controls;
  VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm{};
  sm.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV;
  bool has_sm = false, has_coop = false, has_bf16 = false;
  {
    std::uint32_t count = 0;
    if (f.vkEnumerateDeviceExtensionProperties(pd, nullptr, &count, nullptr) == VK_SUCCESS && count > 0) {
      std::vector<VkExtensionProperties> ext(count);
      // VK_INCOMPLETE (the list grew in between) still gives a usable prefix.
      const VkResult r = f.vkEnumerateDeviceExtensionProperties(pd, nullptr, &count, ext.data());
      if (r == VK_SUCCESS || r == VK_INCOMPLETE)
        for (std::uint32_t i = 0; i < count; ++i) {
          has_sm |= std::strcmp(ext[i].extensionName, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME) == 0;
          has_coop |= std::strcmp(ext[i].extensionName, kCoopMatrixExtension) == 0;
          has_bf16 |= std::strcmp(ext[i].extensionName, kBfloat16Extension) == 0;
        }
    }
  }
  VkPhysicalDeviceProperties2 p2{};
  p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
  p2.pNext = &subgroup;
  if (has_sm) {
    sm.pNext = p2.pNext;
    p2.pNext = &sm;
  }
  f.vkGetPhysicalDeviceProperties2(pd, &p2);
  if (has_sm) {
    d.sm_count = sm.shaderSMCount;
    d.warps_per_sm = sm.shaderWarpsPerSM;
  }
  d.subgroup_size = subgroup.subgroupSize;
  d.subgroup_shuffle = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                       (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0;
  std::memcpy(d.device_uuid.data(), ids.deviceUUID, d.device_uuid.size());
  if (d.api_version >= VK_API_VERSION_1_2 && has_coop && f.vkGetPhysicalDeviceFeatures2 &&
      f.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)
    query_coop(f, pd, has_bf16, d);
  if (d.api_version >= VK_API_VERSION_1_2) {
    // Only fp32 is used. Where the device cannot set the fp32 mode on its own (independence
    // NONE), nf4 leaves the default rather than constrain 16/64-bit modes it never declares.
    const bool denorm_free = controls.denormBehaviorIndependence != VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
    const bool round_free = controls.roundingModeIndependence != VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
    d.denorm_preserve32 = controls.shaderDenormPreserveFloat32 && denorm_free;
    d.signed_zero_inf_nan32 = controls.shaderSignedZeroInfNanPreserveFloat32;
    d.rounding_rte32 = controls.shaderRoundingModeRTEFloat32 && round_free;
    d.float_controls = fmt::format(
        "shaderDenormPreserveFloat32={} shaderDenormFlushToZeroFloat32={} denormBehaviorIndependence={} "
        "shaderSignedZeroInfNanPreserveFloat32={} shaderRoundingModeRTEFloat32={} roundingModeIndependence={}",
        controls.shaderDenormPreserveFloat32, controls.shaderDenormFlushToZeroFloat32, static_cast<int>(controls.denormBehaviorIndependence),
        controls.shaderSignedZeroInfNanPreserveFloat32, controls.shaderRoundingModeRTEFloat32, static_cast<int>(controls.roundingModeIndependence));
  }
  return d;
}

// ---- tuning table --------------------------------------------------------------------------
// Each entry: what it was measured on and what it gave.
Tuning tuning_for(const DeviceInfo& info) {
  Tuning t;  // generic: direct kernel, fp16 by the per-block table unless packHalf2x16 is proven
  switch (info.props.vendorID) {
    case 0x10DE:  // NVIDIA
      // H200, gpu_vulkan_tune.sh sweep against CUDA, 2026-11-22: this shape won (docs/PERFORMANCE_LOG.md "Vulkan tuning_for").
      t.table = {TableStrategy::kAuto, TableStrategy::kDirect, TableStrategy::kDirect};
      t.workgroup = 128;
      t.units = 4;
      t.pair_lut = false;
      t.nontemporal = 0;
      t.why = "NVIDIA: H200 sweep";
      break;
    default:
      // Other vendors and lavapipe: not measured; NVIDIA's shape, fp16 by the per-block table (same section).
      t.why = "generic default";
      break;
  }
  if (const char* env = env_value(EnvVar::kVulkanTune); env && *env) {
    // "table=a00,wg=256,units=4,nt=3,pair=1,f16hw=1,bf16hw=1,copy_wg=256,copy_units=4" (any subset)
    for_each_setting("NF4_VULKAN_TUNE", env, [&](const std::string& key, const std::string& value) {
      if (key == "table") {
        if (value.size() != t.table.size() || value.find_first_not_of("01a") != std::string::npos)
          fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_TUNE: table must be {} of 0/1/a ({}), got '{}'", t.table.size(), joined_names(kDtypes),
               value);
        for (std::size_t d = 0; d < t.table.size(); ++d)
          t.table[d] = value[d] == '1' ? TableStrategy::kTable : value[d] == 'a' ? TableStrategy::kAuto : TableStrategy::kDirect;
        return;
      }
      const std::uint32_t v = setting_u32("NF4_VULKAN_TUNE", key, value);
      if (key == "wg") t.workgroup = v;
      else if (key == "units") t.units = v;
      else if (key == "copy_wg") t.copy_workgroup = v;
      else if (key == "copy_units") t.copy_units = v;
      else if (key == "nt" || key == "f16hw" || key == "bf16hw" || key == "pair") {
        if (v > (key == "nt" ? 3u : 1u))
          fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_TUNE: {} must be {}, got '{}'", key, key == "nt" ? "0..3" : "0 or 1", value);
        if (key == "nt") t.nontemporal = v;
        else if (key == "pair") t.pair_lut = v == 1;
        else if (key == "bf16hw") t.bf16_hardware = v == 1;
        else t.f16_hardware = v == 1;
      } else fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_TUNE: unknown key '{}'", key);
    });
    t.why = std::string("NF4_VULKAN_TUNE=") + env;
  }
  for (std::uint32_t wg : {t.workgroup, t.copy_workgroup})
    if (wg < 16 || wg > 1024 || !std::has_single_bit(wg))
      fail(NF4_ERR_INVALID_ARGUMENT, "Vulkan workgroup size must be a power of two in [16, 1024], got {}", wg);
  for (std::uint32_t u : {t.units, t.copy_units})
    if (u < 1 || u > 8) fail(NF4_ERR_INVALID_ARGUMENT, "Vulkan units per invocation must be in [1, 8], got {}", u);
  return t;
}

// ---- SPIR-V float controls -----------------------------------------------------------------
std::vector<std::uint32_t> with_float_controls(const std::uint32_t* words, std::size_t count, const DeviceInfo& info) {
  std::vector<std::uint32_t> out(words, words + count);
  struct Mode {
    bool on;
    std::uint32_t capability, mode;
  };
  // SPIR-V enumerants (SPV_KHR_float_controls): capabilities 4464/4466/4467, modes 4459/4461/4462.
  const Mode modes[] = {{info.denorm_preserve32, 4464, 4459}, {info.signed_zero_inf_nan32, 4466, 4461}, {info.rounding_rte32, 4467, 4462}};
  if (std::none_of(std::begin(modes), std::end(modes), [](const Mode& m) { return m.on; })) return out;
  NF4_CHECK(count > 5 && words[0] == 0x07230203u);

  std::size_t after_caps = 0, after_entries = 0;
  std::uint32_t entry = 0;
  for (std::size_t i = 5; i < count;) {
    const std::uint32_t op = words[i] & 0xffffu, wc = words[i] >> 16;
    NF4_CHECK(wc > 0 && i + wc <= count);
    if (op == 17) after_caps = i + wc;  // OpCapability
    if (op == 15) {                      // OpEntryPoint: model, id, name...
      entry = words[i + 2];
      after_entries = i + wc;
    }
    i += wc;
  }
  NF4_CHECK(after_caps > 0 && after_entries > after_caps && entry != 0);

  std::vector<std::uint32_t> caps, exec;
  for (const Mode& m : modes) {
    if (!m.on) continue;
    caps.insert(caps.end(), {(2u << 16) | 17u, m.capability});
    exec.insert(exec.end(), {(4u << 16) | 16u, entry, m.mode, 32u});  // OpExecutionMode %main mode 32
  }
  // OpExtension "SPV_KHR_float_controls" (core from SPIR-V 1.4; harmless before).
  const char name[] = "SPV_KHR_float_controls";
  std::vector<std::uint32_t> ext((sizeof name + 3) / 4, 0u);
  std::memcpy(ext.data(), name, sizeof name);
  caps.push_back(((1u + static_cast<std::uint32_t>(ext.size())) << 16) | 10u);
  caps.insert(caps.end(), ext.begin(), ext.end());

  out.insert(out.begin() + static_cast<std::ptrdiff_t>(after_entries), exec.begin(), exec.end());
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(after_caps), caps.begin(), caps.end());
  return out;
}

std::vector<std::uint32_t> with_nontemporal(std::vector<std::uint32_t> w, std::uint32_t load_bindings, std::uint32_t store_bindings) {
  // SPIR-V: a 5-word header, then instructions (word count << 16 | opcode). Definitions come
  // before uses in a module, so one pass finds the variables (OpDecorate ... Binding/DescriptorSet
  // come first), the pointers derived from them, and then the loads and stores through those.
  constexpr std::uint32_t kOpDecorate = 71, kOpVariable = 59, kOpAccessChain = 65, kOpInBoundsAccessChain = 66,
                          kOpPtrAccessChain = 67, kOpCopyObject = 83, kOpLoad = 61, kOpStore = 62;
  constexpr std::uint32_t kDecorationBinding = 33, kDecorationDescriptorSet = 34, kNontemporal = 0x4;
  if (w.size() < 5 || (load_bindings == 0 && store_bindings == 0)) return w;
  std::map<std::uint32_t, std::uint32_t> binding, set;  // variable id -> decoration value
  std::map<std::uint32_t, std::uint32_t> role;            // pointer id -> 1 load, 2 store (bits)
  std::vector<std::uint32_t> out(w.begin(), w.begin() + 5);
  out.reserve(w.size() + 64);
  for (std::size_t i = 5; i < w.size();) {
    const std::uint32_t count = w[i] >> 16, op = w[i] & 0xffffu;
    if (count == 0 || i + count > w.size()) fail(NF4_ERR_INTERNAL, "malformed SPIR-V at word {}", i);
    std::vector<std::uint32_t> inst(w.begin() + static_cast<std::ptrdiff_t>(i), w.begin() + static_cast<std::ptrdiff_t>(i + count));
    i += count;
    if (op == kOpDecorate && count >= 4 && inst[2] == kDecorationBinding) binding[inst[1]] = inst[3];
    if (op == kOpDecorate && count >= 4 && inst[2] == kDecorationDescriptorSet) set[inst[1]] = inst[3];
    if (op == kOpVariable && count >= 4 && binding.count(inst[2]) && set[inst[2]] == 0 && binding[inst[2]] < 32) {
      const std::uint32_t bit = 1u << binding[inst[2]];
      role[inst[2]] = ((load_bindings & bit) ? 1u : 0u) | ((store_bindings & bit) ? 2u : 0u);
    }
    if ((op == kOpAccessChain || op == kOpInBoundsAccessChain || op == kOpPtrAccessChain || op == kOpCopyObject) && count >= 4 &&
        role.count(inst[3]))
      role[inst[2]] = role[inst[3]];
    const bool load = op == kOpLoad && count >= 4 && role.count(inst[3]) && (role[inst[3]] & 1u);
    const bool store = op == kOpStore && count >= 3 && role.count(inst[1]) && (role[inst[1]] & 2u);
    if (load || store) {
      const std::size_t mask_at = load ? 4 : 3;
      if (count > mask_at) {
        inst[mask_at] |= kNontemporal;  // Nontemporal takes no extra operand
      } else {
        inst.push_back(kNontemporal);
        inst[0] = (static_cast<std::uint32_t>(inst.size()) << 16) | op;
      }
    }
    out.insert(out.end(), inst.begin(), inst.end());
  }
  return out;
}

// ---- the fp16 verdict ---------------------------------------------------------------------
F16CheckMode f16_check_mode() {
  const char* v = env_value(EnvVar::kVulkanF16Check);
  if (!v || !*v || std::strcmp(v, "auto") == 0) return F16CheckMode::kAuto;
  if (std::strcmp(v, "off") == 0) return F16CheckMode::kOff;
  if (std::strcmp(v, "full") == 0) return F16CheckMode::kFull;
  if (std::strcmp(v, "sample") == 0) return F16CheckMode::kSample;
  fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_F16_CHECK='{}' is not auto, off, full or sample", v);
}

F16CheckPlan f16_check_plan(const DeviceInfo& info) {
  constexpr std::uint32_t kAllGroups = static_cast<std::uint32_t>((std::uint64_t{1} << 32) / Kernels::kF16CheckPerGroup);
  switch (f16_check_mode()) {
    case F16CheckMode::kOff: return {};
    case F16CheckMode::kAuto:
      if (info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) return {};
      return {kAllGroups, 1};
    case F16CheckMode::kFull: return {kAllGroups, 1};
    case F16CheckMode::kSample: return {64, 4099};  // 2^20 inputs spread over every exponent
  }
  return {};
}

namespace {
std::mutex g_verdict_mutex;
std::map<std::string, bool> g_verdicts;
std::string verdict_key(const DeviceInfo& info, nf4_dtype d) {
  std::string k;
  for (std::uint8_t b : info.device_uuid) k += fmt::format("{:02x}", b);
  return fmt::format("{}/{}/{}/{}/{}", k, info.props.vendorID, info.props.driverVersion, static_cast<int>(f16_check_mode()), static_cast<int>(d));
}
}  // namespace

int f16_verdict(const DeviceInfo& info, nf4_dtype d) {
  std::lock_guard lock(g_verdict_mutex);
  const auto it = g_verdicts.find(verdict_key(info, d));
  return it == g_verdicts.end() ? -1 : (it->second ? 1 : 0);
}

void set_f16_verdict(const DeviceInfo& info, nf4_dtype d, bool exact) {
  std::lock_guard lock(g_verdict_mutex);
  g_verdicts[verdict_key(info, d)] = exact;
}

// ---- Kernels -------------------------------------------------------------------------------
Kernels::Kernels(const DeviceFns& fns, VkDevice device, const DeviceInfo& info, VkPipelineCache cache, Tuning tuning)
    : fns_(fns), device_(device), info_(info), cache_(cache), tuning_(std::move(tuning)) {
  const VkPhysicalDeviceLimits& lim = info_.props.limits;
  if (tuning_.workgroup > lim.maxComputeWorkGroupSize[0] || tuning_.workgroup > lim.maxComputeWorkGroupInvocations)
    tuning_.workgroup = std::bit_floor(std::min(lim.maxComputeWorkGroupSize[0], lim.maxComputeWorkGroupInvocations));
  if (tuning_.copy_workgroup > lim.maxComputeWorkGroupSize[0] || tuning_.copy_workgroup > lim.maxComputeWorkGroupInvocations)
    tuning_.copy_workgroup = tuning_.workgroup;
  // The output table takes workgroup * units * 16 bytes of shared memory.
  while (tuning_.units > 1 && tuning_.workgroup * tuning_.units * 16u + 64u > lim.maxComputeSharedMemorySize) tuning_.units /= 2;
  while (tuning_.workgroup > 16 && tuning_.workgroup * tuning_.units * 16u + 64u > lim.maxComputeSharedMemorySize) tuning_.workgroup /= 2;

  align_ = std::max<VkDeviceSize>(lim.minStorageBufferOffsetAlignment, 16);
  max_range_ = std::min<std::uint64_t>(lim.maxStorageBufferRange, env_u64(EnvVar::kVulkanMaxStorageRange, ~std::uint64_t{0}));
  max_groups_ = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(lim.maxComputeWorkGroupCount[0], env_u64(EnvVar::kVulkanMaxGroups, ~std::uint64_t{0})));
  // A team of gemv.comp is one warp where warps are 32 lanes (the subgroup size).
  if (info_.subgroup_size == 32) gemv_resident_teams_ = std::int64_t{info_.sm_count} * info_.warps_per_sm;

  plan_.elements_per_item = 8 * tuning_.units;
  plan_.items_per_group = tuning_.workgroup;
  plan_.max_groups = max_groups_;
  plan_.chunk_alignment = 4096;  // >= every blocksize: chunks start on a block, on whole words and vectors
  plan_.max_chunks_per_dispatch = 1;
  const std::int64_t step = std::lcm<std::int64_t>(plan_.chunk_alignment, plan_.elements_per_item * plan_.items_per_group);
  // A chunk's largest binding is its output (4 bytes per element for fp32), plus the alignment
  // slack of its descriptor offset and the rounding to words.
  const std::int64_t by_range = (static_cast<std::int64_t>(max_range_) - static_cast<std::int64_t>(2 * align_) - 64) / 4;
  plan_.max_elements_per_chunk = std::max(step, std::min<std::int64_t>(by_range, std::int64_t{1} << 30) / step * step);
  max_range_ = std::max<std::uint64_t>(max_range_, static_cast<std::uint64_t>(plan_.max_elements_per_chunk) * 4 + 2 * align_ + 64);
  NF4_CHECK(max_range_ <= lim.maxStorageBufferRange || env_value(EnvVar::kVulkanMaxStorageRange));

  const auto make_set_layout = [&](std::uint32_t n) {
    std::vector<VkDescriptorSetLayoutBinding> b(n);
    for (std::uint32_t i = 0; i < n; ++i) b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    ci.bindingCount = n;
    ci.pBindings = b.data();
    VkDescriptorSetLayout l = VK_NULL_HANDLE;
    check(fns_.vkCreateDescriptorSetLayout(device_, &ci, nullptr, &l), "vkCreateDescriptorSetLayout");
    return l;
  };
  const auto make_layout = [&](VkDescriptorSetLayout set, std::uint32_t push_bytes) {
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
    VkPipelineLayoutCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    ci.setLayoutCount = 1;
    ci.pSetLayouts = &set;
    ci.pushConstantRangeCount = 1;
    ci.pPushConstantRanges = &range;
    VkPipelineLayout l = VK_NULL_HANDLE;
    check(fns_.vkCreatePipelineLayout(device_, &ci, nullptr, &l), "vkCreatePipelineLayout");
    return l;
  };
  try {
    set_layout_ = make_set_layout(kBindings);
    copy_set_layout_ = make_set_layout(2);
    check_set_layout_ = make_set_layout(1);
    layout_ = make_layout(set_layout_, sizeof(PushConstants));
    copy_layout_ = make_layout(copy_set_layout_, 3 * sizeof(std::uint32_t));
    check_layout_ = make_layout(check_set_layout_, 2 * sizeof(std::uint32_t));
  } catch (...) {
    destroy();
    throw;
  }
}

Kernels::~Kernels() { destroy(); }

void Kernels::destroy() {
  for (auto& [key, p] : pipelines_) fns_.vkDestroyPipeline(device_, p, nullptr);
  pipelines_.clear();
  if (copy_pipeline_) fns_.vkDestroyPipeline(device_, copy_pipeline_, nullptr);
  copy_pipeline_ = VK_NULL_HANDLE;
  for (VkPipeline& p : check_pipelines_) {
    if (p) fns_.vkDestroyPipeline(device_, p, nullptr);
    p = VK_NULL_HANDLE;
  }
  for (auto& [key, p] : gemv_pipelines_) fns_.vkDestroyPipeline(device_, p, nullptr);
  gemv_pipelines_.clear();
  for (auto& [key, p] : coop_pipelines_) fns_.vkDestroyPipeline(device_, p, nullptr);
  coop_pipelines_.clear();
  if (gemv_layout_) fns_.vkDestroyPipelineLayout(device_, gemv_layout_, nullptr);
  if (gemv_set_layout_) fns_.vkDestroyDescriptorSetLayout(device_, gemv_set_layout_, nullptr);
  gemv_layout_ = VK_NULL_HANDLE;
  gemv_set_layout_ = VK_NULL_HANDLE;
  for (VkPipelineLayout l : {layout_, copy_layout_, check_layout_})
    if (l) fns_.vkDestroyPipelineLayout(device_, l, nullptr);
  for (VkDescriptorSetLayout l : {set_layout_, copy_set_layout_, check_set_layout_})
    if (l) fns_.vkDestroyDescriptorSetLayout(device_, l, nullptr);
  layout_ = copy_layout_ = check_layout_ = VK_NULL_HANDLE;
  set_layout_ = copy_set_layout_ = check_set_layout_ = VK_NULL_HANDLE;
}

VkPipeline Kernels::make_pipeline(const char* module_name, VkPipelineLayout layout, std::uint32_t wg, std::uint32_t units,
                                  std::uint32_t nontemporal, const std::vector<std::uint32_t>* spec_values) const {
  // "gemv_coop:bf16": gemv_coop's module with its matrix operands retyped to bfloat16.
  const std::string_view name(module_name);
  const bool bf16 = name.ends_with(":bf16");
  const spirv::Module& m = module(bf16 ? name.substr(0, name.size() - 5) : name);
  std::vector<std::uint32_t> code = with_float_controls(m.words, m.count, info_);
  if (bf16) code = with_bfloat16(std::move(code));
  // Bindings of dequantize.comp: 0 = packed codes (loads), 6 = output (stores).
  if (nontemporal) code = with_nontemporal(std::move(code), (nontemporal & 1u) ? 1u << 0 : 0u, (nontemporal & 2u) ? 1u << 6 : 0u);
  VkShaderModuleCreateInfo mi{};
  mi.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
  mi.codeSize = code.size() * sizeof(std::uint32_t);
  mi.pCode = code.data();
  VkShaderModule sm = VK_NULL_HANDLE;
  check(fns_.vkCreateShaderModule(device_, &mi, nullptr, &sm), "vkCreateShaderModule");

  // Constant 2 (PAIR_LUT) exists in dequantize.comp only; a map entry for a constant a shader does
  // not declare has no effect.
  // `spec_values`, where given, replaces these: constant i = spec_values[i].
  const std::uint32_t spec_data[3] = {wg, units, tuning_.pair_lut ? 1u : 0u};
  const VkSpecializationMapEntry entries[3] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}};
  VkSpecializationInfo spec{3, entries, sizeof spec_data, spec_data};
  std::vector<VkSpecializationMapEntry> custom;
  if (spec_values) {
    for (std::uint32_t i = 0; i < spec_values->size(); ++i) custom.push_back({i, 4 * i, 4});
    spec = {static_cast<std::uint32_t>(custom.size()), custom.data(), 4 * spec_values->size(), spec_values->data()};
  }
  VkComputePipelineCreateInfo ci{};
  ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = sm;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = &spec;
  ci.layout = layout;
  const bool stats = (bf16 || name == "gemv_coop") && pipeline_stats_requested() && fns_.vkGetPipelineExecutableStatisticsKHR;
  const bool representations = stats && pipeline_stats_level() >= 2 && fns_.vkGetPipelineExecutableInternalRepresentationsKHR;
  if (stats) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  if (representations) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
  VkPipeline p = VK_NULL_HANDLE;
  const VkResult r = fns_.vkCreateComputePipelines(device_, cache_, 1, &ci, nullptr, &p);
  fns_.vkDestroyShaderModule(device_, sm, nullptr);
  check(r, "vkCreateComputePipelines");
  if (stats) {
    std::string line = fmt::format("nf4 pipeline stats {}", module_name);
    if (spec_values)
      for (std::uint32_t v : *spec_values) line += fmt::format(" {}", v);
    VkPipelineExecutableInfoKHR ei{};
    ei.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR;
    ei.pipeline = p;
    std::uint32_t n = 0;
    if (fns_.vkGetPipelineExecutableStatisticsKHR(device_, &ei, &n, nullptr) == VK_SUCCESS) {
      std::vector<VkPipelineExecutableStatisticKHR> st(n);
      for (auto& x : st) x.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR;
      if (fns_.vkGetPipelineExecutableStatisticsKHR(device_, &ei, &n, st.data()) == VK_SUCCESS)
        for (std::uint32_t i = 0; i < n; ++i) {
          const VkPipelineExecutableStatisticKHR& x = st[i];
          line += fmt::format(" | {}=", x.name);
          switch (x.format) {
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: line += fmt::format("{}", x.value.b32); break;
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: line += fmt::format("{}", x.value.i64); break;
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: line += fmt::format("{}", x.value.u64); break;
            case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: line += fmt::format("{}", x.value.f64); break;
            default: break;
          }
        }
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    if (representations) {
      n = 0;
      if (fns_.vkGetPipelineExecutableInternalRepresentationsKHR(device_, &ei, &n, nullptr) == VK_SUCCESS) {
        std::vector<VkPipelineExecutableInternalRepresentationKHR> irs(n);
        for (auto& x : irs) x.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR;
        fns_.vkGetPipelineExecutableInternalRepresentationsKHR(device_, &ei, &n, irs.data());  // the sizes
        std::vector<std::vector<char>> data(n);
        for (std::uint32_t i = 0; i < n; ++i) {
          data[i].resize(irs[i].dataSize + 1, '\0');
          irs[i].pData = data[i].data();
        }
        const VkResult ir = fns_.vkGetPipelineExecutableInternalRepresentationsKHR(device_, &ei, &n, irs.data());
        std::fprintf(stderr, "nf4 pipeline representations %s: %u (%d)\n", module_name, n, static_cast<int>(ir));
        for (std::uint32_t i = 0; i < n; ++i) {
          std::fprintf(stderr, "== %s (%s), %zu bytes%s\n", irs[i].name, irs[i].description, irs[i].dataSize, irs[i].isText ? "" : ", binary");
          if (irs[i].isText) std::fprintf(stderr, "%s\n", data[i].data());
        }
      }
    }
  }
  return p;
}

VkPipeline Kernels::pipeline(nf4_dtype dtype, nf4_quant_type quant_type, bool nested) const {
  std::lock_guard lock(mutex_);
  const auto key = std::make_tuple(dtype, quant_type, nested);
  if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;
  const bool hw = dtype == NF4_DTYPE_F16 && f16_hw_;
  const TableStrategy strategy = tuning_.table[dtype];
  const bool table = strategy == TableStrategy::kTable || (strategy == TableStrategy::kAuto && !hw);
  const std::string name = module_name({dtype, quant_type, nested, table, hw && !table});
  VkPipeline p = make_pipeline(name.c_str(), layout_, tuning_.workgroup, tuning_.units, tuning_.nontemporal);
  pipelines_.emplace(key, p);
  return p;
}

namespace {

// A descriptor for a region: offset aligned down, the remainder returned in bytes.
struct Bound {
  VkDescriptorBufferInfo info;
  std::uint32_t residual;
};

}  // namespace

// A descriptor pool owned by `job` holding `count` sets of `layout`, each of `bindings` storage
// buffers; returns the sets.
std::vector<VkDescriptorSet> Kernels::allocate_sets(Job& job, VkDescriptorSetLayout layout, std::uint32_t bindings,
                                                    std::size_t count) const {
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, static_cast<std::uint32_t>(bindings * count)};
  VkDescriptorPoolCreateInfo pi{};
  pi.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
  pi.maxSets = static_cast<std::uint32_t>(count);
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &size;
  check(fns_.vkCreateDescriptorPool(device_, &pi, nullptr, &job.pool_), "vkCreateDescriptorPool");
  std::vector<VkDescriptorSetLayout> layouts(count, layout);
  std::vector<VkDescriptorSet> sets(count);
  VkDescriptorSetAllocateInfo ai{};
  ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
  ai.descriptorPool = job.pool_;
  ai.descriptorSetCount = static_cast<std::uint32_t>(count);
  ai.pSetLayouts = layouts.data();
  check(fns_.vkAllocateDescriptorSets(device_, &ai, sets.data()), "vkAllocateDescriptorSets");
  return sets;
}

std::unique_ptr<Job> Kernels::prepare(const std::vector<ChunkView>& chunks) const {
  std::unique_ptr<Job> job(new Job(this));
  if (chunks.empty()) return job;
  const auto bind = [&](const Region& r) {
    NF4_CHECK(r.buffer != VK_NULL_HANDLE);
    const VkDeviceSize desc = r.offset / align_ * align_;
    const VkDeviceSize residual = r.offset - desc;
    const VkDeviceSize range = round_up(residual + std::max<VkDeviceSize>(r.bytes, 4), 4);
    NF4_CHECK(range <= max_range_);
    return Bound{{r.buffer, desc, range}, static_cast<std::uint32_t>(residual)};
  };

  // Pipelines first (they may take a while to compile; never during record()).
  std::vector<VkPipeline> pipes;
  pipes.reserve(chunks.size());
  for (const ChunkView& c : chunks) pipes.push_back(pipeline(c.out_dtype, c.quant_type, c.nested));

  const std::vector<VkDescriptorSet> sets = allocate_sets(*job, set_layout_, kBindings, chunks.size());

  std::vector<VkDescriptorBufferInfo> infos(kBindings * chunks.size());
  std::vector<VkWriteDescriptorSet> writes(chunks.size());
  job->dispatches_.reserve(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const ChunkView& c = chunks[i];
    const Bound packed = bind(c.packed), absmax = bind(c.absmax), out = bind(c.out);
    // Bindings a variant does not read still get a valid descriptor (the packed codes).
    const Bound qmap = !uses_quant_map(c.quant_type) && !c.quant_map.buffer ? packed : bind(c.quant_map);
    const Bound nabs = c.nested ? bind(c.nested_absmax) : packed;
    const Bound code = c.nested ? bind(c.nested_code) : packed;
    const Bound offs = c.nested && c.offset.buffer ? bind(c.offset) : packed;
    NF4_CHECK(packed.residual % 4 == 0 && qmap.residual % 4 == 0 && nabs.residual % 4 == 0 && code.residual % 4 == 0);
    NF4_CHECK(offs.residual % 4 == 0 && out.residual % 16 == 0 && (c.nested || absmax.residual % 4 == 0));
    const Bound all[kBindings] = {packed, absmax, qmap, nabs, code, offs, out};
    for (std::uint32_t b = 0; b < kBindings; ++b) infos[i * kBindings + b] = all[b].info;
    VkWriteDescriptorSet& w = writes[i];
    w = VkWriteDescriptorSet{};
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = sets[i];
    w.dstBinding = 0;
    w.descriptorCount = kBindings;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[i * kBindings];

    std::uint32_t offset_bits;
    std::memcpy(&offset_bits, &c.offset_value, 4);
    const PushConstants pc{c.n,
                           packed.residual / 4,
                           c.nested ? absmax.residual : absmax.residual / 4,
                           qmap.residual / 4,
                           nabs.residual / 4,
                           code.residual / 4,
                           c.nested && c.offset.buffer ? offs.residual / 4 : kNoOffsetWord,
                           offset_bits,
                           c.block_rem,
                           out.residual / 16,
                           c.log2_bs,
                           c.log2_nbs};
    Job::Dispatch d{pipes[i], layout_, sets[i], {}, sizeof pc, c.groups};
    std::memcpy(d.constants.data(), &pc, sizeof pc);
    job->dispatches_.push_back(d);
  }
  fns_.vkUpdateDescriptorSets(device_, static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
  return job;
}

std::unique_ptr<Job> Kernels::prepare_copy(const std::vector<std::pair<Region, Region>>& src_dst) const {
  std::unique_ptr<Job> job(new Job(this));
  {
    std::lock_guard lock(mutex_);
    if (!copy_pipeline_) copy_pipeline_ = make_pipeline("copy", copy_layout_, tuning_.copy_workgroup, tuning_.copy_units);
  }
  // Split into dispatches that fit the storage range and the group count.
  const std::uint64_t per_group = std::uint64_t{tuning_.copy_workgroup} * tuning_.copy_units;
  const std::uint64_t max_vectors =
      std::min<std::uint64_t>((max_range_ - 2 * align_) / 16 / per_group, max_groups_) * per_group;
  struct Piece {
    Region src, dst;
    std::uint32_t vectors;
  };
  std::vector<Piece> pieces;
  for (const auto& [src, dst] : src_dst) {
    NF4_CHECK(src.bytes == dst.bytes && src.bytes % 16 == 0 && src.offset % 16 == 0 && dst.offset % 16 == 0);
    for (VkDeviceSize done = 0; done < src.bytes;) {
      const VkDeviceSize n = std::min<VkDeviceSize>(max_vectors, (src.bytes - done) / 16);
      pieces.push_back({{src.buffer, src.offset + done, n * 16}, {dst.buffer, dst.offset + done, n * 16}, static_cast<std::uint32_t>(n)});
      done += n * 16;
    }
  }
  if (pieces.empty()) return job;
  const std::vector<VkDescriptorSet> sets = allocate_sets(*job, copy_set_layout_, 2, pieces.size());
  std::vector<VkDescriptorBufferInfo> infos(2 * pieces.size());
  std::vector<VkWriteDescriptorSet> writes(pieces.size());
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    std::uint32_t res[2];
    const Region* r[2] = {&p.src, &p.dst};
    for (int k = 0; k < 2; ++k) {
      const VkDeviceSize desc = r[k]->offset / align_ * align_;
      res[k] = static_cast<std::uint32_t>(r[k]->offset - desc);
      infos[2 * i + k] = {r[k]->buffer, desc, res[k] + r[k]->bytes};
    }
    writes[i] = VkWriteDescriptorSet{};
    writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    writes[i].dstSet = sets[i];
    writes[i].descriptorCount = 2;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[2 * i];
    Job::Dispatch d{copy_pipeline_, copy_layout_, sets[i], {}, 12,
                    static_cast<std::uint32_t>((p.vectors + per_group - 1) / per_group)};
    d.constants[0] = p.vectors;
    d.constants[1] = res[0] / 16;
    d.constants[2] = res[1] / 16;
    job->dispatches_.push_back(d);
  }
  fns_.vkUpdateDescriptorSets(device_, static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
  return job;
}

std::unique_ptr<Job> Kernels::prepare_f16_check(const Region& result, std::uint32_t groups, std::uint32_t stride, nf4_dtype d) const {
  NF4_CHECK(result.buffer != VK_NULL_HANDLE && result.offset % align_ == 0 && result.bytes >= 16);
  NF4_CHECK(d == NF4_DTYPE_F16 || (d == NF4_DTYPE_BF16 && gemv_fast(NF4_DTYPE_BF16)));
  std::unique_ptr<Job> job(new Job(this));
  VkPipeline& pipeline = check_pipelines_[d == NF4_DTYPE_BF16 ? 1 : 0];
  {
    std::lock_guard lock(mutex_);
    if (!pipeline) pipeline = make_pipeline(d == NF4_DTYPE_BF16 ? "bf16_check:bf16" : "f16_check", check_layout_, 256, 1);
  }
  const VkDescriptorSet set = allocate_sets(*job, check_set_layout_, 1, 1)[0];
  const VkDescriptorBufferInfo info{result.buffer, result.offset, 16};
  VkWriteDescriptorSet w{};
  w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
  w.dstSet = set;
  w.descriptorCount = 1;
  w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  w.pBufferInfo = &info;
  fns_.vkUpdateDescriptorSets(device_, 1, &w, 0, nullptr);
  // As many dispatches as the group-count limit needs (65,535 is the minimum devices offer).
  for (std::uint32_t first = 0; first < groups;) {
    const std::uint32_t n = std::min(groups - first, std::min<std::uint32_t>(max_groups_, 65535));
    Job::Dispatch dispatch{pipeline, check_layout_, set, {}, 8, n};
    dispatch.constants[0] = first;
    dispatch.constants[1] = stride;
    job->dispatches_.push_back(dispatch);
    first += n;
  }
  return job;
}

Job::~Job() {
  if (pool_) k_->fns_.vkDestroyDescriptorPool(k_->device_, pool_, nullptr);
}

void Job::record(VkCommandBuffer cmd) const {
  const DeviceFns& f = k_->fns_;
  VkPipeline bound = VK_NULL_HANDLE;
  for (const Dispatch& d : dispatches_) {
    if (d.pipeline != bound) f.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline);
    bound = d.pipeline;
    f.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.layout, 0, 1, &d.set, 0, nullptr);
    f.vkCmdPushConstants(cmd, d.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d.constants_bytes, d.constants.data());
    f.vkCmdDispatch(cmd, d.groups, d.groups_y, 1);
  }
}

// ---- matrix-vector product -----------------------------------------------------------------
namespace {
struct GemvPush {
  std::uint32_t k, rows, row0, n, m, elem_rem, packed_off, absmax_off, qmap_off, nested_off, code_off, offset_word, offset_bits,
      block_rem, log2_bs, log2_nbs, x_off, y_off, pad_bits, flags, groups, zero;
};
static_assert(sizeof(GemvPush) == 88, "gemv.comp's push constants");
constexpr std::uint32_t kGemvBindings = 8;
// The most teams a workgroup holds (1024 invocations), hence the largest split.
constexpr std::uint32_t kGemvMaxSplit = 32;

// gemv.comp's launch shape. Rows of W per team at a time by MM (x rows held: 1, 2, 4, 8): each
// x load and conversion serves `rows` rows of W, each row costs 2 * MM accumulators (registers)
// and 16 bytes of codes in flight per lane. Defaults: the best measured on an H100 (Vulkan
// 1.4.312, bf16, docs/GEMV.md section 3): R = 2 beat 1, 3 and 4 at M = 1 and M = 2 (but for the
// size rule in prepare_gemv), and 4 at M = 4; 128 invocations beat 256 by 2-5% on k = 4096.
// NF4_VULKAN_GEMV_TUNE="r1=2,r2=2,r4=2,r8=2,wg=128,pair=0,shuf=5,split=0,waves=0,xs=0,ordered=0"
// (any subset) overrides it for sweeps: wg invocations per workgroup (teams of 32), pair copies
// of the 256-entry pair table (0: the 16-entry value table), shuf the most levels taken by
// subgroup shuffles (0: shared memory only), split the teams sharing a row group's chunks (0:
// choose_gemv_split's model; else that power of two, capped as it caps), waves the workgroups
// dispatched per SM (per device where the SM count is unknown; 0: one per slot of GROUPS row
// groups), each taking slots in turn, xs the most bytes of x staged in shared memory (where each
// workgroup takes at least two slots; 0: never), ordered the ordered prefetch of the CUDA kernel.
// pair, waves, xs and ordered lost on the H100 (docs/PERFORMANCE_LOG.md): they stay for other devices'
// sweeps, each run against the oracle by the tests.
struct GemvTune {
  std::uint32_t rows[4] = {2, 2, 2, 2};
  std::uint32_t wg = 128;
  std::uint32_t pair = 0;
  std::uint32_t shuf = 5;
  std::uint32_t split = 0;
  std::uint32_t waves = 0;
  std::uint32_t xs = 0;
  std::uint32_t ordered = 0;
  bool rows_set[4] = {};  // r<m> given: no size rule
};

GemvTune gemv_tune() {
  GemvTune t;
  const char* env = env_value(EnvVar::kVulkanGemvTune);
  if (!env || !*env) return t;
  for_each_setting("NF4_VULKAN_GEMV_TUNE", env, [&](const std::string& key, const std::string& value) {
    const std::uint32_t v = setting_u32("NF4_VULKAN_GEMV_TUNE", key, value);
    if (key.size() == 2 && key[0] == 'r' && (key[1] == '1' || key[1] == '2' || key[1] == '4' || key[1] == '8')) {
      const std::uint32_t mm = static_cast<std::uint32_t>(key[1] - '0');
      if (v < 1 || v * mm > 32) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: {} must be 1..{}, got {}", key, 32 / mm, v);
      t.rows[std::countr_zero(mm)] = v;
      t.rows_set[std::countr_zero(mm)] = true;
    } else if (key == "wg") {
      if (v < 32 || v > 1024 || !std::has_single_bit(v))
        fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: wg must be a power of two in [32, 1024], got {}", v);
      t.wg = v;
    } else if (key == "pair") {
      if (v > 32) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: pair must be 0..32, got {}", v);
      t.pair = v;
    } else if (key == "shuf") {
      if (v > 5) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: shuf must be 0..5, got {}", v);
      t.shuf = v;
    } else if (key == "split") {
      if (v > kGemvMaxSplit || (v != 0 && !std::has_single_bit(v)))
        fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: split must be 0 (automatic) or a power of two in [1, {}], got '{}'",
             kGemvMaxSplit, value);
      t.split = v;
    } else if (key == "waves") {
      if (v > 64) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: waves must be 0..64, got '{}'", value);
      t.waves = v;
    } else if (key == "ordered") {
      if (v > 1) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: ordered must be 0 or 1, got '{}'", value);
      t.ordered = v;
    } else if (key == "xs") {
      if (v > 65536) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: xs must be 0..65536 bytes, got '{}'", value);
      t.xs = v;
    } else {
      fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_GEMV_TUNE: unknown key '{}'", key);
    }
  });
  return t;
}

// gemv.comp's specialization constants, by constant_id.
enum GemvSpec : std::uint32_t { kSpecWg, kSpecMm, kSpecRows, kSpecXd, kSpecVec, kSpecShuf, kSpecPair, kSpecDepth, kSpecSplit, kSpecXs, kSpecOrdered, kSpecCount };

}  // namespace

std::uint32_t choose_gemv_split(std::int64_t groups, std::int64_t chunks, std::uint32_t teams, std::int64_t resident_teams,
                                std::uint32_t forced) {
  return static_cast<std::uint32_t>(
      gemv_split(groups, chunks, teams, resident_teams, static_cast<int>(forced), static_cast<int>(kGemvMaxSplit)));
}

namespace {
// Shared memory gemv.comp declares for a specialization (its `shared` arrays, in bytes).
std::uint64_t gemv_shared_bytes(const std::vector<std::uint32_t>& c) {
  const std::uint64_t teams = c[kSpecWg] / 32, rm = std::uint64_t{c[kSpecRows]} * c[kSpecMm], g = 32u >> c[kSpecShuf];
  return 16 * 4 + (256ull * c[kSpecPair] + 1) * 8 + 256 * 4 + (g == 1 ? 1 : 2 * teams * rm * g) * 4 +
         teams * rm * c[kSpecDepth] * 4 + teams * rm * 4 + std::max<std::uint64_t>(c[kSpecXs], 1) * 16;
}
}  // namespace

namespace {
// gemv_coop.comp's specialization constants, by constant_id.
// kCsNontemporal is no constant of the shader: make_pipeline marks the codes' loads in the SPIR-V.
enum CoopSpec : std::uint32_t {
  kCsWg, kCsParts, kCsTm, kCsTn, kCsTk, kCsTt, kCsKc, kCsVec, kCsXd, kCsSg, kCsSplit,
  kCsXvec, kCsHwf16, kCsDiag, kCsAhead, kCsPairLut, kCsHwbf16, kCsNontemporal, kCsCount
};
// Subgroups per workgroup and ranges of K: fixed, since the ranges are part of the fast contract's
// K order on this backend (gemv_coop.comp). The shader's bounds: token tiles per workgroup, and
// per invocation and stage 32-weight units of W and 16-byte vectors of x.
constexpr std::uint32_t kCoopParts = 4, kCoopMaxTokenTiles = 4, kCoopMaxUnits = 2, kCoopMaxXVectors = 4;

// The schedule of gemv_coop.comp by m (NF4_VULKAN_COOP_TUNE overrides, for measurements): up to
// `small` tokens the subgroups split K (SPLIT: 16 rows and up to `stt` token tiles per workgroup,
// kc columns a stage); past it each subgroup owns 16 rows over all of K and the four share x's
// tile of up to `btt` token tiles, bkc columns a stage (x read once per 64 rows), fewer where the
// workgroups would not cover the device's SMs (unless btt is set). Operands are
// loaded `ahead` stages before they are decoded (1 or 2). `lut` = 1 looks the values up per code
// byte (a table of pairs). `nt` = 1 marks the codes' loads nontemporal. `diag` switches parts of
// the shader off (wrong results: time only). The defaults are the fastest of the H100's sweep
// (docs/PERFORMANCE_LOG.md, "The Vulkan fast product: the decode, the schedules and the barriers
// reworked").
struct CoopTune {
  std::uint32_t small = 16, kc = 64, stt = 1, bkc = 64, btt = 4, diag = 0, nt = 0, ahead = 1, lut = 0;
  bool btt_set = false;
};

CoopTune coop_tune() {
  CoopTune t;
  const char* env = env_value(EnvVar::kVulkanCoopTune);
  if (!env || !*env) return t;
  for_each_setting("NF4_VULKAN_COOP_TUNE", env, [&](const std::string& key, const std::string& value) {
    const std::uint32_t v = setting_u32("NF4_VULKAN_COOP_TUNE", key, value);
    const auto in = [&](std::uint32_t lo, std::uint32_t hi) {
      if (v < lo || v > hi) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_COOP_TUNE: {} must be {}..{}, got {}", key, lo, hi, v);
      return v;
    };
    if (key == "small") {
      t.small = in(0, 256);
    } else if (key == "kc" || key == "bkc") {
      if (v != 32 && v != 64 && v != 128) fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_COOP_TUNE: {} must be 32, 64 or 128, got {}", key, v);
      (key == "kc" ? t.kc : t.bkc) = v;
    } else if (key == "ahead") {
      t.ahead = in(1, 2);
    } else if (key == "lut") {
      t.lut = in(0, 1);
    } else if (key == "nt") {
      t.nt = in(0, 1);
    } else if (key == "diag") {
      t.diag = in(0, 15);
    } else if (key == "btt" || key == "stt") {
      (key == "btt" ? t.btt : t.stt) = in(1, kCoopMaxTokenTiles);
      t.btt_set |= key == "btt";
    } else {
      fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_COOP_TUNE: unknown key '{}'", key);
    }
  });
  return t;
}

// Rows of W per workgroup of a specialization.
std::uint32_t coop_rows(const std::vector<std::uint32_t>& c) { return c[kCsTm] * (c[kCsSplit] ? 1u : c[kCsParts]); }

// Shared memory gemv_coop.comp declares for a specialization (its `shared` arrays, in bytes).
std::uint64_t coop_shared_bytes(const std::vector<std::uint32_t>& c) {
  const std::uint64_t parts = c[kCsParts], tokens = std::uint64_t{c[kCsTt]} * c[kCsTn];
  const std::uint64_t sw = c[kCsKc] / 8 + 1;  // uvec4 per row
  const std::uint64_t rows = parts * c[kCsTm] + (c[kCsSplit] ? parts : 1) * tokens;
  return 16 * 4 + (c[kCsPairLut] ? 256 * 8 : 8) + 256 * 4 + rows * sw * 16 + parts * c[kCsTm] * c[kCsTn] * 4;
}

std::size_t coop_slot(nf4_dtype x) { return x == NF4_DTYPE_BF16 ? 1 : 0; }

// The cooperative-matrix shader runs only where asked for (NF4_VULKAN_COOP=1, a development knob):
// on the one device measured (H100, NVIDIA's driver) it reaches 30-48% of CUDA's fast-mode
// throughput, slower than dense bf16 and, at one row, than the exact shader it would replace
// (docs/PERFORMANCE_LOG.md). The fast contract cannot switch shaders by m (a row's bits would then
// depend on its batch), so a fast-mode request runs the exact shader and reports the exact contract
// until the shader pays at every m.
bool coop_requested() {
  static const bool on = [] {
    const char* v = env_value(EnvVar::kVulkanCoop);
    if (!v || !*v || std::strcmp(v, "0") == 0) return false;
    if (std::strcmp(v, "1") == 0) return true;
    fail(NF4_ERR_INVALID_ARGUMENT, "NF4_VULKAN_COOP='{}': expected 0 or 1", v);
  }();
  return on;
}
}  // namespace

bool Kernels::gemv_fast(nf4_dtype x) const {
  if (!coop_ || !find_module("gemv_coop") || (x != NF4_DTYPE_F16 && x != NF4_DTYPE_BF16) || !coop_requested()) return false;
  // Below Vulkan 1.3 a cooperative-matrix pipeline must ask for full subgroups (an extension and a
  // feature more for the application to enable); from 1.3 the shader's SPIR-V 1.5 needs nothing more.
  if (info_.api_version < VK_API_VERSION_1_3) return false;
  if (x == NF4_DTYPE_BF16 && !info_.coop_bf16) return false;
  return info_.coop && info_.coop_shape[coop_slot(x)].m != 0 &&
         std::uint64_t{kCoopParts} * info_.subgroup_size <= info_.props.limits.maxComputeWorkGroupInvocations;
}

std::string Kernels::gemv_fast_status(nf4_dtype x) const {
  if (gemv_fast(x)) {
    const DeviceInfo::CoopShape s = info_.coop_shape[coop_slot(x)];
    return fmt::format("cooperative matrices {}x{}x{}", s.m, s.n, s.k);
  }
  if (!find_module("gemv_coop")) return "the cooperative-matrix shader was not built (no glslang with GL_KHR_cooperative_matrix)";
  if (x != NF4_DTYPE_F16 && x != NF4_DTYPE_BF16) return "the fast contract takes fp16 or bf16 x";
  if (!info_.coop) return "the device lacks VK_KHR_cooperative_matrix, vulkanMemoryModel (with its Device scope) or shaderFloat16";
  if (info_.api_version < VK_API_VERSION_1_3) return "the cooperative-matrix shader needs a Vulkan 1.3 instance and device";
  if (x == NF4_DTYPE_BF16 && !info_.coop_bf16) return "the device lacks VK_KHR_shader_bfloat16's cooperative matrices";
  if (info_.coop_shape[coop_slot(x)].m == 0)
    return fmt::format("the device lists no usable matrix shape for this dtype (it lists: {})", info_.coop_listing.empty() ? "none" : info_.coop_listing);
  if (!coop_requested())
    return "the cooperative-matrix shader is slower than the exact shader at one row on the devices measured; NF4_VULKAN_COOP=1 runs it";
  if (!coop_) return "the device was not created with the cooperative-matrix features";
  return "the device's subgroups are too large for the shader's workgroup";
}

std::unique_ptr<Job> Kernels::prepare_gemv(const GemvView& g) const {
  const DeviceTensor& t = g.weight;
  const std::int64_t xs = static_cast<std::int64_t>(nf4_dtype_size(g.x_dtype)), ys = static_cast<std::int64_t>(nf4_dtype_size(g.y_dtype));
  // Local element indices (from a block boundary at or before a dispatch's first row) stay below 2^31.
  if (g.k > (std::int64_t{1} << 31) - 2 * t.blocksize)
    fail(NF4_ERR_UNSUPPORTED, "gemv: the vulkan backend takes k <= 2^31 - 2 * blocksize, got {}", g.k);
  if (static_cast<std::uint64_t>(g.m * g.k * xs) + 2 * align_ > max_range_ ||
      static_cast<std::uint64_t>(g.m * g.n * ys) + 2 * align_ > max_range_ || g.m * g.n >= (std::int64_t{1} << 32))
    fail(NF4_ERR_UNSUPPORTED, "gemv: x ({} bytes) and y ({} bytes) must each fit one storage-buffer range ({} bytes) on this device",
         g.m * g.k * xs, g.m * g.n * ys, max_range_);
  {
    std::lock_guard lock(mutex_);
    if (!gemv_layout_) {
      std::vector<VkDescriptorSetLayoutBinding> b(kGemvBindings);
      for (std::uint32_t i = 0; i < kGemvBindings; ++i) b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
      VkDescriptorSetLayoutCreateInfo si{};
      si.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
      si.bindingCount = kGemvBindings;
      si.pBindings = b.data();
      check(fns_.vkCreateDescriptorSetLayout(device_, &si, nullptr, &gemv_set_layout_), "vkCreateDescriptorSetLayout");
      VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(GemvPush)};
      VkPipelineLayoutCreateInfo li{};
      li.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
      li.setLayoutCount = 1;
      li.pSetLayouts = &gemv_set_layout_;
      li.pushConstantRangeCount = 1;
      li.pPushConstantRanges = &range;
      check(fns_.vkCreatePipelineLayout(device_, &li, nullptr, &gemv_layout_), "vkCreatePipelineLayout");
    }
  }
  const GemvTune tune = gemv_tune();
  const VkPhysicalDeviceLimits& lim = info_.props.limits;
  // The chunk stack holds levels 0..log2(chunks padded to a power of two): 8 levels up to 128
  // chunks (k <= 131072), else the most k < 2^31 needs.
  const std::int64_t chunks = ceil_div(g.k, std::int64_t{1024});
  const std::uint32_t depth = std::bit_width(std::bit_ceil(static_cast<std::uint64_t>(chunks))) <= 8 ? 8u : 22u;
  // The specialization for a dispatch whose codes and x start `packed_res` and `x_res` bytes
  // into their descriptors: the vector path needs k % 32 == 0 and 16-byte aligned starts (then
  // every lane's 32 codes and 8-element x groups are aligned 16-byte vectors).
  // Rows of W per workgroup slot: row groups (teams / split) times rows per team.
  const auto group_rows_of = [](const std::vector<std::uint32_t>& c) {
    return std::int64_t{c[kSpecWg] / 32 / c[kSpecSplit]} * c[kSpecRows];
  };
  // Workgroups dispatched for `slots` slots: waves per SM (per device where the SM count is not
  // known), each workgroup then taking slots in turn; without waves one per slot.
  const auto dispatched = [&](std::int64_t slots) {
    const std::int64_t units = info_.sm_count > 0 ? std::int64_t{info_.sm_count} : 1;
    return tune.waves > 0 ? std::min(slots, std::int64_t{tune.waves} * units) : slots;
  };
  const auto variant = [&](std::uint32_t packed_res, std::uint32_t x_res) {
    const bool vec = g.k % 32 == 0 && packed_res % 16 == 0 && x_res % 16 == 0;
    const std::uint32_t mm = vec ? std::bit_ceil(static_cast<std::uint32_t>(g.m)) : 8u;
    std::vector<std::uint32_t> c(kSpecCount);
    c[kSpecMm] = mm;
    c[kSpecRows] = vec ? tune.rows[std::countr_zero(mm)] : 1u;
    // One x row and at least 2^27 weights: four rows per team (H100: 3-7% faster at 28672x8192
    // and 8192x28672, 0-5% slower at 4096x14336 and below).
    if (vec && mm == 1 && !tune.rows_set[0] && g.n * g.k >= (std::int64_t{1} << 27)) c[kSpecRows] = 4;
    c[kSpecXd] = vec ? static_cast<std::uint32_t>(g.x_dtype) : static_cast<std::uint32_t>(std::size(kDtypes));  // no row: read the flags
    c[kSpecVec] = vec ? 1u : 0u;
    c[kSpecPair] = tune.pair;
    c[kSpecDepth] = depth;
    c[kSpecOrdered] = tune.ordered;
    std::uint32_t wg = std::min({tune.wg, std::bit_floor(lim.maxComputeWorkGroupSize[0]), std::bit_floor(lim.maxComputeWorkGroupInvocations)});
    // Shuffles need whole subgroups of a power-of-two size (then the subgroup-major numbering
    // of the shader is a permutation of the workgroup and a team lies in one subgroup or spans
    // whole ones).
    const std::uint32_t sg = info_.subgroup_size;
    const bool shuffle = info_.subgroup_shuffle && sg >= 2 && std::has_single_bit(sg) && sg <= wg;
    c[kSpecShuf] = shuffle ? std::min<std::uint32_t>({tune.shuf, 5u, static_cast<std::uint32_t>(std::countr_zero(sg))}) : 0u;
    c[kSpecWg] = wg;
    while (gemv_shared_bytes(c) > lim.maxComputeSharedMemorySize && c[kSpecPair] > 1) c[kSpecPair] /= 2;
    while (gemv_shared_bytes(c) > lim.maxComputeSharedMemorySize && c[kSpecWg] > 32 && c[kSpecWg] / 2 >= std::min(sg, wg)) c[kSpecWg] /= 2;
    while (gemv_shared_bytes(c) > lim.maxComputeSharedMemorySize && c[kSpecRows] > 1) c[kSpecRows] /= 2;
    if (gemv_shared_bytes(c) > lim.maxComputeSharedMemorySize)
      fail(NF4_ERR_UNSUPPORTED, "gemv: {} bytes of shared memory needed, the device has {}", gemv_shared_bytes(c), lim.maxComputeSharedMemorySize);
    // The split: by the whole product's row groups (so every dispatch of it takes the same).
    c[kSpecSplit] = choose_gemv_split(ceil_div(g.n, std::int64_t{c[kSpecRows]}), chunks, c[kSpecWg] / 32, gemv_resident_teams_, tune.split);
    NF4_CHECK(c[kSpecSplit] <= c[kSpecWg] / 32 && c[kSpecSplit] <= gemv_padded_chunks(chunks));
    // x staged in shared memory (vector path): each workgroup copies all of x once, which pays
    // where it then takes two slots or more and the copy fits tune.xs and the device.
    const std::uint64_t units = std::uint64_t{static_cast<std::uint32_t>(g.m)} * static_cast<std::uint64_t>(chunks) *
                                2u * dtype_size(g.x_dtype) * 32u;
    const std::int64_t slots = ceil_div(g.n, group_rows_of(c));
    if (vec && units * 16 <= tune.xs && slots >= 2 * dispatched(slots)) {
      std::vector<std::uint32_t> staged = c;
      staged[kSpecXs] = static_cast<std::uint32_t>(units);  // <= 4096: tune.xs is at most 64 KiB
      if (gemv_shared_bytes(staged) <= lim.maxComputeSharedMemorySize) c = staged;
    }
    return c;
  };
  const auto pipeline_for = [&](const std::vector<std::uint32_t>& c) {
    std::lock_guard lock(mutex_);
    auto it = gemv_pipelines_.find(c);
    if (it == gemv_pipelines_.end()) it = gemv_pipelines_.emplace(c, make_pipeline("gemv", gemv_layout_, c[kSpecWg], 1, 0, &c)).first;
    return it->second;
  };
  const auto bind = [&](const Region& r) {
    NF4_CHECK(r.buffer != VK_NULL_HANDLE);
    const VkDeviceSize desc = r.offset / align_ * align_;
    const VkDeviceSize residual = r.offset - desc;
    const VkDeviceSize range = round_up(residual + std::max<VkDeviceSize>(r.bytes, 4), 4);
    NF4_CHECK(range <= max_range_ && residual % 4 == 0);
    return std::make_pair(VkDescriptorBufferInfo{r.buffer, desc, range}, static_cast<std::uint32_t>(residual));
  };
  // Rows per dispatch: local element indices below 2^31, every binding within the range limit,
  // the workgroup count within the device's.
  const std::int64_t bs = t.blocksize, nbs = t.nested ? t.nested_blocksize : 1;
  const std::int64_t absmax_es = t.nested ? 1 : 4;
  const std::int64_t by_index = ((std::int64_t{1} << 31) - 2 * bs) / g.k;
  const std::int64_t by_range = (static_cast<std::int64_t>(max_range_) - 4 * static_cast<std::int64_t>(align_) - 8 * bs) / (g.k * 4 / bs + g.k / 2 + 1);
  if (by_range < 1)
    fail(NF4_ERR_UNSUPPORTED, "gemv: one row of W (k = {}) does not fit this device's storage-buffer range ({} bytes)", g.k, max_range_);
  // Workgroups within the device's count: at the fewest rows per workgroup of either path.
  // Pieces of an even number of rows, so that a pair of 16-bit outputs never straddles two
  // dispatches.
  const bool fast = g.mode == NF4_GEMV_FAST;
  NF4_CHECK(fast ? gemv_fast(g.x_dtype) : g.m <= kGemvExactRows);
  const auto coop_variant = [&](std::uint32_t packed_res, std::uint32_t x_res) {
    const DeviceInfo::CoopShape sh = info_.coop_shape[coop_slot(g.x_dtype)];
    const CoopTune tune_c = coop_tune();
    std::vector<std::uint32_t> c(kCsCount);
    c[kCsParts] = kCoopParts;
    c[kCsSg] = info_.subgroup_size;
    c[kCsWg] = kCoopParts * info_.subgroup_size;
    c[kCsTm] = sh.m;
    c[kCsTn] = sh.n;
    c[kCsTk] = sh.k;
    const std::int64_t tiles = ceil_div(std::int64_t{g.m}, std::int64_t{sh.n});
    c[kCsSplit] = g.m <= static_cast<std::int32_t>(tune_c.small) ? 1u : 0u;
    c[kCsTt] = static_cast<std::uint32_t>(std::min<std::int64_t>(c[kCsSplit] ? tune_c.stt : tune_c.btt, tiles));
    // The rows schedule: while its workgroups would leave SMs without one, fewer token tiles per
    // workgroup (W decoded once per token group instead of once, but on every SM). H100, 64
    // tokens: 8192x28672 (128 row groups) 636 us with 2 tiles against 776 with 4; 14336x4096 (224
    // row groups) 4 tiles faster, 113 against 196 (docs/PERFORMANCE_LOG.md, "The Vulkan fast
    // product: the decode, the schedules and the barriers reworked"). The tiles change nothing in
    // the sum.
    if (!c[kCsSplit] && !tune_c.btt_set && info_.sm_count > 0) {
      const std::int64_t row_groups = ceil_div(g.n, std::int64_t{coop_rows(c)});
      while (c[kCsTt] > 1 && row_groups * ceil_div(tiles, std::int64_t{c[kCsTt]}) < std::int64_t{info_.sm_count}) c[kCsTt] = (c[kCsTt] + 1) / 2;
    }
    c[kCsKc] = c[kCsSplit] ? tune_c.kc : tune_c.bkc;
    c[kCsVec] = g.k % 32 == 0 && packed_res % 16 == 0 ? 1u : 0u;
    c[kCsXd] = static_cast<std::uint32_t>(g.x_dtype);
    c[kCsXvec] = g.k % 8 == 0 && x_res % 16 == 0 ? 1u : 0u;
    c[kCsHwf16] = g.x_dtype == NF4_DTYPE_F16 && f16_hw_ ? 1u : 0u;
    c[kCsHwbf16] = g.x_dtype == NF4_DTYPE_BF16 && bf16_hw_ ? 1u : 0u;
    c[kCsDiag] = tune_c.diag;
    c[kCsAhead] = tune_c.ahead;
    c[kCsPairLut] = tune_c.lut;
    c[kCsNontemporal] = tune_c.nt;
    // The shader's operands in flight: at most kCoopMaxUnits units of W and kCoopMaxXVectors
    // vectors of x per invocation and stage.
    const auto fits_registers = [&] {
      const std::uint32_t units = c[kCsTm] * (c[kCsKc] / 32), xvecs = c[kCsTt] * c[kCsTn] * (c[kCsKc] / 8);
      const std::uint32_t xt = c[kCsSplit] ? c[kCsSg] : c[kCsWg];
      return ceil_div(units, c[kCsSg]) <= kCoopMaxUnits && ceil_div(xvecs, xt) <= kCoopMaxXVectors;
    };
    while ((coop_shared_bytes(c) > lim.maxComputeSharedMemorySize || !fits_registers()) && c[kCsKc] > 32) c[kCsKc] /= 2;
    while ((coop_shared_bytes(c) > lim.maxComputeSharedMemorySize || !fits_registers()) && c[kCsTt] > 1) --c[kCsTt];
    if (coop_shared_bytes(c) > lim.maxComputeSharedMemorySize || !fits_registers())
      fail(NF4_ERR_UNSUPPORTED, "gemv: no cooperative-matrix schedule fits ({} bytes of shared memory needed, the device has {})",
           coop_shared_bytes(c), lim.maxComputeSharedMemorySize);
    return c;
  };
  const auto coop_pipeline_for = [&](const std::vector<std::uint32_t>& c) {
    std::lock_guard lock(mutex_);
    auto it = coop_pipelines_.find(c);
    if (it == coop_pipelines_.end())
      it = coop_pipelines_
               .emplace(c, make_pipeline(g.x_dtype == NF4_DTYPE_BF16 ? "gemv_coop:bf16" : "gemv_coop", gemv_layout_, c[kCsWg], 1,
                                         c[kCsNontemporal], &c))
               .first;
    return it->second;
  };
  const std::int64_t min_group_rows = fast ? std::int64_t{coop_rows(coop_variant(0, 0))} : std::min(group_rows_of(variant(0, 0)), group_rows_of(variant(1, 1)));
  std::int64_t per = std::min({by_index, by_range, std::int64_t{max_groups_} * min_group_rows});
  if (per > 1) per -= per % 2;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;  // (first row, rows)
  for (std::int64_t r = 0; r < g.n; r += per) pieces.emplace_back(r, std::min(per, g.n - r));

  std::unique_ptr<Job> job(new Job(this));
  const std::vector<VkDescriptorSet> sets = allocate_sets(*job, gemv_set_layout_, kGemvBindings, pieces.size());
  std::vector<VkDescriptorBufferInfo> infos(kGemvBindings * pieces.size());
  std::vector<VkWriteDescriptorSet> writes(pieces.size());
  // gemv.comp's flags; the shader looks the quant type up in the generated kQuantTypes mask.
  static_assert(std::size(kDtypes) <= 4, "gemv.comp's flags hold x's and y's dtype in 2 bits each");
  const std::uint32_t flags = (t.nested ? 1u : 0u) | (static_cast<std::uint32_t>(g.x_dtype) << 2) | (static_cast<std::uint32_t>(g.y_dtype) << 4) |
                              (static_cast<std::uint32_t>(t.quant_type) << 8);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const auto [r0, rows] = pieces[i];
    const std::int64_t e0 = r0 * g.k, eb = e0 - e0 % bs, e_end = (r0 + rows) * g.k;
    const std::int64_t first_block = eb / bs, last_block = (e_end - 1) / bs;
    const auto packed = bind({t.packed.buffer, t.packed.offset + static_cast<VkDeviceSize>(eb / 2), static_cast<VkDeviceSize>(ceil_div(e_end, 2) - eb / 2)});
    // From the word holding the first block's entry to the word holding the last one's.
    const std::int64_t absmax_start = first_block * absmax_es / 4 * 4, absmax_end = ((last_block + 1) * absmax_es + 3) / 4 * 4;
    const auto absmax = bind({t.absmax.buffer, t.absmax.offset + static_cast<VkDeviceSize>(absmax_start),
                              static_cast<VkDeviceSize>(absmax_end - absmax_start)});
    const std::uint32_t absmax_extra = static_cast<std::uint32_t>(first_block * absmax_es % 4);  // nested: byte within the word
    const auto packed_info = packed;
    const auto qmap = t.quant_map.buffer ? bind({t.quant_map.buffer, t.quant_map.offset, 64}) : packed_info;
    auto nabs = packed_info, code = packed_info, offs = packed_info;
    std::uint32_t block_rem = 0;
    if (t.nested) {
      const std::int64_t nfirst = first_block / nbs, nlast = last_block / nbs;
      nabs = bind({t.nested_absmax.buffer, t.nested_absmax.offset + static_cast<VkDeviceSize>(nfirst * 4),
                   static_cast<VkDeviceSize>((nlast - nfirst + 1) * 4)});
      code = bind({t.nested_code.buffer, t.nested_code.offset, 1024});
      if (t.offset.buffer) offs = bind({t.offset.buffer, t.offset.offset, 4});
      block_rem = static_cast<std::uint32_t>(first_block % nbs);
    }
    const auto x = bind(g.x);
    const auto y = bind(g.y);
    const std::pair<VkDescriptorBufferInfo, std::uint32_t> all[kGemvBindings] = {packed, absmax, qmap, nabs, code, offs, x, y};
    for (std::uint32_t b = 0; b < kGemvBindings; ++b) infos[i * kGemvBindings + b] = all[b].first;
    VkWriteDescriptorSet& w = writes[i];
    w = VkWriteDescriptorSet{};
    w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
    w.dstSet = sets[i];
    w.descriptorCount = kGemvBindings;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = &infos[i * kGemvBindings];
    std::uint32_t offset_bits;
    std::memcpy(&offset_bits, &t.nested_offset, 4);
    GemvPush pc{static_cast<std::uint32_t>(g.k),
                static_cast<std::uint32_t>(rows),
                static_cast<std::uint32_t>(r0),
                static_cast<std::uint32_t>(g.n),
                static_cast<std::uint32_t>(g.m),
                static_cast<std::uint32_t>(e0 - eb),
                packed.second / 4,
                t.nested ? absmax.second + absmax_extra : absmax.second / 4,
                qmap.second / 4,
                nabs.second / 4,
                code.second / 4,
                t.nested && t.offset.buffer ? offs.second / 4 : kNoOffsetWord,
                offset_bits,
                block_rem,
                static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(bs))),
                static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(nbs))),
                x.second / 4,
                y.second / 4,
                gemv_pad_bits(g.k),
                flags,
                0,
                0};
    Job::Dispatch d{};
    if (fast) {
      const std::vector<std::uint32_t> c = coop_variant(packed.second, x.second);
      const std::int64_t slots = ceil_div(rows, std::int64_t{coop_rows(c)});
      pc.groups = static_cast<std::uint32_t>(slots);
      const std::int64_t tokens = std::int64_t{c[kCsTt]} * c[kCsTn];
      d = Job::Dispatch{coop_pipeline_for(c), gemv_layout_, sets[i], {}, sizeof pc, static_cast<std::uint32_t>(slots),
                        static_cast<std::uint32_t>(ceil_div(std::int64_t{g.m}, tokens))};
    } else {
      const std::vector<std::uint32_t> c = variant(packed.second, x.second);
      const std::int64_t slots = ceil_div(rows, group_rows_of(c));
      pc.groups = static_cast<std::uint32_t>(slots);
      d = Job::Dispatch{pipeline_for(c), gemv_layout_, sets[i], {}, sizeof pc, static_cast<std::uint32_t>(dispatched(slots))};
    }
    std::memcpy(d.constants.data(), &pc, sizeof pc);
    job->dispatches_.push_back(d);
  }
  fns_.vkUpdateDescriptorSets(device_, static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
  return job;
}

// ---- device tensors ------------------------------------------------------------------------
std::vector<ChunkView> chunk_views(const DeviceTensor& t, const Plan& plan, std::size_t tensor_index) {
  std::vector<ChunkView> views;
  const std::int64_t bs = t.blocksize, nbs = t.nested ? t.nested_blocksize : 1;
  const std::int64_t es = static_cast<std::int64_t>(nf4_dtype_size(t.out_dtype));
  for (const Dispatch& d : plan.dispatches)
    for (const Chunk& c : d.chunks) {
      if (c.tensor != tensor_index) continue;
      NF4_CHECK(c.first_element % bs == 0 && c.element_count <= (std::int64_t{1} << 31));
      const std::int64_t first_block = c.first_element / bs;
      const std::int64_t blocks = ceil_div(c.element_count, bs);
      ChunkView v;
      v.out_dtype = t.out_dtype;
      v.quant_type = t.quant_type;
      v.nested = t.nested;
      v.n = static_cast<std::uint32_t>(c.element_count);
      v.log2_bs = static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(bs)));
      v.log2_nbs = static_cast<std::uint32_t>(std::countr_zero(static_cast<std::uint64_t>(nbs)));
      v.packed = {t.packed.buffer, t.packed.offset + static_cast<VkDeviceSize>(c.first_element / 2),
                  static_cast<VkDeviceSize>(ceil_div(c.element_count, 2))};
      const std::int64_t absmax_es = t.nested ? 1 : 4;
      v.absmax = {t.absmax.buffer, t.absmax.offset + static_cast<VkDeviceSize>(first_block * absmax_es),
                  static_cast<VkDeviceSize>(blocks * absmax_es)};
      v.quant_map = t.quant_map.buffer ? Region{t.quant_map.buffer, t.quant_map.offset, 64} : Region{};
      if (t.nested) {
        const std::int64_t nfirst = first_block / nbs, nlast = (first_block + blocks - 1) / nbs;
        v.nested_absmax = {t.nested_absmax.buffer, t.nested_absmax.offset + static_cast<VkDeviceSize>(nfirst * 4),
                           static_cast<VkDeviceSize>((nlast - nfirst + 1) * 4)};
        v.block_rem = static_cast<std::uint32_t>(first_block % nbs);
        v.nested_code = {t.nested_code.buffer, t.nested_code.offset, 1024};
        v.offset = t.offset.buffer ? Region{t.offset.buffer, t.offset.offset, 4} : Region{};
        v.offset_value = t.nested_offset;
      }
      v.out = {t.out.buffer, t.out.offset + static_cast<VkDeviceSize>(c.first_element * es),
               static_cast<VkDeviceSize>(c.element_count * es)};
      v.groups = static_cast<std::uint32_t>(c.groups);
      views.push_back(v);
    }
  return views;
}

}  // namespace nf4::vk
