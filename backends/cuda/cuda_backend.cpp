// SPDX-License-Identifier: MIT
// The cuda backend: planning (core), one kernel launch per dispatch on the caller's stream, host
// staging for nf4_dequantize_host. Plain C++: kernels live in kernels.cu behind kernels.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/alignment.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/gemv_backend.h"
#include "backends/cuda/host_math.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tuning.h"
#include "core/backend.h"
#include "core/env.h"
#include "core/error.h"
#include "core/format.h"
#include "core/plan.h"
#include "core/tensor.h"
#include "core/types.h"

namespace nf4::cuda {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls on this thread start clean
  if (e == cudaErrorMemoryAllocation) fail(NF4_ERR_OUT_OF_MEMORY, "{}: out of device memory ({})", what, cudaGetErrorString(e));
  fail(NF4_ERR_DEVICE, "{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  ptr_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // cannot throw from a destructor; a failed free is a lost buffer
}

DeviceInfo query_device(int device) {
  DeviceInfo d;
  d.id = device;
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
  d.l2_bytes = l2;
  d.cc = major * 10 + minor;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  d.name = prop.name;
  return d;
}

namespace {

// The driver's current-context calls, reached through the runtime (the library links only the
// static runtime, never libcuda): the one way to tell "no context" from "device 0" and restore it.
using CtxGetCurrent = int (*)(void** ctx);
using CtxSetCurrent = int (*)(void* ctx);
struct ContextCalls {
  CtxGetCurrent get = nullptr;
  CtxSetCurrent set = nullptr;
};

const ContextCalls& context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found_get{}, found_set{};
#if CUDART_VERSION >= 12050
    const bool ok = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found_get) == cudaSuccess &&
                    cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found_set) == cudaSuccess;
#else
    const bool ok = cudaGetDriverEntryPoint("cuCtxGetCurrent", &get, cudaEnableDefault, &found_get) == cudaSuccess &&
                    cudaGetDriverEntryPoint("cuCtxSetCurrent", &set, cudaEnableDefault, &found_set) == cudaSuccess;
#endif
    if (ok && found_get == cudaDriverEntryPointSuccess && found_set == cudaDriverEntryPointSuccess) {
      c.get = reinterpret_cast<CtxGetCurrent>(get);
      c.set = reinterpret_cast<CtxSetCurrent>(set);
    } else {
      cudaGetLastError();
    }
    return c;
  }();
  return calls;
}

}  // namespace

DeviceScope::DeviceScope(int device) {
  if (device < 0) return;
  check(cudaGetDevice(&previous_device_), "cudaGetDevice");
  if (previous_device_ == device) return;
  const ContextCalls& calls = context_calls();
  if (calls.get && calls.get(&previous_context_) != 0) previous_context_ = nullptr;
  check(cudaSetDevice(device), "cudaSetDevice");
  switched_ = true;
}

DeviceScope::~DeviceScope() {
  if (!switched_) return;
  // Cannot throw from a destructor; a failed restore leaves the scope's device current.
  const ContextCalls& calls = context_calls();
  if (calls.set) calls.set(previous_context_);
  else cudaSetDevice(previous_device_);
}

