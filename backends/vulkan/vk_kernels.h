// SPDX-License-Identifier: MIT
// The Vulkan kernels of one VkDevice: pipelines (made once, lazily per variant), the tuning table,
// and the translation of the dispatch plan (core/plan.h) into descriptor sets and push constants.
// Shared by the standalone backend (vulkan_backend.cpp) and the embedding API (nf4_vulkan.h).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/vulkan/vk_coop.h"
#include "backends/vulkan/vk_loader.h"
#include "core/plan.h"
#include "core/types.h"
#include "nf4/nf4.h"

namespace nf4::vk {

// What nf4 needs to know about a physical device.
struct DeviceInfo {
  VkPhysicalDeviceProperties props{};
  std::uint32_t api_version = 0;  // usable core version: min(instance's, device's)
  std::uint32_t subgroup_size = 0;
  bool subgroup_shuffle = false;  // VK_SUBGROUP_FEATURE_SHUFFLE_BIT in compute shaders (gemv.comp)
  // VkPhysicalDeviceShaderSMBuiltinsPropertiesNV where the device lists VK_NV_shader_sm_builtins
  // (queried, not enabled), else 0: the warps the device keeps resident, for gemv.comp's split.
  std::uint32_t sm_count = 0;
  std::uint32_t warps_per_sm = 0;
  // Float controls (Vulkan 1.2 core): when supported, the shaders are patched to ask for IEEE
  // denormals, signed zeros/inf/NaN and round-to-nearest-even, so subnormal absmax values give
  // the oracle's bits too. Without them a device may flush fp32 subnormals (as bitsandbytes does).
  bool denorm_preserve32 = false;
  bool signed_zero_inf_nan32 = false;
  bool rounding_rte32 = false;
  std::string float_controls;  // what the device reported, for messages
  // The fast product on cooperative matrices (shaders/gemv_coop.comp): per x dtype (fp16, bf16),
  // the shape (M x N x K) the device lists for it with fp32 accumulation at subgroup scope, 0 where
  // none (choose_coop_shape); `coop` whether the device offers everything the shader declares
  // (VK_KHR_cooperative_matrix, vulkanMemoryModel with its Device scope, shaderFloat16, a
  // power-of-two subgroup size; bf16 also VK_KHR_shader_bfloat16 with its type and matrix
  // features, `coop_bf16`).
  struct CoopShape {
    std::uint32_t m = 0, n = 0, k = 0;
  };
  std::array<CoopShape, 2> coop_shape{};
  bool coop = false;
  bool coop_bf16 = false;
  std::string coop_listing;  // the listed shapes, for messages ("f16 16x16x16, bf16 16x8x16")
  std::array<std::uint8_t, 16> device_uuid{};  // VkPhysicalDeviceIDProperties (Vulkan 1.1): with
                                               // props.driverVersion, the key of the rounding verdicts
  std::string name() const { return props.deviceName; }
  std::string describe() const;  // "NVIDIA H100 (Vulkan 1.3.x, discrete GPU)"
};

DeviceInfo query_device(const InstanceFns& fns, VkPhysicalDevice pd, std::uint32_t instance_api_version);

// The device extensions and features the fast product needs on `info`'s device, chained for
// vkCreateDevice (the standalone backend enables them where the device offers them). Empty
// where the device lacks any of them.
struct CoopEnable {
  std::vector<const char*> extensions;
  VkPhysicalDeviceVulkan12Features v12{};  // vulkanMemoryModel and its Device scope, shaderFloat16
  CoopMatrixFeatures coop{};
  Bfloat16Features bf16{};
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR stats{};  // NF4_VULKAN_PIPELINE_STATS=1 only
  void* chain = nullptr;  // the head of the pNext chain (into this object: never copy it after)
};
void coop_enable(const DeviceInfo& info, CoopEnable& out);

// SPIR-V: the 16-bit float type retyped to bfloat16 (SPV_KHR_bfloat16), Float16 replaced by the
// bfloat16 capabilities. For gemv_coop.comp, whose only 16-bit floats are its matrix operands.
std::vector<std::uint32_t> with_bfloat16(std::vector<std::uint32_t> words);

// Which kernel an output dtype uses: the direct per-element one (TABLE=0, like CUDA's), the
// per-block output table (TABLE=1: 16 roundings per block instead of one per element), or kAuto
// (fp16: direct where packHalf2x16 is proven exact on the device, else the table; other dtypes:
// the table).
enum class TableStrategy : std::uint8_t { kDirect, kTable, kAuto };

// Launch geometry per device (a tuning table, see vk_kernels.cpp). `table[d]`: the strategy of
// output dtype d, one per row of kDtypes (NF4_VULKAN_TUNE: 0 direct, 1 table, a auto).
struct Tuning {
  std::array<TableStrategy, std::size(kDtypes)> table{TableStrategy::kAuto, TableStrategy::kDirect, TableStrategy::kDirect};
  // SPIR-V Nontemporal memory operands (a hint the driver may ignore): bit 0 on the packed-code
  // loads, bit 1 on the output stores (streamed data, read or written once).
  std::uint32_t nontemporal = 0;
  // fp16 by packHalf2x16 in the direct kernel where the device proved it exact (f16_check.comp);
  // false: always the integer rounding.
  bool f16_hardware = true;
  // bf16 weights of the fast product by the hardware conversion where the device proved it exact
  // (f16_check.comp built for bf16); false: always the integer rounding.
  bool bf16_hardware = true;
  // Direct kernel: values from a 256-entry table of pairs (true) or a 16-entry table (false).
  bool pair_lut = false;
  // Generic default = the best measured on NVIDIA (see tuning_for): CUDA's geometry.
  std::uint32_t workgroup = 128;
  std::uint32_t units = 4;  // 8-element units per invocation, 1..8
  std::uint32_t copy_workgroup = 256;
  std::uint32_t copy_units = 4;
  std::string why;
};

// Tuning for the device, overridable by
// NF4_VULKAN_TUNE="table=a00,wg=256,units=4,nt=3,pair=1,f16hw=1,bf16hw=1,copy_wg=..,copy_units=.." (any subset;
// benchmarks and tests use it to sweep).
Tuning tuning_for(const DeviceInfo& info);

// How many teams of gemv.comp share a row group's chunks (its SPLIT): core/gemv.h's gemv_split
// (the model CUDA's kernel uses too) with up to 32 teams, a workgroup's most.
std::uint32_t choose_gemv_split(std::int64_t groups, std::int64_t chunks, std::uint32_t teams, std::int64_t resident_teams,
                                std::uint32_t forced);

// A byte range of a VkBuffer holding one array (bytes = the array's exact size). The shaders read
// whole 4-byte words, so the buffer must be readable up to round_up(offset + bytes, 4).
struct Region {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize bytes = 0;
};

// One dispatch's worth of work: a chunk of a tensor, its arrays located in device buffers. The
// chunk starts at a multiple of the blocksize; `block_rem` is its first block's position in its
// nested block (the nested_absmax region starts at that nested block).
struct ChunkView {
  nf4_dtype out_dtype = NF4_DTYPE_F16;
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  bool nested = false;
  std::uint32_t n = 0;  // elements
  std::uint32_t log2_bs = 6, log2_nbs = 8;
  std::uint32_t block_rem = 0;
  float offset_value = 0.0f;  // used when offset.buffer is VK_NULL_HANDLE
  Region packed, absmax, quant_map, nested_absmax, nested_code, offset, out;
  std::uint32_t groups = 0;
};

struct PushConstants {
  std::uint32_t n, packed_off, absmax_off, qmap_off, nested_off, code_off, offset_word, offset_bits, block_rem, out_off,
      log2_bs, log2_nbs;
};

class Kernels;
struct GemvView;

// Descriptor sets and constants for a fixed list of chunks. Recordable any number of times into
// any number of command buffers; destroy it only after the GPU finished every one of them.
class Job {
 public:
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  void record(VkCommandBuffer cmd) const;
  std::size_t dispatch_count() const { return dispatches_.size(); }

