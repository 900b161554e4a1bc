// SPDX-License-Identifier: MIT
// The vulkan runner: copies, dequantizations and products recorded on the standalone backend's
// device (DeviceExtension, backends/vulkan/vk_device.h) and timed with queue timestamps.
//
// What the modes of bench/timing.h mean here:
//   batch (default; graph is the same here: the command buffer is recorded once) : K =
//          clamp(iters, 8, 32) operations back to back between two timestamps, each after a
//          compute/transfer barrier (the dependency an application records between dependent
//          dispatches; Vulkan has no programmatic dependent launch), repeated max(5, iters / K)
//          times; time per operation = span / K, median over the repeats;
//   events: a full barrier and a timestamp pair around every operation, median over iterations
//          (per-call timing).
// Everything runs in one submission after untimed warm-up operations.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_kernels.h"
#include "bench/bench.h"
#include "bench/timing.h"
#include "bench/util.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/plan.h"
#include "core/tensor.h"

namespace nf4::vk {
namespace {

VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

template <typename F>
double time_us(DeviceExtension& b, int iters, F&& record) {
  const DeviceFns& d = b.fns();
  if (b.timestamp_bits() == 0) fail(NF4_ERR_UNSUPPORTED, "the Vulkan queue has no timestamps");
  const bool batch = bench::timing_from_env() != bench::Timing::kEvents;  // graph: the command buffer is recorded once anyway
  const int k = batch ? std::clamp(iters, 8, 32) : 1;          // operations per timed span
  const int spans = batch ? std::max(5, iters / k) : iters;    // timed spans
  const int warmup = batch ? 2 : 3;
  VkQueryPoolCreateInfo qi{};
  qi.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
  qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
  qi.queryCount = static_cast<std::uint32_t>(2 * spans);
  VkQueryPool qp = VK_NULL_HANDLE;
  check(d.vkCreateQueryPool(b.device(), &qi, nullptr, &qp), "vkCreateQueryPool");
  std::vector<std::uint64_t> ts(static_cast<std::size_t>(2 * spans));
  const auto full_barrier = [&](VkCommandBuffer cmd) {
    b.barrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
              VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
  };
  const auto stream_barrier = [&](VkCommandBuffer cmd) {
    const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    b.barrier(cmd, stages, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, stages,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
  };
  try {
    b.run_commands([&](VkCommandBuffer cmd) {
      d.vkCmdResetQueryPool(cmd, qp, 0, qi.queryCount);
      int op = 0;
      for (int i = 0; i < warmup; ++i) {
        full_barrier(cmd);
        record(cmd, op++);
      }
      for (int s = 0; s < spans; ++s) {
        full_barrier(cmd);
        d.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, static_cast<std::uint32_t>(2 * s));
        for (int j = 0; j < k; ++j) {
          if (j > 0) stream_barrier(cmd);
          record(cmd, op++);
        }
        d.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, static_cast<std::uint32_t>(2 * s + 1));
      }
    });
    check(d.vkGetQueryPoolResults(b.device(), qp, 0, qi.queryCount, ts.size() * 8, ts.data(), 8,
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
          "vkGetQueryPoolResults");
  } catch (...) {
    d.vkDestroyQueryPool(b.device(), qp, nullptr);
    throw;
  }
  d.vkDestroyQueryPool(b.device(), qp, nullptr);
  const std::uint32_t bits = b.timestamp_bits();
  const std::uint64_t mask = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  const double ns_per_tick = b.timestamp_period_ns();
  std::vector<double> us;
  for (int s = 0; s < spans; ++s)
    us.push_back(static_cast<double>((ts[2 * s + 1] - ts[2 * s]) & mask) * ns_per_tick / 1000.0 / k);
  return bench::median(us);
}

class VulkanRunner final : public bench::BenchRunner {
 public:
  explicit VulkanRunner(DeviceExtension& device) : b_(device) {}

  double time_copy_us(std::int64_t bytes, int rotations, int iters) override {
    std::fprintf(stderr, "vulkan bench timing: %s (NF4_BENCH_TIMING)\n",
                 bench::timing_from_env() != bench::Timing::kEvents ? "batches of back-to-back dispatches between two timestamps"
                                                                    : "a timestamp pair around each dispatch");
    const VkDeviceSize size = round_up(static_cast<VkDeviceSize>(std::max<std::int64_t>(bytes, 16)), 16);
    std::vector<Buffer> src, dst;
    std::vector<std::unique_ptr<Job>> jobs;
    for (int r = 0; r < rotations; ++r) {
      src.push_back(b_.make_buffer(size, false));
      dst.push_back(b_.make_buffer(size, false));
    }
    b_.run_commands([&](VkCommandBuffer cmd) {
      for (auto& s : src) b_.fns().vkCmdFillBuffer(cmd, s.buffer, 0, VK_WHOLE_SIZE, 0x3c003c00u);
    });
    for (int r = 0; r < rotations; ++r) jobs.push_back(b_.kernels().prepare_copy({{{src[r].buffer, 0, size}, {dst[r].buffer, 0, size}}}));
    const double shader = time_us(b_, iters, [&](VkCommandBuffer cmd, int i) { jobs[static_cast<std::size_t>(i % rotations)]->record(cmd); });
    const double copy = time_us(b_, iters, [&](VkCommandBuffer cmd, int i) {
      const VkBufferCopy region{0, 0, size};
      b_.fns().vkCmdCopyBuffer(cmd, src[static_cast<std::size_t>(i % rotations)].buffer, dst[static_cast<std::size_t>(i % rotations)].buffer, 1,
                               &region);
    });
    if (std::getenv("NF4_VULKAN_BENCH_VERBOSE"))
      std::fprintf(stderr, "vulkan copy of %lld bytes: copy shader %.2f us, vkCmdCopyBuffer %.2f us\n", static_cast<long long>(bytes), shader,
                   copy);
    return std::min(shader, copy);  // the ceiling is the faster of the two
  }