namespace {

// NF4_CUDA_CONFIG=threads,units,hints,grid[,options] replaces the tuning table (experiments, A/B);
// grid is `group` (one CTA per group), `N/sm` or `Nxocc` (N times the resident CTAs per SM).
std::optional<KernelConfig> config_override() {
  const char* s = env_value(EnvVar::kCudaConfig);
  if (!s || !*s) return std::nullopt;
  KernelConfig c{};
  char grid[16] = {};
  const int fields = std::sscanf(s, "%d,%d,%d,%15[^,],%d", &c.threads, &c.units, &c.hints, grid, &c.options);
  int factor = 0;
  char unit[8] = {};
  bool grid_ok = std::strcmp(grid, "group") == 0;
  if (!grid_ok && std::sscanf(grid, "%d%7s", &factor, unit) == 2 && factor > 0) {
    if (std::strcmp(unit, "/sm") == 0) c.grid = Grid::per_sm(factor), grid_ok = true;
    if (std::strcmp(unit, "xocc") == 0) c.grid = Grid::occupancy(factor), grid_ok = true;
  }
  if (fields < 4 || !grid_ok || c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0)
    fail(NF4_ERR_INVALID_ARGUMENT,
         "NF4_CUDA_CONFIG='{}': expected threads,units,hints,grid[,options] with threads a multiple of 32 up to 1024 and grid "
         "group, N/sm or Nxocc",
         s);
  if (!has_variant(NF4_DTYPE_F16, c))
    fail(NF4_ERR_INVALID_ARGUMENT, "NF4_CUDA_CONFIG='{}': units {}, hints {}, options {} is not compiled in (backends/cuda/variants.h)", s,
         c.units, c.hints, c.options);
  return c;
}

// NF4_CUDA_CONFIG_LIVE=1 (read at context creation): NF4_CUDA_CONFIG is read again for every call
// planned, instead of once (experiments only: an environment read and a parse per call).
bool live_override_wanted() {
  const char* s = env_value(EnvVar::kCudaConfigLive);
  return s && std::strcmp(s, "1") == 0;
}

// Float arrays must be 4-byte aligned and out aligned to its element, as any C array of that
// type is; packed may start at any byte. (Vector alignment is the kernel's business: it takes
// a scalar path where packed or out are not aligned for 16-byte access.)
void check_alignment(const nf4_tensor& t, std::size_t index, std::size_t count) {
  const auto need = [&](const void* p, std::size_t a, const char* field) {
    if (!aligned(p, a))
      fail(NF4_ERR_INVALID_ARGUMENT, "{}: {} must be {}-byte aligned on the cuda backend, got address {}", tensor_label(index, count), field,
           a, p);
  };
  for_each_weight_array(t, need);
  need(t.out, nf4_dtype_size(t.out_dtype), "out");
}

PlanParams plan_params(const KernelConfig& c, nf4_dtype d, std::int64_t max_chunk_elements) {
  PlanParams p;
  p.elements_per_item = std::int64_t{c.units} * unit_elements(d);
  p.items_per_group = c.threads;
  p.max_groups = 0x7fffffff;  // groups are loop iterations of the CTAs, first_group stays 32-bit
  p.max_elements_per_chunk = std::min(max_chunk_elements, kMaxChunkElements);
  p.chunk_alignment = 2;      // chunks start at a whole packed byte (per_group is even anyway)
  p.max_chunks_per_dispatch = kMaxChunksPerLaunch;
  return p;
}

ChunkArgs chunk_args(const nf4_tensor& t, const Chunk& c) {
  ChunkArgs a{};
  const std::int64_t first = c.first_element;
  const int lb = log2_exact(t.blocksize);
  const std::int64_t first_block = first >> lb;
  a.packed = t.packed + first / 2;
  a.block_rem = static_cast<std::uint32_t>(first & (t.blocksize - 1));
  a.log2_blocksize = static_cast<std::uint8_t>(lb);
  if (t.nested) {
    const int lb2 = log2_exact(t.nested_blocksize);
    a.absmax = static_cast<const std::uint8_t*>(t.absmax) + first_block;
    a.nested_absmax = t.nested_absmax + (first_block >> lb2);
    a.nested_rem = static_cast<std::uint32_t>(first_block & (t.nested_blocksize - 1));
    a.log2_nested_blocksize = static_cast<std::uint8_t>(lb2);
    a.nested_code = t.nested_code;
    a.offset_ptr = t.nested_offset_ptr;
    a.offset_value = t.nested_offset;
    a.nested = 1;
  } else {
    a.absmax = static_cast<const float*>(t.absmax) + first_block;
  }
  a.quant_map = uses_quant_map(t.quant_type) ? t.quant_map : nullptr;
  const std::size_t es = nf4_dtype_size(t.out_dtype);
  a.out = static_cast<char*>(t.out) + static_cast<std::size_t>(first) * es;
  a.n = static_cast<std::uint32_t>(c.element_count);
  a.first_group = static_cast<std::uint32_t>(c.first_group);
  const std::size_t code_bytes = static_cast<std::size_t>(unit_elements(t.out_dtype)) / 2;
  const bool vec = reinterpret_cast<std::uintptr_t>(a.packed) % code_bytes == 0 && reinterpret_cast<std::uintptr_t>(a.out) % 16 == 0;
  a.align = vec ? kAlignVector : 0;
  return a;
}

}  // namespace

