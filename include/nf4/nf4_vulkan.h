/* SPDX-License-Identifier: MIT */
/*
 * nf4 inside a Vulkan application ("bring your own device"). The application owns the VkInstance,
 * VkDevice, queues, memory, buffers and command buffers; nf4 only records compute dispatches into
 * a command buffer the application gives it. nf4 never submits, waits, allocates device memory or
 * touches a queue.
 *
 * Requirements on the application's device: Vulkan 1.1 or newer, a queue family with
 * VK_QUEUE_COMPUTE_BIT for the command buffers nf4 records into; no feature or extension has to be
 * enabled (no 8/16-bit storage, no float16). Buffers need VK_BUFFER_USAGE_STORAGE_BUFFER_BIT.
 * With a 1.2+ instance (api_version below) and a device that supports them, nf4 asks for IEEE
 * fp32 denormals, signed zeros and round-to-nearest-even (float controls, core in 1.2), so results
 * match the CPU oracle bit for bit even for subnormal products; without them a device may flush
 * fp32 subnormals to zero (bitsandbytes itself flushes them), which only matters for absmax values
 * below about 2e-36.
 * fp16 outputs: nf4 rounds with integer operations unless packHalf2x16 is proven exact on the
 * device. The proof is a check over all 2^32 fp32 inputs that only a standalone nf4 context (which
 * owns a queue) runs, once per process, device and driver; an embedding context uses packHalf2x16
 * only if such a check already passed in this process for the same device and driver, and
 * otherwise rounds fp16 with integers (the same bits, more slowly on some GPUs).
 *
 * Usage:
 *   nf4_vulkan_context_create(&info, &ctx);          once per VkDevice: pipelines are made here
 *                                                    (lazily, on first use of each variant)
 *   nf4_vulkan_job_create(ctx, tensors, n, &job);     per set of buffers: validates, plans the
 *                                                    chunks, writes descriptor sets
 *   each frame:  <barrier: your writes -> compute shader reads>
 *                nf4_vulkan_job_record(job, cmd);     binds nf4's pipeline and descriptor sets,
 *                                                    pushes constants, vkCmdDispatch (one per chunk)
 *                <barrier: compute shader writes -> your reads>
 *   nf4_vulkan_job_destroy(job);                      after every command buffer recorded with it
 *                                                    has completed
 *   nf4_vulkan_context_destroy(ctx);                  after every job is destroyed
 *
 * Barriers the application records (nf4 records none):
 *   before: srcStage = the stage that wrote the inputs (e.g. VK_PIPELINE_STAGE_TRANSFER_BIT for
 *           vkCmdCopyBuffer uploads), srcAccess = its write access; dstStage =
 *           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, dstAccess = VK_ACCESS_SHADER_READ_BIT (inputs)
 *           | VK_ACCESS_SHADER_WRITE_BIT (output, write-after-read/write hazards).
 *   after:  srcStage = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, srcAccess =
 *           VK_ACCESS_SHADER_WRITE_BIT; dstStage/dstAccess = whatever reads the output next.
 * The dispatches of one job write disjoint bytes, so nf4 needs no barrier between them.
 *
 * State left in the command buffer: the compute pipeline binding, descriptor set 0 of the compute
 * bind point and the push constants are nf4's after record; re-bind yours afterwards.
 *
 * Buffer rules (checked by nf4_vulkan_job_create, each with its own status and message):
 *   - every input offset is a multiple of 4 bytes, the output offset a multiple of 16 bytes;
 *   - nf4 reads whole 4-byte words: each buffer range's `size` must be at least the array's byte
 *     count rounded up to a multiple of 4 (the extra bytes are read and ignored);
 *   - the output's `size` must be at least numel * sizeof(dtype) rounded up to 4 bytes. nf4 writes
 *     exactly numel elements: with an odd fp16/bf16 count the other half of the last word is
 *     preserved (atomically), never overwritten;
 *   - the output must not overlap an input (same VkBuffer and overlapping bytes).
 *
 * Thread safety: a context may be used from several threads (job creation is serialized inside);
 * a job may be recorded from several threads into different command buffers. Recording into one
 * VkCommandBuffer follows Vulkan's external synchronization rules.
 *
 * Element counts: up to 2^56 like nf4.h; large tensors are split into chunks that fit the device's
 * maxStorageBufferRange and maxComputeWorkGroupCount (one dispatch each).
 */
