// SPDX-License-Identifier: MIT
// lab/vulkan_coopmat2/probe.cpp: what the Vulkan driver offers of VK_NV_cooperative_matrix2 (its
// features, properties and flexible shapes), and optionally one timed, checked run of
// product.comp. A development probe for the Vulkan fast product, not part of the build: it needs
// Vulkan headers that declare VK_NV_cooperative_matrix2 (1.4.3xx; Debian 12's 1.3.239 do not) and a
// glslang that knows GL_NV_cooperative_matrix2 (16.x; Debian 12's glslc 11.13 does not).
//
//   g++ -std=c++17 -O2 -I<headers> -o probe probe.cpp -ldl -static-libstdc++ -static-libgcc
//   glslang -V --target-env vulkan1.3 -DBM=64 -DBN=16 -DBK=64 -DWG=128 -o p.spv product.comp
//   ./probe                                   # the driver's coopmat2 support
//   ./probe p.spv BM BN WG n k m reps [dense] # time `reps` dispatches back to back (timestamps),
//                                             # check 64 sampled rows against a double sum of the
//                                             # bf16-rounded weights; dense: a -DDENSE module, W as
//                                             # bf16 (timed only)
// WG must meet the driver's granularity for BM x BN (the flexible shapes printed first).
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>
#include <dlfcn.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static PFN_vkGetInstanceProcAddr gipa;
#define IFN(name) auto name = reinterpret_cast<PFN_##name>(gipa(inst, #name))
#define CHECK(x) do { VkResult r_ = (x); if (r_ != VK_SUCCESS) { std::printf("FAIL %s = %d (line %d)\n", #x, r_, __LINE__); std::exit(1); } } while (0)

static float bf16_round(float v) {
  uint32_t u; std::memcpy(&u, &v, 4); u += 0x7FFFu + ((u >> 16) & 1u); u &= 0xFFFF0000u; float o; std::memcpy(&o, &u, 4); return o;
}
static uint16_t bf16_bits(float v) { uint32_t u; std::memcpy(&u, &v, 4); u += 0x7FFFu + ((u >> 16) & 1u); return uint16_t(u >> 16); }