PreparedCall::PreparedCall(std::span<const ValidTensor> tensors, const DeviceInfo& dev, const std::optional<KernelConfig>& forced,
                           std::int64_t max_chunk_elements, Launcher launcher)
    : tensors_(tensors.begin(), tensors.end()), launcher_(launcher), sms_(dev.sms) {
  for (std::size_t i = 0; i < tensors_.size(); ++i) check_alignment(tensors_[i].t, i, tensors_.size());
  // The kernel is specialized on the output dtype, and a launch carries one built-in value table
  // (LaunchArgs::fp4_table, for the chunks without a stored quant_map): one plan (and its launches)
  // per dtype and built-in table present, the tensors with stored tables in the first of their dtype.
  const auto builtin = [](const nf4_tensor& t) { return find_quant_type(enum_bits(t.quant_type))->builtin_values; };
  for (nf4_dtype d : all_dtypes()) {
    std::vector<const float*> tables;
    for (const ValidTensor& v : tensors_)
      if (v.t.out_dtype == d && builtin(v.t) && std::find(tables.begin(), tables.end(), builtin(v.t)) == tables.end())
        tables.push_back(builtin(v.t));
    if (tables.empty()) tables.push_back(nullptr);
    for (std::size_t ti = 0; ti < tables.size(); ++ti) {
      std::vector<std::size_t> index;
      std::vector<std::int64_t> numels;
      std::int64_t total = 0;
      for (std::size_t i = 0; i < tensors_.size(); ++i)
        if (tensors_[i].t.out_dtype == d && (builtin(tensors_[i].t) == tables[ti] || (ti == 0 && !builtin(tensors_[i].t)))) {
          index.push_back(i);
          numels.push_back(tensors_[i].t.numel);
          total += tensors_[i].t.numel;
        }
      if (index.empty()) continue;
      const KernelConfig cfg = forced ? *forced : select_config(dev.cc, total, index.size());
      const Plan plan = make_plan(numels, plan_params(cfg, d, max_chunk_elements));
      for (const Dispatch& disp : plan.dispatches) {
        NF4_CHECK(disp.chunks.size() <= static_cast<std::size_t>(kMaxChunksPerLaunch));
        Launch l{d, cfg, {}, {}, disp.chunks};
        for (unsigned q = 0; q < 16; ++q) l.args.fp4_table[q] = tables[ti] ? tables[ti][q] : 0.0f;
        l.args.chunk_count = static_cast<std::uint32_t>(disp.chunks.size());
        l.args.total_groups = static_cast<std::uint32_t>(disp.groups);
        for (std::size_t c = 0; c < l.chunks.size(); ++c) {
          l.chunks[c].tensor = index[l.chunks[c].tensor];
          l.args.chunks[c] = chunk_args(tensors_[l.chunks[c].tensor].t, l.chunks[c]);
        }
        if (!launcher_) check(resolve_dequantize(d, cfg, l.args.chunk_count, l.args.total_groups, sms_, &l.kernel), "kernel resolution");
        launches_.push_back(std::move(l));
      }
    }
  }
}

void PreparedCall::enqueue(cudaStream_t stream, void* const* outs, const nf4_buffers* buffers) const {
  const bool substitute = outs || buffers;
  if (substitute)
    for (std::size_t i = 0; i < tensors_.size(); ++i) check_alignment(with_buffers(tensors_[i], i, outs, buffers), i, tensors_.size());
  LaunchArgs patched;
  for (const Launch& l : launches_) {
    const LaunchArgs* args = &l.args;
    if (substitute) {
      patched = l.args;
      for (std::size_t c = 0; c < l.chunks.size(); ++c) {
        const std::size_t t = l.chunks[c].tensor;
        patched.chunks[c] = chunk_args(with_buffers(tensors_[t], t, outs, buffers), l.chunks[c]);
      }
      args = &patched;
    }
    check(launcher_ ? launcher_(l.dtype, l.config, *args, sms_, stream) : launch_resolved(l.kernel, *args, stream), "kernel launch");
  }
}

void enqueue(const nf4_tensor* tensors, std::size_t count, cudaStream_t stream, const DeviceInfo& dev,
             const std::optional<KernelConfig>& forced, std::int64_t max_chunk_elements, Launcher launcher) {
  if (count == 0) return;
  // Everything is validated and planned before the first launch: on any error nothing is written.
  PreparedCall(validate_call(tensors, count), dev, forced, max_chunk_elements, launcher).enqueue(stream);
}

// ---- host staging -------------------------------------------------------------------------