  double time_dequantize_us(const nf4_tensor* host, std::size_t count, int rotations, int iters) override {
    Kernels& k = b_.kernels();
    const VkDeviceSize align = k.descriptor_alignment();
    for (std::size_t i = 0; i < count; ++i) validate_inputs(host[i]);  // outputs are the runner's
    struct Rotation {
      Buffer inputs, outputs;
      std::unique_ptr<Job> job;
    };
    std::vector<Rotation> rots(static_cast<std::size_t>(rotations));
    for (Rotation& rot : rots) {
      // Every tensor's arrays, whole, in one input buffer; outputs in another.
      std::vector<DeviceTensor> dts(count);
      std::vector<std::pair<VkDeviceSize, std::pair<const void*, std::size_t>>> pieces;
      VkDeviceSize in = 0, out = 0;
      const auto place = [&](Region& r, const void* p, std::int64_t bytes) {
        r = {VK_NULL_HANDLE, in, static_cast<VkDeviceSize>(bytes)};
        pieces.push_back({in, {p, static_cast<std::size_t>(bytes)}});
        in += round_up(static_cast<VkDeviceSize>(bytes), align);
      };
      for (std::size_t i = 0; i < count; ++i) {
        const nf4_tensor& t = host[i];
        const TensorSizes s = expected_sizes(t);
        DeviceTensor& dt = dts[i];
        dt.quant_type = t.quant_type;
        dt.out_dtype = t.out_dtype;
        dt.numel = t.numel;
        dt.blocksize = t.blocksize;
        dt.nested = t.nested != 0;
        dt.nested_blocksize = t.nested_blocksize;
        dt.nested_offset = t.nested_offset_ptr ? *t.nested_offset_ptr : t.nested_offset;
        place(dt.packed, t.packed, s.packed_bytes);
        place(dt.absmax, t.absmax, s.absmax_count * (t.nested ? 1 : 4));
        if (t.quant_map) place(dt.quant_map, t.quant_map, 64);
        if (t.nested) {
          place(dt.nested_absmax, t.nested_absmax, s.nested_absmax_count * 4);
          place(dt.nested_code, t.nested_code, 1024);
        }
        dt.out = {VK_NULL_HANDLE, out, static_cast<VkDeviceSize>(s.out_bytes)};
        out += round_up(static_cast<VkDeviceSize>(s.out_bytes), align);
      }
      rot.inputs = b_.make_buffer(in, false);
      rot.outputs = b_.make_buffer(out, false);
      b_.upload(rot.inputs, pieces);
      std::vector<std::int64_t> numels;
      for (DeviceTensor& dt : dts) {
        for (Region* r : {&dt.packed, &dt.absmax, &dt.quant_map, &dt.nested_absmax, &dt.nested_code})
          if (r->bytes) r->buffer = rot.inputs.buffer;
        dt.out.buffer = rot.outputs.buffer;
        numels.push_back(dt.numel);
      }
      const Plan plan = make_plan(numels, k.plan_params());
      std::vector<ChunkView> views;
      for (std::size_t i = 0; i < count; ++i) {
        auto v = chunk_views(dts[i], plan, i);
        views.insert(views.end(), v.begin(), v.end());
      }
      rot.job = k.prepare(views);
    }
    return time_us(b_, iters, [&](VkCommandBuffer cmd, int i) { rots[static_cast<std::size_t>(i % rotations)].job->record(cmd); });
  }

  std::int64_t cache_bytes() const override { return std::int64_t{64} << 20; }  // Vulkan cannot query L2; >= H100/H200's

  double time_gemv_us(const nf4_gemv_desc& g, int rotations, int iters) override {
    // The contract the backend runs for g (the fast one where the device has cooperative matrices
    // for x's dtype), one job per slice of rows as core runs it.
    ValidGemv valid = validate_gemv(g);
    valid.desc.mode = gemv_wants_fast(g) && b_.kernels().gemv_fast(g.x_dtype) ? NF4_GEMV_FAST : NF4_GEMV_EXACT;
    const std::size_t rots = static_cast<std::size_t>(std::max(rotations, 1));
    std::vector<GemvBuffers> buffers;
    std::vector<std::vector<std::unique_ptr<Job>>> jobs(rots);
    for (std::size_t r = 0; r < rots; ++r)
      for_each_gemv_slice(valid, [&](std::int32_t, const ValidGemv& slice) {
        buffers.push_back(b_.upload_gemv(slice, false));
        jobs[r].push_back(b_.kernels().prepare_gemv(buffers.back().view));
      });
    return time_us(b_, iters, [&](VkCommandBuffer cmd, int i) {
      for (const auto& job : jobs[static_cast<std::size_t>(i) % rots]) job->record(cmd);
    });
  }
 private:
  DeviceExtension& b_;
};

}  // namespace
}  // namespace nf4::vk

std::unique_ptr<nf4::bench::BenchRunner> nf4::bench::make_vulkan_runner(Backend& backend) {
  auto* device = backend.extension<vk::DeviceExtension>();
  NF4_CHECK(device != nullptr);
  return std::make_unique<vk::VulkanRunner>(*device);
}