int main(int argc, char** argv) {
  void* lib = dlopen("libvulkan.so.1", RTLD_NOW);
  if (!lib) { std::printf("no libvulkan.so.1\n"); return 1; }
  gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  VkInstance inst = VK_NULL_HANDLE;
  IFN(vkCreateInstance);
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.apiVersion = VK_API_VERSION_1_3;
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  CHECK(vkCreateInstance(&ici, nullptr, &inst));
  IFN(vkEnumeratePhysicalDevices); IFN(vkGetPhysicalDeviceProperties2); IFN(vkGetPhysicalDeviceFeatures2);
  IFN(vkEnumerateDeviceExtensionProperties); IFN(vkGetPhysicalDeviceQueueFamilyProperties); IFN(vkGetPhysicalDeviceMemoryProperties);
  IFN(vkCreateDevice); IFN(vkGetDeviceProcAddr);
  auto flex = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV>(gipa(inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"));
  uint32_t nd = 0; vkEnumeratePhysicalDevices(inst, &nd, nullptr);
  std::vector<VkPhysicalDevice> pds(nd); vkEnumeratePhysicalDevices(inst, &nd, pds.data());
  if (nd == 0) { std::printf("no device\n"); return 1; }
  VkPhysicalDevice pd = pds[0];
  VkPhysicalDeviceCooperativeMatrix2PropertiesNV cm2p{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV};
  VkPhysicalDeviceDriverProperties drv{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES}; drv.pNext = &cm2p;
  VkPhysicalDeviceProperties2 pp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2}; pp.pNext = &drv;
  vkGetPhysicalDeviceProperties2(pd, &pp);
  std::printf("device %s, driver %s %s, api %u.%u.%u\n", pp.properties.deviceName, drv.driverName, drv.driverInfo,
              VK_API_VERSION_MAJOR(pp.properties.apiVersion), VK_API_VERSION_MINOR(pp.properties.apiVersion), VK_API_VERSION_PATCH(pp.properties.apiVersion));
  uint32_t ne = 0; vkEnumerateDeviceExtensionProperties(pd, nullptr, &ne, nullptr);
  std::vector<VkExtensionProperties> exts(ne); vkEnumerateDeviceExtensionProperties(pd, nullptr, &ne, exts.data());
  auto has = [&](const char* n) { for (auto& e : exts) if (!std::strcmp(e.extensionName, n)) return true; return false; };
  for (const char* n : {"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2", "VK_KHR_shader_bfloat16", "VK_NV_cooperative_vector", "VK_EXT_shader_float8"})
    std::printf("  %s: %s\n", n, has(n) ? "yes" : "no");
  if (!has("VK_NV_cooperative_matrix2")) return 0;
  VkPhysicalDeviceCooperativeMatrix2FeaturesNV cm2f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV};
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR cmf{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR}; cmf.pNext = &cm2f;
  VkPhysicalDeviceShaderBfloat16FeaturesKHR bff{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR}; bff.pNext = &cmf;
  VkPhysicalDeviceVulkan13Features f13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES}; f13.pNext = &bff;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES}; f12.pNext = &f13;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES}; f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2}; f2.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(pd, &f2);
  std::printf("  coopmat2: workgroupScope %d flexibleDimensions %d reductions %d conversions %d perElementOps %d tensorAddressing %d blockLoads %d\n",
              cm2f.cooperativeMatrixWorkgroupScope, cm2f.cooperativeMatrixFlexibleDimensions, cm2f.cooperativeMatrixReductions, cm2f.cooperativeMatrixConversions,
              cm2f.cooperativeMatrixPerElementOperations, cm2f.cooperativeMatrixTensorAddressing, cm2f.cooperativeMatrixBlockLoads);
  std::printf("  coopmat2 props: workgroupScopeMaxWorkgroupSize %u flexibleDimensionsMaxDimension %u workgroupScopeReservedSharedMemory %u\n",
              cm2p.cooperativeMatrixWorkgroupScopeMaxWorkgroupSize, cm2p.cooperativeMatrixFlexibleDimensionsMaxDimension, cm2p.cooperativeMatrixWorkgroupScopeReservedSharedMemory);
  std::printf("  bf16: type %d coopmat %d; coopmat %d; vmm %d/%d bda %d int8 %d storage8 %d storage16 %d\n", bff.shaderBFloat16Type, bff.shaderBFloat16CooperativeMatrix,
              cmf.cooperativeMatrix, f12.vulkanMemoryModel, f12.vulkanMemoryModelDeviceScope, f12.bufferDeviceAddress, f12.shaderInt8, f12.storageBuffer8BitAccess, f11.storageBuffer16BitAccess);
  if (flex) {
    uint32_t nf = 0; flex(pd, &nf, nullptr);
    std::vector<VkCooperativeMatrixFlexibleDimensionsPropertiesNV> fl(nf, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV});
    flex(pd, &nf, fl.data());
    for (auto& f : fl)
      std::printf("  flexible: granularity %ux%ux%u A %d B %d C %d R %d scope %d invocations %u\n", f.MGranularity, f.NGranularity, f.KGranularity, f.AType, f.BType, f.CType,
                  f.ResultType, f.scope, f.workgroupInvocations);
  }
  if (argc < 9) return 0;
  const char* spv_path = argv[1];
  const uint32_t BM = std::atoi(argv[2]), BN = std::atoi(argv[3]), WG = std::atoi(argv[4]);
  const uint32_t n = std::atoi(argv[5]), k = std::atoi(argv[6]), m = std::atoi(argv[7]), reps = std::atoi(argv[8]);
  if (BM == 0 || BN == 0 || n == 0 || n % BM != 0 || k == 0 || k % 64 != 0 || m == 0 || reps == 0) {
    std::printf("expected n a multiple of BM, k of 64, and m, reps > 0\n");
    return 2;
  }
  (void)WG;
  // Device with the features the shader uses.
  uint32_t nq = 0; vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> qf(nq); vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf.data());
  uint32_t qfi = 0; while (qfi < nq && !(qf[qfi].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++qfi;
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO}; qci.queueFamilyIndex = qfi; qci.queueCount = 1; qci.pQueuePriorities = &prio;
  const char* dext[] = {"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2", "VK_KHR_shader_bfloat16"};
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO}; dci.pNext = &f2; dci.queueCreateInfoCount = 1; dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = 3; dci.ppEnabledExtensionNames = dext;
  f2.features.robustBufferAccess = VK_FALSE;
  VkDevice dev; CHECK(vkCreateDevice(pd, &dci, nullptr, &dev));