 private:
  friend class Kernels;
  explicit Job(const Kernels* k) : k_(k) {}
  struct Dispatch {
    VkPipeline pipeline;
    VkPipelineLayout layout;
    VkDescriptorSet set;
    std::array<std::uint32_t, 22> constants;  // the largest push-constant block (gemv.comp)
    std::uint32_t constants_bytes;
    std::uint32_t groups;
    std::uint32_t groups_y = 1;
  };
  const Kernels* k_;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  std::vector<Dispatch> dispatches_;
};

class Kernels {
 public:
  Kernels(const DeviceFns& fns, VkDevice device, const DeviceInfo& info, VkPipelineCache cache, Tuning tuning);
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  const DeviceFns& fns() const { return fns_; }
  VkDevice device() const { return device_; }
  const DeviceInfo& info() const { return info_; }
  const Tuning& tuning() const { return tuning_; }

  // The planner's parameters for this device: chunks fit maxStorageBufferRange (for fp32 output,
  // the largest) and maxComputeWorkGroupCount[0]; chunk starts are multiples of 4096 elements (and
  // of a workgroup's tile). Test hooks: NF4_VULKAN_MAX_STORAGE_RANGE and NF4_VULKAN_MAX_GROUPS
  // lower the device's limits (read when the Kernels are made).
  PlanParams plan_params() const { return plan_; }
  // Alignment used for every descriptor offset: max(minStorageBufferOffsetAlignment, 16).
  VkDeviceSize descriptor_alignment() const { return align_; }