DeviceTensors::DeviceTensors(const nf4_tensor* host, std::size_t count) : host_(host, host + count) {
  // One allocation holding every array, each at a 256-byte boundary (so the kernel takes its
  // vector path whatever the host pointers' alignment).
  std::size_t total = 0;
  const auto slot = [&](std::int64_t bytes) {
    const std::size_t at = total;
    total += (static_cast<std::size_t>(bytes) + 255) / 256 * 256;
    return at;
  };
  struct Offsets {
    std::size_t packed, absmax, quant_map, nested_absmax, nested_code, offset, out;
  };
  std::vector<Offsets> off(count);
  for (std::size_t i = 0; i < count; ++i) {
    const nf4_tensor& t = host[i];
    const TensorSizes s = expected_sizes(t);
    off[i].packed = slot(s.packed_bytes);
    off[i].absmax = slot(s.absmax_count * (t.nested ? 1 : 4));
    off[i].quant_map = t.quant_map ? slot(16 * 4) : 0;
    if (t.nested) {
      off[i].nested_absmax = slot(s.nested_absmax_count * 4);
      off[i].nested_code = slot(256 * 4);
      off[i].offset = t.nested_offset_ptr ? slot(4) : 0;
    }
    off[i].out = slot(s.out_bytes);
  }
  buffer_ = DeviceBuffer(total);
  auto* base = static_cast<std::uint8_t*>(buffer_.get());
  device_ = host_;
  for (std::size_t i = 0; i < count; ++i) {
    const nf4_tensor& h = host[i];
    nf4_tensor& d = device_[i];
    const TensorSizes s = expected_sizes(h);
    const auto put = [&](std::size_t at, const void* src, std::int64_t bytes) {
      uploads_.push_back(Copy{base + at, src, static_cast<std::size_t>(bytes)});
      return base + at;
    };
    d.packed = put(off[i].packed, h.packed, s.packed_bytes);
    d.absmax = put(off[i].absmax, h.absmax, s.absmax_count * (h.nested ? 1 : 4));
    if (h.quant_map) d.quant_map = reinterpret_cast<const float*>(put(off[i].quant_map, h.quant_map, 16 * 4));
    if (h.nested) {
      d.nested_absmax = reinterpret_cast<const float*>(put(off[i].nested_absmax, h.nested_absmax, s.nested_absmax_count * 4));
      d.nested_code = reinterpret_cast<const float*>(put(off[i].nested_code, h.nested_code, 256 * 4));
      if (h.nested_offset_ptr) d.nested_offset_ptr = reinterpret_cast<const float*>(put(off[i].offset, h.nested_offset_ptr, 4));
    }
    d.out = base + off[i].out;
    d.out_bytes = s.out_bytes;
  }
}

void DeviceTensors::upload(cudaStream_t stream) {
  for (const Copy& c : uploads_) check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
}