#ifndef NF4_NF4_VULKAN_H
#define NF4_NF4_VULKAN_H

#include <vulkan/vulkan.h>

#include "nf4/nf4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nf4_vulkan_context_info {
  VkInstance instance;
  VkPhysicalDevice physical_device;
  VkDevice device;
  uint32_t queue_family_index; /* the family whose command buffers nf4 records into (compute) */
  /* The apiVersion the instance was created with (VkApplicationInfo::apiVersion); 0 = 1.1.
   * nf4 uses features of min(api_version, device version) only. */
  uint32_t api_version;
  VkPipelineCache pipeline_cache; /* optional: VK_NULL_HANDLE */
  /* Optional: the application's loader entry points (e.g. from volk or a static loader). NULL:
   * nf4 opens libvulkan.so.1 itself and uses its vkGetInstanceProcAddr; vkGetDeviceProcAddr is
   * then queried from the instance. */
  PFN_vkGetInstanceProcAddr get_instance_proc_addr;
  PFN_vkGetDeviceProcAddr get_device_proc_addr;
  /* NF4_VULKAN_FEATURE_* bits: what the application enabled on `device` beyond the requirements
   * above, so that nf4 may use it. 0: nothing (the exact product only). */
  uint32_t features;
} nf4_vulkan_context_info;

/* The fast product (NF4_GEMV_FAST) on cooperative matrices. Set this bit when the device was
 * created with VK_KHR_cooperative_matrix (feature cooperativeMatrix) and the Vulkan 1.2 features
 * vulkanMemoryModel, vulkanMemoryModelDeviceScope (nf4's shaders use Device-scope atomics, which a
 * device with the memory model on allows only with it) and shaderFloat16, on a Vulkan 1.3+
 * instance and device (api_version; below 1.3 its pipeline would have to ask for full subgroups);
 * for bf16 x also
 * VK_KHR_shader_bfloat16 (shaderBFloat16Type, shaderBFloat16CooperativeMatrix). nf4 then runs the
 * fast contract for the dtypes whose matrices the device lists (nf4_vulkan_job_gemv_mode says
 * which contract a job runs); a bit set for a device that lacks the features is ignored. */
#define NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX 1u

/* A byte range of one of the application's buffers. */
typedef struct nf4_vulkan_buffer {
  VkBuffer buffer;
  VkDeviceSize offset; /* where element 0 of the array lives */
  VkDeviceSize size;   /* bytes available from offset (see the buffer rules above) */
} nf4_vulkan_buffer;

/* Like nf4_tensor (same fields, same meaning, see nf4.h) with buffer ranges instead of pointers.
 * Array sizes come from numel, blocksize and nested_blocksize. */
typedef struct nf4_vulkan_tensor {
  nf4_quant_type quant_type;
  nf4_dtype out_dtype;
  int64_t numel;
  int32_t blocksize;
  int32_t nested;
  int32_t nested_blocksize;
  float nested_offset;               /* used when nested_offset_buffer.buffer is VK_NULL_HANDLE */

  nf4_vulkan_buffer packed;          /* uint8[ceil(numel/2)] */
  nf4_vulkan_buffer absmax;          /* float[nA] (flat) or uint8[nA] (nested) */
  nf4_vulkan_buffer quant_map;       /* float[16]; may be VK_NULL_HANDLE for FP4 (not read) */
  nf4_vulkan_buffer nested_absmax;   /* nested: float[ceil(nA / nested_blocksize)] */
  nf4_vulkan_buffer nested_code;     /* nested: float[256] */
  nf4_vulkan_buffer nested_offset_buffer; /* nested, optional: float[1] read on the device */
  nf4_vulkan_buffer out;             /* numel elements of out_dtype */
} nf4_vulkan_tensor;

typedef struct nf4_vulkan_context nf4_vulkan_context;
typedef struct nf4_vulkan_job nf4_vulkan_job;