  // The hardware conversions to fp16 (packHalf2x16) and to bf16 (the fast product's weights). The
  // proof is the caller's: run prepare_f16_check for the dtype over all 2^32 inputs on this
  // device, and call enable_hardware_rounding only if nothing differed (standalone contexts do,
  // vulkan_backend.cpp; f16_verdict keeps the answer per device, driver and dtype). Call it before
  // the first prepare(): pipelines are made once.
  void enable_hardware_rounding(nf4_dtype d) {
    if (d == NF4_DTYPE_F16) f16_hw_ = tuning_.f16_hardware;
    if (d == NF4_DTYPE_BF16) bf16_hw_ = tuning_.bf16_hardware;
  }
  bool f16_hardware() const { return f16_hw_; }
  bool bf16_hardware() const { return bf16_hw_; }
  // One run of shaders/f16_check.comp for `d` (fp16, or bf16 where the device has the bfloat16
  // type enabled: gemv_fast(NF4_DTYPE_BF16)) writing into `result` (16 bytes: mismatches, the
  // first mismatching input, workgroups done; the caller initializes {0, 0xffffffff, 0}):
  // `groups` workgroups of 16384 inputs each, input bits = index * stride. 262144 groups at
  // stride 1 cover every fp32 bit pattern.
  static constexpr std::uint32_t kF16CheckPerGroup = 256 * 64;
  std::unique_ptr<Job> prepare_f16_check(const Region& result, std::uint32_t groups, std::uint32_t stride, nf4_dtype d = NF4_DTYPE_F16) const;

  // Creates the pipelines the chunks need (once per variant) and their descriptor sets.
  std::unique_ptr<Job> prepare(const std::vector<ChunkView>& chunks) const;
  // One copy of `vectors` 16-byte vectors per region pair (regions multiples of 16 bytes), in as
  // many dispatches as the limits need. For the bench's copy ceiling.
  std::unique_ptr<Job> prepare_copy(const std::vector<std::pair<Region, Region>>& src_dst) const;

  // The fast product on cooperative matrices: call once the device was created with coop_enable's
  // extensions and features (the standalone backend does; an embedding context where the
  // application says it enabled them), before the first prepare_gemv.
  void enable_coop() { coop_ = true; }
  // Whether prepare_gemv runs the fast contract (GemvView::mode) for x in `x_dtype`: the shader
  // was built (a glslang with GL_KHR_cooperative_matrix, backends/vulkan/CMakeLists.txt), the
  // device lists a shape for the dtype and the features were enabled.
  bool gemv_fast(nf4_dtype x_dtype) const;
  // Why gemv_fast is false, or the shape it runs (for messages and the bench).
  std::string gemv_fast_status(nf4_dtype x_dtype) const;

  // ---- matrix-vector product (shaders/gemv.comp) ----
  // The product of a validated description whose arrays live whole in device buffers (weight's
  // `out` unused), split into dispatches of whole rows that fit the device's limits. Fails with
  // NF4_ERR_UNSUPPORTED where x or y do not fit one storage-buffer range, nor one row of W, or
  // k > 2^31 - 2 * blocksize. g.mode NF4_GEMV_FAST (only where gemv_fast(g.x_dtype)): the fast
  // contract, gemv_coop.comp, m up to NF4_GEMV_MAX_M; else the exact contract, m up to 8.
  // (GemvView is defined below, after DeviceTensor.)
  std::unique_ptr<Job> prepare_gemv(const GemvView& g) const;
  // ---- end of the matrix-vector product ----

 private:
  friend class Job;
  void destroy();
  // The dequantize.comp pipeline of a variant (variants.h), the kernel chosen by the tuning.
  VkPipeline pipeline(nf4_dtype dtype, nf4_quant_type quant_type, bool nested) const;
  std::vector<VkDescriptorSet> allocate_sets(Job& job, VkDescriptorSetLayout layout, std::uint32_t bindings,
                                             std::size_t count) const;
  VkPipeline make_pipeline(const char* module_name, VkPipelineLayout layout, std::uint32_t wg, std::uint32_t units,
                           std::uint32_t nontemporal = 0, const std::vector<std::uint32_t>* spec = nullptr) const;

