// SPDX-License-Identifier: MIT
// The backend interface and the registry. Core owns the registry; each backend provides one
// registration function returning a BackendEntry (declared at the bottom), and backends never
// include each other. Adding a backend = one row in core/registry.cpp's table (kBackends), its
// registration function declared at the bottom here, one subdirectory; the cross-backend test
// (tests/test_backends.cpp) iterates the registry, so it checks the new one automatically.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/gemv.h"
#include "core/tensor.h"
#include "nf4/nf4.h"

namespace nf4 {

// A call prepared once (nf4_prepare): validated, planned, its argument blocks built. launch() may
// run on many threads at once and must not allocate, query the device or synchronize (see nf4.h).
class PreparedLaunch {
 public:
  virtual ~PreparedLaunch() = default;
  // The prepared tensors with outs[i] or buffers[i] substituted (at most one is non-null; both
  // null: the prepared addresses), already checked by core (check_launch_buffers). `stream` is
  // the backend's queue handle (cuda: a cudaStream_t, null = the context's stream).
  virtual void launch(void* const* outs, const nf4_buffers* buffers, void* stream) const = 0;
};

// A product prepared once (nf4_gemv_prepare): validated, its kernel and grid chosen. launch() may
// run on many threads at once and must not allocate, query the device or synchronize (see nf4.h).
class PreparedGemv {
 public:
  virtual ~PreparedGemv() = default;
  // x and y: the prepared pointers or replacements, already checked by core (check_gemv_y).
  // `stream`: as for PreparedLaunch.
  virtual void launch(const void* x, void* y, void* stream) const = 0;
};

// Largest cpu thread count accepted (nf4_context_options.cpu_threads, NF4_CPU_THREADS).
inline constexpr int kMaxCpuThreads = 1024;

// Per-context settings from nf4_context_options (nf4.h), already range-checked.
struct BackendOptions {
  int cpu_threads = 0;  // cpu backend: threads per call; 0 = NF4_CPU_THREADS, else every hardware thread
};

// Whether NF4_GEMV_FAST runs the fast contract on a backend (else the exact contract runs).
enum class GemvFastSupport {
  never,     // every product runs the exact contract
  some,      // the device, x's dtype or the shape decide (Backend::gemv_fast for each product)
  whenever,  // every product that asks with fp16 or bf16 x (gemv_wants_fast)
};

// What a backend can do, as the C API's callers, the tests and the tools need to know it: they ask
// for a capability, never for a backend by name, so a new backend is covered by what it declares.
struct BackendCaps {
  // nf4_dequantize / nf4_gemv take pointers in the backend's own memory space (else
  // NF4_ERR_UNSUPPORTED: such a backend is reached through the _host calls or its native API).
  bool device_pointers = false;
  // Those pointers are host pointers (the cpu backend's memory is the host's).
  bool device_pointers_are_host = false;
  // nf4_prepare / nf4_gemv_prepare (pointers as for device_pointers).
  bool prepared_launch = false;
  bool prepared_gemv = false;
  // The fast product contract (nf4.h, NF4_GEMV_FAST).
  GemvFastSupport gemv_fast = GemvFastSupport::never;
};

// One device a backend can run on (nf4_device_info, nf4.h), as its registration enumerates it.
struct DeviceDescription {
  std::string name;
  std::string description;  // the name and what else identifies the device
  nf4_device_type type = NF4_DEVICE_TYPE_OTHER;
  std::uint64_t memory_bytes = 0;
  std::array<std::uint8_t, 16> uuid{};
  BackendCaps caps;  // what a context on this device can do
};

// The nf4_device_cap bits of `caps`.
std::uint32_t device_cap_bits(const BackendCaps& caps);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual nf4_backend_kind kind() const = 0;
  virtual std::string device_name() const = 0;
  // The index of the device this backend runs on among its registration's devices(), fixed at
  // creation; nullopt where it follows something else (cuda without a chosen device: the calling
  // thread's current device).
  virtual std::optional<std::size_t> device_index() const = 0;
  // Every backend says what it can do (the _host calls every backend has).
  virtual BackendCaps capabilities() const = 0;

  // Every tensor was validated at the API boundary (validate_call): sizes, pointers present,
  // no output overlapping any buffer of the call. Backends check only their own extra rules
  // (e.g. alignment) and never validate again.
  // Pointers in this backend's own memory space (see nf4.h).
  virtual void dequantize(std::span<const ValidTensor> tensors);
  // Host pointers; returns when every output is written.
  virtual void dequantize_host(std::span<const ValidTensor> tensors) = 0;
  // Prepared form of dequantize(); the tensors are copied into the result.
  virtual std::unique_ptr<PreparedLaunch> prepare(std::span<const ValidTensor> tensors);

  // Backend-specific extras (the one mechanism for them; the generic interface stays generic):
  // an extension is an interface class T with a unique `static constexpr std::string_view kId`.
  // extension<T>() returns this backend's implementation of T, or nullptr where it has none.
  // Backends answer in find_extension(). Extensions core uses are declared below; those only the
  // tools use (tools/bench) live in the backend's own internal header.
  template <typename T>
  T* extension() {
    return static_cast<T*>(find_extension(T::kId));
  }