NF4_API nf4_status nf4_vulkan_context_create(const nf4_vulkan_context_info* info, nf4_vulkan_context** ctx);
NF4_API void nf4_vulkan_context_destroy(nf4_vulkan_context* ctx);
/* Last failure message on this context for the calling thread; with ctx == NULL, the calling
 * thread's last failure of a call that has no context (nf4_vulkan_context_create,
 * nf4_vulkan_job_record, or a call given a NULL context). */
NF4_API const char* nf4_vulkan_last_error(const nf4_vulkan_context* ctx);
/* The device name and the tuning in use, e.g. "NVIDIA H100 (Vulkan 1.4.312, discrete GPU)". */
NF4_API const char* nf4_vulkan_device_name(const nf4_vulkan_context* ctx);

/* Validates every tensor (nothing is recorded on error), splits them into chunks and writes the
 * descriptor sets. The buffers must stay alive (and not be re-bound to other memory) while the
 * job exists. */
NF4_API nf4_status nf4_vulkan_job_create(nf4_vulkan_context* ctx, const nf4_vulkan_tensor* tensors, size_t count,
                                         nf4_vulkan_job** job);
/* Records the job's dispatches into cmd (recording state, outside a render pass, a command
 * buffer of the context's queue family). Any number of times, into any number of buffers. */
NF4_API nf4_status nf4_vulkan_job_record(const nf4_vulkan_job* job, VkCommandBuffer cmd);
/* Number of vkCmdDispatch calls one record makes (one per chunk). */
NF4_API size_t nf4_vulkan_job_dispatch_count(const nf4_vulkan_job* job);
NF4_API void nf4_vulkan_job_destroy(nf4_vulkan_job* job);

/* ---- Fused matrix-vector product (nf4.h, nf4_gemv_desc; docs/GEMV.md): under the exact
 * contract (mode NF4_GEMV_EXACT, zero) the same bits as every other backend; under the fast one
 * (NF4_GEMV_FAST, fp16 or bf16 x, a context with NF4_VULKAN_FEATURE_COOPERATIVE_MATRIX on a device
 * that lists matrices of x's dtype) tensor cores, within the fast contract's bound; a fast request
 * the device cannot run runs the exact contract (nf4_vulkan_job_gemv_mode says which). The weight is an nf4_vulkan_tensor whose out and out_dtype are not used; x and y
 * are buffer ranges. Buffer rules: the weight's as above; x: offset a multiple of 4, size at
 * least m * k * sizeof(x_dtype) rounded up to 4; y: offset a multiple of 4, size at least
 * m * n * sizeof(y_dtype) rounded up to 4, and y must not overlap x or any array of the weight.
 * nf4 writes exactly m * n elements of y (16-bit outputs with atomics on their word: the other half
 * of a word is preserved). Limits: k <= 2^31 - 2 * blocksize, and x and y must each fit one
 * maxStorageBufferRange (NF4_ERR_UNSUPPORTED otherwise); W of any size is split into dispatches.
 * The job is recorded with nf4_vulkan_job_record, with the barriers described above, and
 * destroyed with nf4_vulkan_job_destroy. */
typedef struct nf4_vulkan_gemv {
  const nf4_vulkan_tensor* weight; /* W [n, k]: numel == n * k */
  int64_t n, k;
  int32_t m;                       /* 1..NF4_GEMV_MAX_M */
  nf4_dtype x_dtype;
  nf4_vulkan_buffer x;             /* [m, k] */
  nf4_dtype y_dtype;
  nf4_vulkan_buffer y;             /* [m, n] */
  nf4_gemv_mode mode;              /* NF4_GEMV_EXACT (0) or NF4_GEMV_FAST */
} nf4_vulkan_gemv;
NF4_API nf4_status nf4_vulkan_gemv_job_create(nf4_vulkan_context* ctx, const nf4_vulkan_gemv* gemv, nf4_vulkan_job** job);
/* The contract a gemv job runs (NF4_GEMV_EXACT for a dequantization job or NULL). */
NF4_API nf4_gemv_mode nf4_vulkan_job_gemv_mode(const nf4_vulkan_job* job);
/* ---- end of the matrix-vector product ---- */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NF4_NF4_VULKAN_H */