  DeviceFns fns_;
  VkDevice device_;
  DeviceInfo info_;
  VkPipelineCache cache_;
  Tuning tuning_;
  PlanParams plan_;
  VkDeviceSize align_;
  std::uint64_t max_range_;
  std::uint32_t max_groups_;
  std::int64_t gemv_resident_teams_ = 0;  // teams of gemv.comp the device keeps resident; 0: unknown
  bool f16_hw_ = false, bf16_hw_ = false;
  bool coop_ = false;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE, copy_set_layout_ = VK_NULL_HANDLE, check_set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE, copy_layout_ = VK_NULL_HANDLE, check_layout_ = VK_NULL_HANDLE;
  mutable std::mutex mutex_;
  mutable std::map<std::tuple<nf4_dtype, nf4_quant_type, bool>, VkPipeline> pipelines_;
  mutable VkPipeline copy_pipeline_ = VK_NULL_HANDLE;
  // gemv.comp's pipelines by specialization constants, made on first use, with their layouts.
  mutable std::map<std::vector<std::uint32_t>, VkPipeline> gemv_pipelines_;
  mutable VkDescriptorSetLayout gemv_set_layout_ = VK_NULL_HANDLE;
  mutable VkPipelineLayout gemv_layout_ = VK_NULL_HANDLE;
  // gemv_coop.comp's pipelines (same layout), by specialization constants.
  mutable std::map<std::vector<std::uint32_t>, VkPipeline> coop_pipelines_;
  mutable VkPipeline check_pipelines_[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};  // fp16, bf16
};

// The verdict on a hardware conversion (fp16 or bf16) per device and driver, for this process (the
// check runs once per process and dtype, not per context). Modes (NF4_VULKAN_F16_CHECK): "auto"
// (default: the exhaustive check on GPUs; CPU devices such as lavapipe, too slow for 2^32 inputs,
// keep the integer rounding), "off", "full" (exhaustive on any device), "sample" (a strided sample
// of about 2^20 inputs on any device: NOT a proof, a test hook that exercises the hardware path on
// lavapipe).
enum class F16CheckMode { kOff, kAuto, kFull, kSample };
F16CheckMode f16_check_mode();
// Inputs' stride and workgroup count for the mode on this device; groups == 0: do not check.
struct F16CheckPlan {
  std::uint32_t groups = 0, stride = 1;
};
F16CheckPlan f16_check_plan(const DeviceInfo& info);
// -1: not checked yet in this process; 0: differs (or not checked: integer); 1: proven.
int f16_verdict(const DeviceInfo& info, nf4_dtype d = NF4_DTYPE_F16);
void set_f16_verdict(const DeviceInfo& info, nf4_dtype d, bool exact);
// Patches SPIR-V: adds the Nontemporal memory operand to every OpLoad through a variable bound at
// one of the bindings in `load_bindings` (bit mask, descriptor set 0) and every OpStore through
// one in `store_bindings`.
std::vector<std::uint32_t> with_nontemporal(std::vector<std::uint32_t> words, std::uint32_t load_bindings, std::uint32_t store_bindings);

// Builds the chunk views of a tensor whose arrays live whole in device buffers (element 0 of
// each array at region.offset), for the plan's chunks of that tensor.
struct DeviceTensor {
  nf4_quant_type quant_type = NF4_QUANT_NF4;
  nf4_dtype out_dtype = NF4_DTYPE_F16;
  std::int64_t numel = 0;
  std::int32_t blocksize = 64;
  bool nested = false;
  std::int32_t nested_blocksize = 256;
  float nested_offset = 0.0f;
  Region packed, absmax, quant_map, nested_absmax, nested_code, offset, out;
};

// A matrix-vector product whose arrays live whole in device buffers (Kernels::prepare_gemv).
struct GemvView {
  DeviceTensor weight;  // out unused
  std::int64_t n = 0, k = 0;
  std::int32_t m = 1;
  nf4_dtype x_dtype = NF4_DTYPE_BF16, y_dtype = NF4_DTYPE_BF16;
  nf4_gemv_mode mode = NF4_GEMV_EXACT;  // NF4_GEMV_FAST only where Kernels::gemv_fast(x_dtype)
  Region x, y;
};

std::vector<ChunkView> chunk_views(const DeviceTensor& t, const Plan& plan, std::size_t tensor_index);

// Patches SPIR-V to request the float controls the device supports (see DeviceInfo).
std::vector<std::uint32_t> with_float_controls(const std::uint32_t* words, std::size_t count, const DeviceInfo& info);

// Validation-layer messages seen by this process (standalone contexts with NF4_VULKAN_VALIDATION=1).
std::uint64_t validation_message_count();

}  // namespace nf4::vk