  // Applies the context's options, once, right after creation (backends ignore what is not theirs).
  virtual void configure(const BackendOptions& /*options*/) {}
  // Threads a host-side call runs on (the cpu backend's pool, caller included); 0 for backends
  // that do their work on a device.
  virtual unsigned host_threads() const { return 0; }
  // ---- fused matrix-vector product (nf4.h, nf4_gemv_desc; defaults in core/gemv.cpp) ----
  // The product was validated at the API boundary (validate_gemv): backends check only their own
  // extra rules (e.g. alignment) and never validate again. gemv(): pointers in this backend's
  // memory space (default: NF4_ERR_UNSUPPORTED); gemv_host(): host pointers, returns when y is
  // written (default: NF4_ERR_UNSUPPORTED).
  // Core calls them with desc.mode already resolved (the contract to run): NF4_GEMV_FAST only where
  // gemv_fast() said yes, NF4_GEMV_EXACT with at most kGemvExactRows rows (core slices longer X).
  virtual void gemv(const ValidGemv& g);
  virtual void gemv_host(const ValidGemv& g);
  // Whether this backend runs the fast contract (nf4.h, NF4_GEMV_FAST) for `g`, which asks for it
  // with fp16 or bf16 x (gemv_wants_fast); asked only where capabilities().gemv_fast is `some`.
  // Default: no, the exact contract runs.
  virtual bool gemv_fast(const ValidGemv& /*g*/) { return false; }
  // The workspace bytes (nf4_gemv_desc.workspace) that would let gemv() run `g` its fastest way;
  // `g` as gemv() gets it (contract resolved, one slice). Default: none.
  virtual std::int64_t gemv_workspace_bytes(const ValidGemv& /*g*/) { return 0; }
  // Prepared form of gemv(): `g` stays alive, weight included, as long as the result (core keeps
  // both in the nf4_gemv_prepared). Default: NF4_ERR_UNSUPPORTED.
  virtual std::unique_ptr<PreparedGemv> prepare_gemv(const ValidGemv& g);
  // ---- end of the matrix-vector product ----

 protected:
  // (optional) The extension registered under `id` (a T::kId), cast to void*; default: none.
  virtual void* find_extension(std::string_view /*id*/) { return nullptr; }
};

// Extension: the CUDA stream calls are enqueued on (nf4_context_set_cuda_stream). A null stream
// is the legacy default stream.
class CudaStreamExtension {
 public:
  static constexpr std::string_view kId = "cuda.stream";
  virtual void set_cuda_stream(void* stream) = 0;

 protected:
  ~CudaStreamExtension() = default;
};

// The backend behind a context (tests read host_threads() through it).
Backend& context_backend(nf4_context* ctx);

// The device a backend is created on: an index into its registration's devices(), or nullopt for
// the backend's default (cuda: the calling thread's current device at each call; vulkan:
// NF4_VULKAN_DEVICE, else the best device; cpu: the host).
using DeviceChoice = std::optional<std::size_t>;

struct BackendEntry {
  const char* name;
  nf4_backend_kind kind;
  int priority;  // `auto` takes the available backend with the highest priority
  // Checks, once, whether the backend can run here. Sets the device name, or the reason it can't.
  bool (*probe)(std::string* device_or_reason);
  // The devices a backend can be created on, in the order nf4.h's device index counts them; called
  // once, after a successful probe.
  std::vector<DeviceDescription> (*devices)();
  // `device` is within devices() (the registry checks it).
  std::unique_ptr<Backend> (*create)(DeviceChoice device);
};

struct RegisteredBackend {
  BackendEntry entry;
  bool compiled_in;
  bool available;
  std::string device_or_reason;
  std::vector<DeviceDescription> devices;  // empty where unavailable
};

// All backends nf4 knows, compiled in or not, probed once (thread-safe).
const std::vector<RegisteredBackend>& registry();
const RegisteredBackend* find_backend(nf4_backend_kind kind);
// Resolves AUTO (and the NF4_BACKEND environment variable) to a concrete, available backend;
// throws nf4::Error otherwise.
nf4_backend_kind resolve_backend(nf4_backend_kind requested);
// A backend of kind `requested` (AUTO resolved first) on `device`; a device past the backend's
// count throws NF4_ERR_INVALID_ARGUMENT naming the index and the count.
std::unique_ptr<Backend> create_backend(nf4_backend_kind requested, DeviceChoice device = std::nullopt);
// Names and kinds from the one table of known backends (core/registry.cpp), "auto" included.
const char* backend_name(nf4_backend_kind kind);
std::optional<nf4_backend_kind> parse_backend_name(std::string_view name);
std::vector<nf4_backend_kind> backend_kinds();  // auto first, then by enum value
// "auto, cpu, cuda or vulkan" with sep ", " and last " or " (messages, help texts).
std::string backend_names(std::string_view sep, std::string_view last);

// Registration functions, one per backend.
BackendEntry cpu_backend_entry();
#if defined(NF4_HAVE_CUDA)
BackendEntry cuda_backend_entry();
#endif
#if defined(NF4_HAVE_VULKAN)
BackendEntry vulkan_backend_entry();
#endif

}  // namespace nf4
