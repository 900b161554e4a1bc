// SPDX-License-Identifier: MIT
#include "backends/cuda/gemv_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/cuda/alignment.h"
#include "backends/cuda/host_math.h"
#include "core/env.h"
#include "core/error.h"
#include "core/format.h"
#include "core/gemv.h"
#include "core/log.h"
#include "core/types.h"

namespace nf4::cuda {

namespace {

// `owner` names whose array `field` is ("weight "), or is empty.
void need_aligned(const void* p, std::size_t a, std::string_view field, std::string_view owner = {}) {
  if (!aligned(p, a)) fail(NF4_ERR_INVALID_ARGUMENT, "gemv: {}{} must be {}-byte aligned on the cuda backend, got address {}", owner, field, a, p);
}

// A rule of this backend's kernels (alignment.h), so checked here and not by validate_gemv.
void check_gemv_alignment(const nf4_gemv_desc& g) {
  for_each_weight_array(*g.weight, [](const void* p, std::size_t a, const char* field) { need_aligned(p, a, field, "weight "); });
  need_aligned(g.x, nf4_dtype_size(g.x_dtype), "x");
  need_aligned(g.y, nf4_dtype_size(g.y_dtype), "y");
  if (g.workspace) need_aligned(g.workspace, 16, "workspace");  // the split form's 16-byte stores
}

// NF4_GEMV_CONFIG, read once (see GemvChoice).
const GemvChoice& env_choice() {
  static const GemvChoice choice = [] {
    GemvChoice c;
    const char* s = env_value(EnvVar::kGemvConfig);
    if (!s || !*s) return c;
    if (std::string_view(s) == "legacy") {
      c.legacy = true;
      return c;
    }
    GemvFastTuning t{0, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, 0};
    long long xs[4] = {0, 0, 0, 0};
    const int fields = std::sscanf(s, "%d,%d,%d,%d,%d,%lld,%lld,%lld,%lld,%d", &t.threads, &t.rows[0], &t.rows[1], &t.rows[2],
                                   &t.rows[3], &xs[0], &xs[1], &xs[2], &xs[3], &t.split);
    if ((fields != 9 && fields != 10) || (std::copy(xs, xs + 4, t.x_shared_max), !gemv_fast_has_variant(t)))
      fail(NF4_ERR_INVALID_ARGUMENT,
           "NF4_GEMV_CONFIG='{}': expected 'legacy' or threads,rows_m1,rows_m2,rows_m4,rows_m8, four x_shared_max_bytes "
           "(buckets m = 1, 2, 3-4, 5-8) and optionally split (0 = per shape, 1, 2, 4 or 8 warps per row group) naming a "
           "compiled variant (backends/cuda/gemv_launch.h)",
           s);
    c.fast = t;
    return c;
  }();
  return choice;
}

// "wgmma64_split", "wgmma128_split" or "wgmma256_split", optionally followed by the parts per CTA
// (1, 2, 4 or 8; "wgmma256" is "wgmma256_split" by its model).
bool parse_split(std::string_view f, GemvMmaChoice& c) {
  const std::pair<std::string_view, GemvMmaKernel> forms[] = {{"wgmma64_split", GemvMmaKernel::wgmma64_split},
                                                              {"wgmma128_split", GemvMmaKernel::wgmma128_split},
                                                              {"wgmma256_split", GemvMmaKernel::wgmma256}};
  for (const auto& [name, kernel] : forms) {
    if (f.substr(0, name.size()) != name) continue;
    const std::string_view parts = f.substr(name.size());
    if (!parts.empty() && (parts.size() != 1 || std::string_view("1248").find(parts[0]) == std::string_view::npos)) return false;
    c.kernel = kernel;
    c.cluster_parts = parts.empty() ? 0 : parts[0] - '0';
    return true;
  }
  return false;
}

// NF4_GEMV_MMA, read once: the fast contract's kernel for A/B runs, "kernel[,schedule]" with kernel
// ring|stream1|stream2|wide32|wide64|wgmma64|wgmma128|wgmma256|wgmma64_cluster[1|2|4]|
// wgmma64_split[1|2|4|8]|wgmma128_split[1|2|4|8]|wgmma256_split[1|2|4|8] (parts per CTA) and
// schedule split|single
// (gemv_launch.h).
const GemvMmaChoice& env_mma_choice() {
  static const GemvMmaChoice choice = [] {
    GemvMmaChoice c;
    const char* s = env_value(EnvVar::kGemvMma);
    if (!s || !*s) return c;
    const std::string_view v(s);
    std::size_t at = 0;
    int field = 0;
    bool ok = true;
    while (ok && at <= v.size()) {
      const std::size_t end = std::min(v.find(',', at), v.size());
      const std::string_view f = v.substr(at, end - at);
      if (field == 0 && f == "ring") c.kernel = GemvMmaKernel::ring;
      else if (field == 0 && f == "stream1") c.kernel = GemvMmaKernel::stream1;
      else if (field == 0 && f == "stream2") c.kernel = GemvMmaKernel::stream2;
      else if (field == 0 && f == "wide32") c.kernel = GemvMmaKernel::wide32;
      else if (field == 0 && f == "wide64") c.kernel = GemvMmaKernel::wide64;
      else if (field == 0 && f == "wgmma64") c.kernel = GemvMmaKernel::wgmma64;
      else if (field == 0 && f == "wgmma128") c.kernel = GemvMmaKernel::wgmma128;
      else if (field == 0 && f == "wgmma256") c.kernel = GemvMmaKernel::wgmma256;
      else if (field == 0 && f == "wgmma64_cluster") c.kernel = GemvMmaKernel::wgmma64_cluster;
      else if (field == 0 && (f == "wgmma64_cluster1" || f == "wgmma64_cluster2" || f == "wgmma64_cluster4")) {
        c.kernel = GemvMmaKernel::wgmma64_cluster;
        c.cluster_parts = f.back() - '0';
      }
      else if (field == 0 && parse_split(f, c)) {}
      else if (field == 1 && f == "split") c.schedule = GemvMmaSchedule::split;
      else if (field == 1 && f == "single") c.schedule = GemvMmaSchedule::single;
      else ok = false;
      ++field;
      at = end + 1;
    }
    if (!ok || field > 2)
      fail(NF4_ERR_INVALID_ARGUMENT, "NF4_GEMV_MMA='{}': expected kernel[,schedule] with kernel ring, stream1, stream2, wide32, wide64, wgmma64, wgmma128, "
           "wgmma256, wgmma64_cluster (wgmma64_cluster1, wgmma64_cluster2, wgmma64_cluster4: parts per CTA), wgmma64_split, "
           "wgmma128_split or wgmma256_split (a digit 1, 2, 4 or 8 after any: parts per CTA; they and wgmma256 need a "
           "workspace) and schedule split or single", s);
    return c;
  }();
  return choice;
}

// A fast product's plan at NF4_LOG=debug: which kernel the automatic choice took, its grid and
// how k is split, for the A/B runs that tune the choice (docs/GEMV.md).
void log_fast_plan(const GemvPlan& p, const nf4_gemv_desc& g) {
  if (!log_enabled(NF4_LOG_DEBUG)) return;
  const char* name = "?";
#if CUDART_VERSION >= 12030
  if (cudaFuncGetName(&name, p.kernel.fn) != cudaSuccess) name = "?";
#endif
  log(NF4_LOG_DEBUG, "gemv fast {}x{} m {}: {} grid {} x {} (cluster {}), k in 2^{} parts, 2^{} per CTA, workspace {} bytes{}{}", g.n, g.k, g.m,
      name, p.kernel.grid, p.kernel.threads, p.kernel.cluster, unsigned{p.args.log2_split}, unsigned{p.args.log2_part_group}, p.kernel.workspace_bytes,
      p.kernel.before_fn ? ", x image first" : "", p.kernel.then_fn ? ", addition after" : "");
}

// plan_product with room for `workspace` bytes of the split form's sums (desc.workspace is set in
// the arguments where the plan uses it).
GemvPlan plan_with_workspace(const ValidGemv& valid, const DeviceInfo& dev, const GemvChoice& forced_in, std::size_t workspace) {
  const nf4_gemv_desc& g = valid.desc;
  check_gemv_alignment(g);
  const nf4_tensor& t = *g.weight;
  GemvPlan p{};
  GemvArgs& a = p.args;
  a.packed = t.packed;
  a.absmax = t.absmax;
  a.quant_map = uses_quant_map(t.quant_type) ? t.quant_map : nullptr;
  a.log2_blocksize = static_cast<std::uint8_t>(log2_exact(t.blocksize));
  if (t.nested) {
    a.nested = 1;
    a.nested_absmax = t.nested_absmax;
    a.nested_code = t.nested_code;
    a.offset_ptr = t.nested_offset_ptr;
    a.offset_value = t.nested_offset;
    a.log2_nested_blocksize = static_cast<std::uint8_t>(log2_exact(t.nested_blocksize));
  }
  a.x = g.x;
  a.y = g.y;
  a.n = g.n;
  a.k = g.k;
  a.m = g.m;
  a.y_dtype = g.y_dtype;
  a.pad_bits = gemv_pad_bits(g.k);
  a.vector = (g.k % 32 == 0 && aligned(t.packed, 16) && aligned(g.x, 16)) ? 1 : 0;
  const float* builtin = find_quant_type(enum_bits(t.quant_type))->builtin_values;  // else quant_map
  for (unsigned q = 0; q < 16; ++q) a.fp4_table[q] = builtin ? builtin[q] : 0.0f;
  p.x_size = static_cast<std::uint8_t>(nf4_dtype_size(g.x_dtype));
  if (g.mode == NF4_GEMV_FAST) {
    a.absmax_count = valid.sizes.weight.absmax_count;
    const GemvMmaChoice& mma = forced_in.mma.automatic() ? env_mma_choice() : forced_in.mma;
    check(plan_gemv_mma(a, g.x_dtype, dev.cc, mma, dev.sms, workspace, &p.kernel), "gemv tensor-core kernel plan");
    if (p.kernel.workspace_bytes) a.workspace = static_cast<float*>(g.workspace);
    return p;
  }
  const bool from_test = forced_in.legacy || forced_in.tuning || forced_in.fast;
  const GemvChoice& forced = from_test ? forced_in : env_choice();
  if (a.vector && !forced.legacy && dev.cc >= 80) {
    const GemvFastTuning* fast = forced.fast ? &*forced.fast : gemv_fast_tuning_for(dev.cc);
    // A device whose shared memory cannot hold the fast kernel's table, a build without its
    // code for this device, or a k past its 32-bit offsets, falls through.
    if (fast) {
      const cudaError_t e = plan_gemv_fast(a, g.x_dtype, *fast, dev.sms, &p.kernel);
      if (e != cudaErrorInvalidConfiguration || forced.fast) {
        check(e, "gemv kernel plan");
        return p;
      }
    }
  }
  const GemvTuning tuning = forced.tuning ? *forced.tuning : gemv_tuning_for(dev.cc);
  check(plan_gemv(a, g.x_dtype, tuning, dev.sms, &p.kernel), "gemv kernel plan");
  return p;
}

}  // namespace

GemvPlan plan_product(const ValidGemv& valid, const DeviceInfo& dev, const GemvChoice& forced) {
  GemvPlan p = plan_with_workspace(valid, dev, forced, valid.desc.workspace ? static_cast<std::size_t>(valid.desc.workspace_bytes) : 0);
  if (valid.desc.mode == NF4_GEMV_FAST) log_fast_plan(p, valid.desc);  // a product's plan, not a size query's
  return p;
}

std::int64_t gemv_workspace_bytes(const ValidGemv& g, const DeviceInfo& dev, const GemvChoice& forced) {
  if (g.desc.mode != NF4_GEMV_FAST) return 0;
  return static_cast<std::int64_t>(plan_with_workspace(g, dev, forced, SIZE_MAX).kernel.workspace_bytes);
}

bool gemv_fast_supported(const ValidGemv& g, const DeviceInfo& dev) {
  if (!gemv_mma_available(dev.cc, g.desc.x_dtype)) return false;
  // A build without code for this device (compute_75 PTX only, say) plans no kernel: exact contract.
  GemvPlan p{};
  p.args.n = g.desc.n;
  p.args.k = g.desc.k;
  p.args.m = g.desc.m;
  p.args.absmax_count = g.sizes.weight.absmax_count;
  return plan_gemv_mma(p.args, g.desc.x_dtype, dev.cc, GemvMmaChoice{}, dev.sms, 0, &p.kernel) == cudaSuccess;
}

void enqueue_gemv(const ValidGemv& g, cudaStream_t stream, const DeviceInfo& dev, const GemvChoice& forced) {
  const GemvPlan p = plan_product(g, dev, forced);
  check(enqueue_gemv_plan(p.kernel, p.args, stream), "gemv kernel launch");
}

void enqueue_gemv_prepared(const GemvPlan& plan, const void* x, void* y, cudaStream_t stream) {
  need_aligned(x, plan.args.vector ? 16 : plan.x_size, plan.args.vector ? "x (16-byte aligned when prepared)" : "x");
  need_aligned(y, nf4_dtype_size(static_cast<nf4_dtype>(plan.args.y_dtype)), "y");
  GemvArgs a = plan.args;
  a.x = x;
  a.y = y;
  check(enqueue_gemv_plan(plan.kernel, a, stream), "gemv kernel launch");
}

DeviceGemv::DeviceGemv(const ValidGemv& host, std::int64_t workspace_bytes) : host_weight_(*host.desc.weight) {
  const nf4_gemv_desc& h = host.desc;
  const GemvSizes& s = host.sizes;
  const nf4_tensor& t = host_weight_;
  std::size_t total = 0;
  const auto slot = [&](const void* src, std::int64_t bytes) {
    const std::size_t at = total;
    total += (static_cast<std::size_t>(bytes) + 255) / 256 * 256;
    if (src) copies_[copy_count_++] = Copy{at, src, static_cast<std::size_t>(bytes)};
    return at;
  };
  const std::size_t packed = slot(t.packed, s.weight.packed_bytes);
  const std::size_t absmax = slot(t.absmax, s.weight.absmax_count * (t.nested ? 1 : 4));
  const std::size_t qmap = t.quant_map ? slot(t.quant_map, 64) : 0;
  std::size_t nabs = 0, code = 0, offset = 0;
  if (t.nested) {
    nabs = slot(t.nested_absmax, s.weight.nested_absmax_count * 4);
    code = slot(t.nested_code, 1024);
    if (t.nested_offset_ptr) offset = slot(t.nested_offset_ptr, 4);
  }
  const std::size_t x = slot(h.x, s.x_bytes);
  y_offset_ = slot(nullptr, s.y_bytes);
  const std::size_t workspace = slot(nullptr, workspace_bytes);
  y_bytes_ = static_cast<std::size_t>(s.y_bytes);
  buffer_ = DeviceBuffer(total);
  auto* base = static_cast<std::uint8_t*>(buffer_.get());
  dev_weight_ = t;
  dev_weight_.packed = base + packed;
  dev_weight_.absmax = base + absmax;
  if (t.quant_map) dev_weight_.quant_map = reinterpret_cast<const float*>(base + qmap);
  if (t.nested) {
    dev_weight_.nested_absmax = reinterpret_cast<const float*>(base + nabs);
    dev_weight_.nested_code = reinterpret_cast<const float*>(base + code);
    if (t.nested_offset_ptr) dev_weight_.nested_offset_ptr = reinterpret_cast<const float*>(base + offset);
  }
  dev_weight_.out = nullptr;
  dev_weight_.out_bytes = 0;
  dev_ = host;
  dev_.desc.weight = &dev_weight_;
  dev_.desc.x = base + x;
  dev_.desc.y = base + y_offset_;
  dev_.desc.y_bytes = s.y_bytes;
  dev_.desc.workspace = workspace_bytes > 0 ? base + workspace : nullptr;
  dev_.desc.workspace_bytes = workspace_bytes;
}

void DeviceGemv::upload(cudaStream_t stream) {
  auto* base = static_cast<std::uint8_t*>(buffer_.get());
  for (int i = 0; i < copy_count_; ++i)
    check(cudaMemcpyAsync(base + copies_[i].offset, copies_[i].src, copies_[i].bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
}

void DeviceGemv::download_y(cudaStream_t stream, void* host_y) const {
  check(cudaMemcpyAsync(host_y, static_cast<const std::uint8_t*>(buffer_.get()) + y_offset_, y_bytes_, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
}

void gemv_host(const ValidGemv& g, cudaStream_t stream, const DeviceInfo& dev) {
  // Its own workspace where the fastest plan takes one (the caller's, a host pointer, is not used).
  ValidGemv host = g;
  host.desc.workspace = nullptr;
  host.desc.workspace_bytes = 0;
  DeviceGemv d(host, gemv_workspace_bytes(host, dev));
  d.upload(stream);
  enqueue_gemv(d.valid(), stream, dev);
  d.download_y(stream, g.desc.y);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace nf4::cuda