#define DFN(name) auto name = reinterpret_cast<PFN_##name>(vkGetDeviceProcAddr(dev, #name))
  DFN(vkGetDeviceQueue); DFN(vkCreateBuffer); DFN(vkGetBufferMemoryRequirements); DFN(vkAllocateMemory); DFN(vkBindBufferMemory); DFN(vkMapMemory);
  DFN(vkCreateShaderModule); DFN(vkCreateDescriptorSetLayout); DFN(vkCreatePipelineLayout); DFN(vkCreateComputePipelines); DFN(vkCreateDescriptorPool);
  DFN(vkAllocateDescriptorSets); DFN(vkUpdateDescriptorSets); DFN(vkCreateCommandPool); DFN(vkAllocateCommandBuffers); DFN(vkBeginCommandBuffer);
  DFN(vkEndCommandBuffer); DFN(vkCmdBindPipeline); DFN(vkCmdBindDescriptorSets); DFN(vkCmdPushConstants); DFN(vkCmdDispatch); DFN(vkCmdCopyBuffer);
  DFN(vkCmdPipelineBarrier); DFN(vkQueueSubmit); DFN(vkQueueWaitIdle); DFN(vkCreateQueryPool); DFN(vkCmdWriteTimestamp); DFN(vkGetQueryPoolResults);
  DFN(vkResetCommandBuffer); DFN(vkCmdResetQueryPool);
  VkQueue q; vkGetDeviceQueue(dev, qfi, 0, &q);
  VkPhysicalDeviceMemoryProperties mp; vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  struct Buf { VkBuffer b; VkDeviceMemory mem; void* map = nullptr; };
  auto make = [&](VkDeviceSize bytes, bool host) {
    Buf o{};
    VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO}; bci.size = bytes;
    bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    CHECK(vkCreateBuffer(dev, &bci, nullptr, &o.b));
    VkMemoryRequirements mr; vkGetBufferMemoryRequirements(dev, o.b, &mr);
    const VkMemoryPropertyFlags want = host ? (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    uint32_t ti = 0; while (ti < mp.memoryTypeCount && !((mr.memoryTypeBits >> ti & 1) && (mp.memoryTypes[ti].propertyFlags & want) == want)) ++ti;
    if (ti == mp.memoryTypeCount) { std::printf("no memory type for a %s buffer\n", host ? "host" : "device"); std::exit(1); }
    VkMemoryAllocateFlagsInfo fi{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO}; fi.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO}; mai.pNext = &fi; mai.allocationSize = mr.size; mai.memoryTypeIndex = ti;
    CHECK(vkAllocateMemory(dev, &mai, nullptr, &o.mem));
    CHECK(vkBindBufferMemory(dev, o.b, o.mem, 0));
    if (host) CHECK(vkMapMemory(dev, o.mem, 0, bytes, 0, &o.map));
    return o;
  };
  // Data: random codes, absmax in [0.5, 2], x in [-1, 1].
  std::mt19937 rng(7);
  std::vector<uint8_t> codes(std::size_t(n) * k / 2);
  for (auto& c : codes) c = uint8_t(rng());
  std::vector<float> absmax(std::size_t(n) * k / 64);
  for (auto& a : absmax) a = 0.5f + 1.5f * float(rng()) / float(rng.max());
  std::vector<uint16_t> xb(std::size_t(m) * k);
  std::vector<float> xf(xb.size());
  for (std::size_t i = 0; i < xb.size(); ++i) { float v = bf16_round(2.0f * float(rng()) / float(rng.max()) - 1.0f); xf[i] = v; xb[i] = bf16_bits(v); }
  const bool dense = argc > 9 && std::strcmp(argv[9], "dense") == 0;
  const VkDeviceSize sizes[4] = {dense ? codes.size() * 4 : codes.size(), absmax.size() * 4, xb.size() * 2, VkDeviceSize(n) * m * 4};
  Buf dbuf[4], hbuf[4];
  for (int i = 0; i < 4; ++i) { dbuf[i] = make(sizes[i], false); hbuf[i] = make(sizes[i], true); }
  std::memcpy(hbuf[0].map, codes.data(), codes.size()); std::memcpy(hbuf[1].map, absmax.data(), sizes[1]); std::memcpy(hbuf[2].map, xb.data(), sizes[2]);
  // Pipeline.
  std::vector<uint32_t> spv;
  if (FILE* fp = std::fopen(spv_path, "rb")) {
    std::fseek(fp, 0, SEEK_END);
    const long sz = std::ftell(fp);
    std::fseek(fp, 0, SEEK_SET);
    spv.resize(sz > 0 ? std::size_t(sz) / 4 : 0);
    const std::size_t got = std::fread(spv.data(), 4, spv.size(), fp);
    std::fclose(fp);
    if (spv.empty() || got != spv.size()) { std::printf("%s: not a SPIR-V module\n", spv_path); return 2; }
  } else {
    std::printf("%s: cannot open\n", spv_path);
    return 2;
  }
  VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO}; smci.codeSize = spv.size() * 4; smci.pCode = spv.data();
  VkShaderModule sm; CHECK(vkCreateShaderModule(dev, &smci, nullptr, &sm));
  VkDescriptorSetLayoutBinding bind[4]; for (int i = 0; i < 4; ++i) bind[i] = {uint32_t(i), VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo dslci{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO}; dslci.bindingCount = 4; dslci.pBindings = bind;
  VkDescriptorSetLayout dsl; CHECK(vkCreateDescriptorSetLayout(dev, &dslci, nullptr, &dsl));
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 12};
  VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO}; plci.setLayoutCount = 1; plci.pSetLayouts = &dsl; plci.pushConstantRangeCount = 1; plci.pPushConstantRanges = &pcr;
  VkPipelineLayout pl; CHECK(vkCreatePipelineLayout(dev, &plci, nullptr, &pl));
  VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cpci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0, VK_SHADER_STAGE_COMPUTE_BIT, sm, "main", nullptr};
  cpci.layout = pl;
  VkPipeline pipe; CHECK(vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpci, nullptr, &pipe));
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 4};
  VkDescriptorPoolCreateInfo dpci{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO}; dpci.maxSets = 1; dpci.poolSizeCount = 1; dpci.pPoolSizes = &ps;
  VkDescriptorPool dp; CHECK(vkCreateDescriptorPool(dev, &dpci, nullptr, &dp));
  VkDescriptorSetAllocateInfo dsai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO}; dsai.descriptorPool = dp; dsai.descriptorSetCount = 1; dsai.pSetLayouts = &dsl;
  VkDescriptorSet ds; CHECK(vkAllocateDescriptorSets(dev, &dsai, &ds));
  VkDescriptorBufferInfo dbi[4]; VkWriteDescriptorSet w[4];
  for (int i = 0; i < 4; ++i) { dbi[i] = {dbuf[i].b, 0, VK_WHOLE_SIZE}; w[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, nullptr, ds, uint32_t(i), 0, 1, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nullptr, &dbi[i], nullptr}; }
  vkUpdateDescriptorSets(dev, 4, w, 0, nullptr);
  VkCommandPoolCreateInfo cpi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO}; cpi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT; cpi.queueFamilyIndex = qfi;
  VkCommandPool pool; CHECK(vkCreateCommandPool(dev, &cpi, nullptr, &pool));
  VkCommandBufferAllocateInfo cbai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO}; cbai.commandPool = pool; cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY; cbai.commandBufferCount = 1;
  VkCommandBuffer cb; CHECK(vkAllocateCommandBuffers(dev, &cbai, &cb));
  VkQueryPoolCreateInfo qpci{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO}; qpci.queryType = VK_QUERY_TYPE_TIMESTAMP; qpci.queryCount = 2;
  VkQueryPool qp; CHECK(vkCreateQueryPool(dev, &qpci, nullptr, &qp));
  auto submit = [&] { VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO}; si.commandBufferCount = 1; si.pCommandBuffers = &cb; CHECK(vkQueueSubmit(q, 1, &si, VK_NULL_HANDLE)); CHECK(vkQueueWaitIdle(q)); };
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER}; mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT; mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT;
  CHECK(vkBeginCommandBuffer(cb, &bi));
  for (int i = 0; i < 3; ++i) { VkBufferCopy c{0, 0, sizes[i]}; vkCmdCopyBuffer(cb, hbuf[i].b, dbuf[i].b, 1, &c); }
  CHECK(vkEndCommandBuffer(cb)); submit();
  const uint32_t pc[3] = {n, k, m};
  const uint32_t gx = n / BM, gy = (m + BN - 1) / BN;
  CHECK(vkResetCommandBuffer(cb, 0));
  CHECK(vkBeginCommandBuffer(cb, &bi));
  vkCmdResetQueryPool(cb, qp, 0, 2);
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
  vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl, 0, 1, &ds, 0, nullptr);
  vkCmdPushConstants(cb, pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, 12, pc);
  vkCmdDispatch(cb, gx, gy, 1);  // warm-up
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, qp, 0);
  for (uint32_t r = 0; r < reps; ++r) {
    vkCmdDispatch(cb, gx, gy, 1);
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }
  vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, qp, 1);
  { VkBufferCopy c{0, 0, sizes[3]}; vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr); vkCmdCopyBuffer(cb, dbuf[3].b, hbuf[3].b, 1, &c); }
  CHECK(vkEndCommandBuffer(cb)); submit();
  uint64_t ts[2]; CHECK(vkGetQueryPoolResults(dev, qp, 0, 2, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
  const double us = double(ts[1] - ts[0]) * pp.properties.limits.timestampPeriod / 1000.0 / reps;
  // Check sampled rows against a double-precision sum of the bf16-rounded weights.
  static const float kNF4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                 0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
  const float* y = static_cast<const float*>(hbuf[3].map);
  if (dense) { std::printf("RESULT dense %s n=%u k=%u m=%u tile %ux%u: %.2f us per dispatch\n", spv_path, n, k, m, BM, BN, us); return 0; }
  double worst = 0; int bad = 0;
  for (uint32_t i = 0; i < 64; ++i) {
    const uint32_t row = uint32_t((uint64_t(i) * 2654435761u) % n);
    for (uint32_t t = 0; t < m; ++t) {
      double s = 0, sa = 0;
      for (uint32_t c = 0; c < k; ++c) {
        const uint64_t e = uint64_t(row) * k + c;
        const uint8_t b = codes[e / 2];
        const uint32_t qv = (e & 1) ? (b & 15) : (b >> 4);
        const float wv = bf16_round(kNF4[qv] * absmax[e / 64]);
        s += double(wv) * xf[uint64_t(t) * k + c]; sa += std::fabs(double(wv) * xf[uint64_t(t) * k + c]);
      }
      const double err = std::fabs(y[uint64_t(row) * m + t] - s) / (sa + 1e-30);
      worst = std::max(worst, err);
      if (err > 1e-5) ++bad;
    }
  }
  const double bytes = double(sizes[0] + sizes[1]);
  std::printf("RESULT %s n=%u k=%u m=%u tile %ux%u: %.2f us per dispatch (%u back to back), %.0f GB/s of W; worst rel err %.2e, %d of %u sampled outputs off\n", spv_path, n, k, m, BM, BN, us, reps,
              bytes / us / 1e3, worst, bad, 64 * m);
  return 0;
}