void DeviceTensors::download(cudaStream_t stream) {
  for (std::size_t i = 0; i < host_.size(); ++i) {
    // Only numel elements: never past them, even where the caller's out_bytes is larger.
    const std::int64_t bytes = expected_sizes(host_[i]).out_bytes;
    check(cudaMemcpyAsync(host_[i].out, device_[i].out, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (download)");
  }
}

// ---- the backend ----------------------------------------------------------------------------

namespace {

constexpr BackendCaps kCudaCaps{.device_pointers = true, .device_pointers_are_host = false, .prepared_launch = true, .prepared_gemv = true,
                                 .gemv_fast = GemvFastSupport::some};

// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 50 MiB L2)"
std::string describe(const DeviceInfo& d) { return fmt::format("{} (sm_{}, {} SMs, {} MiB L2)", d.name, d.cc, d.sms, d.l2_bytes >> 20); }

// A context without a chosen device (nf4_context_create) runs every call on the calling thread's
// current device; one on a chosen device (nf4_context_create_on_device) enters a DeviceScope of it
// around every call and launch that touches the device.
class CudaBackend final : public Backend, public CudaStreamExtension, public DeviceExtension {
 public:
  explicit CudaBackend(DeviceChoice device)
      : forced_(config_override()), live_override_(live_override_wanted()), chosen_(device ? static_cast<int>(*device) : -1) {
    int dev = chosen_;
    if (dev < 0) check(cudaGetDevice(&dev), "cudaGetDevice");
    devices_.resize(static_cast<std::size_t>(dev) + 1);
    devices_[dev] = query_device(dev);
    name_ = devices_[dev]->name;
  }
  ~CudaBackend() override;

  nf4_backend_kind kind() const override { return NF4_BACKEND_CUDA; }
  std::string device_name() const override { return name_; }
  std::optional<std::size_t> device_index() const override {
    return chosen_ >= 0 ? std::optional<std::size_t>(static_cast<std::size_t>(chosen_)) : std::nullopt;
  }
  BackendCaps capabilities() const override { return kCudaCaps; }

  void dequantize(std::span<const ValidTensor> tensors) override {
    const DeviceScope scope(chosen_);
    PreparedCall(tensors, current(), forced()).enqueue(stream());
  }

  void dequantize_host(std::span<const ValidTensor> tensors) override {
    const DeviceScope scope(chosen_);  // entered first: the staging buffers are freed inside it
    std::vector<nf4_tensor> host;
    for (const ValidTensor& v : tensors) host.push_back(v.t);
    DeviceTensors dt(host.data(), host.size());
    const cudaStream_t s = stream();
    dt.upload(s);
    // The staged copies are fresh, 256-byte aligned and disjoint: valid by construction.
    std::vector<ValidTensor> staged;
    for (std::size_t i = 0; i < host.size(); ++i) staged.push_back(ValidTensor{dt.tensors()[i], tensors[i].sizes});
    PreparedCall(staged, current(), forced()).enqueue(s);
    dt.download(s);
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }  // dt frees its device memory on every path (RAII)

  std::unique_ptr<PreparedLaunch> prepare(std::span<const ValidTensor> tensors) override;

  void set_cuda_stream(void* stream) override {
    check_stream_device(static_cast<cudaStream_t>(stream));
    stream_.store(static_cast<cudaStream_t>(stream), std::memory_order_relaxed);
  }
  cudaStream_t stream() const { return stream_.load(std::memory_order_relaxed); }

  // ---- matrix-vector product (gemv_backend.cpp) ----
  void gemv(const ValidGemv& g) override {
    const DeviceScope scope(chosen_);
    enqueue_gemv(g, stream_, current());
  }
  void gemv_host(const ValidGemv& g) override {
    const DeviceScope scope(chosen_);
    cuda::gemv_host(g, stream_, current());
  }
  std::int64_t gemv_workspace_bytes(const ValidGemv& g) override {
    const DeviceScope scope(chosen_);
    return cuda::gemv_workspace_bytes(g, current());
  }
  bool gemv_fast(const ValidGemv& g) override {
    const DeviceScope scope(chosen_);
    return gemv_fast_supported(g, current());
  }
  std::unique_ptr<PreparedGemv> prepare_gemv(const ValidGemv& g) override;

  // The chosen device, or -1 (DeviceScope changes nothing then).
  int chosen_device() const override { return chosen_; }

  // Properties of the device calls run on: the chosen one, else the current one (a context without
  // a chosen device may be used with another current device at each call).
  const DeviceInfo& current() {
    if (chosen_ >= 0) return *devices_[static_cast<std::size_t>(chosen_)];
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    if (static_cast<std::size_t>(dev) >= devices_.size()) devices_.resize(static_cast<std::size_t>(dev) + 1);
    if (!devices_[dev]) devices_[dev] = query_device(dev);
    return *devices_[dev];
  }
  const DeviceInfo& current_device() override { return current(); }
  const std::optional<KernelConfig>& forced_config() const override { return forced_; }
  // The override for a call being planned now: NF4_CUDA_CONFIG as read at context creation, or,
  // with NF4_CUDA_CONFIG_LIVE=1 at creation, as it reads now (an A/B that interleaves
  // configurations in one process sets it between calls; prepared launches keep theirs).
  std::optional<KernelConfig> forced() const { return live_override_ ? config_override() : forced_; }

 protected:
  void* find_extension(std::string_view id) override {
    if (id == CudaStreamExtension::kId) return static_cast<CudaStreamExtension*>(this);
    if (id == DeviceExtension::kId) return static_cast<DeviceExtension*>(this);
    return nullptr;
  }

 private:
  std::optional<KernelConfig> forced_;
  // A stream of another device than the chosen one is refused where the runtime can tell (its
  // kernels would fail to launch there). Not while the stream is being captured into a CUDA
  // graph: cudaStreamGetDevice is not a capture-safe call and invalidates the capture (the
  // graph's launches then fail where they run, on the wrong device, instead).
  void check_stream_device(cudaStream_t stream) const {
#if CUDART_VERSION >= 12080
    if (chosen_ < 0 || !stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (capture != cudaStreamCaptureStatusNone) return;
    int device = -1;
    check(cudaStreamGetDevice(stream, &device), "cudaStreamGetDevice");
    if (device != chosen_)
      fail(NF4_ERR_INVALID_ARGUMENT, "the stream belongs to CUDA device {}, and this context runs on device {} ({})", device, chosen_, name_);
#else
    (void)stream;
#endif
  }

  bool live_override_;
  const int chosen_;  // the chosen device, -1 for none
  std::vector<std::optional<DeviceInfo>> devices_;
  std::string name_;
  // The legacy default stream until the caller sets one; prepared launches read it at launch.
  std::atomic<cudaStream_t> stream_{nullptr};
};

CudaBackend::~CudaBackend() = default;

class CudaPrepared final : public PreparedLaunch {
 public:
  CudaPrepared(PreparedCall call, const CudaBackend& backend) : call_(std::move(call)), backend_(backend) {}
  void launch(void* const* outs, const nf4_buffers* buffers, void* stream) const override {
    const DeviceScope scope(backend_.chosen_device());
    call_.enqueue(stream ? static_cast<cudaStream_t>(stream) : backend_.stream(), outs, buffers);
  }

 private:
  PreparedCall call_;
  const CudaBackend& backend_;
};

std::unique_ptr<PreparedLaunch> CudaBackend::prepare(std::span<const ValidTensor> tensors) {
  const DeviceScope scope(chosen_);
  return std::make_unique<CudaPrepared>(PreparedCall(tensors, current(), forced()), *this);
}

class CudaPreparedGemv final : public PreparedGemv {
 public:
  CudaPreparedGemv(GemvPlan plan, const CudaBackend& backend) : plan_(plan), backend_(backend) {}
  void launch(const void* x, void* y, void* stream) const override {
    const DeviceScope scope(backend_.chosen_device());
    enqueue_gemv_prepared(plan_, x, y, stream ? static_cast<cudaStream_t>(stream) : backend_.stream());
  }

 private:
  GemvPlan plan_;
  const CudaBackend& backend_;
};

std::unique_ptr<PreparedGemv> CudaBackend::prepare_gemv(const ValidGemv& g) {
  const DeviceScope scope(chosen_);
  return std::make_unique<CudaPreparedGemv>(plan_product(g, current()), *this);
}

// Every CUDA device, by ordinal. Attributes and properties are read without creating a context on
// any device.
std::vector<DeviceDescription> enumerate_devices() {
  int n = 0;
  check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  std::vector<DeviceDescription> out;
  for (int i = 0; i < n; ++i) {
    const DeviceInfo info = query_device(i);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
    DeviceDescription d;
    d.name = info.name;
    d.description = describe(info);
    d.type = prop.integrated ? NF4_DEVICE_TYPE_INTEGRATED_GPU : NF4_DEVICE_TYPE_DISCRETE_GPU;
    d.memory_bytes = prop.totalGlobalMem;
    for (std::size_t b = 0; b < d.uuid.size(); ++b) d.uuid[b] = static_cast<std::uint8_t>(prop.uuid.bytes[b]);
    d.caps = kCudaCaps;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

}  // namespace nf4::cuda

nf4::BackendEntry nf4::cuda_backend_entry() {
  return BackendEntry{
      "cuda", NF4_BACKEND_CUDA, 30,
      [](std::string* out) {
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
          cudaGetLastError();
          *out = std::string("no CUDA device: ") + cudaGetErrorString(e);
          return false;
        }
        if (n == 0) {
          *out = "no CUDA device: none found";
          return false;
        }
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
        const cuda::DeviceInfo d = cuda::query_device(dev);
        if (const cudaError_t k = cuda::check_kernel_image(); k != cudaSuccess) {
          cudaGetLastError();
          *out = fmt::format("{} (sm_{}): this build has no kernel for it: {}", d.name, d.cc, cudaGetErrorString(k));
          return false;
        }
        *out = cuda::describe(d);
        return true;
      },
      cuda::enumerate_devices, [](DeviceChoice device) { return std::unique_ptr<Backend>(new cuda::CudaBackend(device)); }};
}
