// SPDX-License-Identifier: MIT
// The backend interface and the registry. Core owns the registry; each backend provides one
// registration function returning a BackendEntry (declared at the bottom), and backends never
// include each other. Adding a backend = one entry here + one subdirectory; the cross-backend
// test (tests/test_backends.cpp) iterates the registry, so it checks the new one automatically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nf4/nf4.h"

namespace nf4 {

// Timing hooks for `nf4 bench` (optional per backend). Times are medians in microseconds of
// `iters` runs after warm-up, measured with device timers (CUDA events, Vulkan timestamps) or,
// on the CPU, a steady clock.
class BenchRunner {
 public:
  virtual ~BenchRunner() = default;
  // Device-to-device copy of `bytes`, rotating among `rotations` source/destination pairs.
  virtual double time_copy_us(std::int64_t bytes, int rotations, int iters) = 0;
  // Uploads `rotations` copies of the tensors (host pointers; out/out_bytes are ignored, the runner
  // allocates outputs) and times one grouped dequantization of all `count` tensors per iteration,
  // cycling through the copies. Returns the median.
  virtual double time_dequantize_us(const nf4_tensor* host_tensors, std::size_t count, int rotations, int iters) = 0;
  // Largest cache in bytes a rotation must defeat (last-level cache / L2).
  virtual std::int64_t cache_bytes() const = 0;
  // (optional) Times a peer implementation loaded from `library` (e.g. bitsandbytes' CUDA library,
  // its three-launch path) on the same tensors, for comparison. Returns a negative value when the
  // backend has no such peer.
  virtual double time_peer_us(const char* /*library*/, const nf4_tensor* /*host_tensors*/, std::size_t /*count*/,
                              int /*rotations*/, int /*iters*/) {
    return -1.0;
  }
};

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

// Largest cpu thread count accepted (nf4_context_options.cpu_threads, NF4_CPU_THREADS).
inline constexpr int kMaxCpuThreads = 1024;

// Per-context settings from nf4_context_options (nf4.h), already range-checked.
struct BackendOptions {
  int cpu_threads = 0;  // cpu backend: threads per call; 0 = NF4_CPU_THREADS, else every hardware thread
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual nf4_backend_kind kind() const = 0;
  virtual std::string device_name() const = 0;

  // Every tensor was validated at the API boundary (validate_call): sizes, pointers present,
  // no output overlapping any buffer of the call. Backends check only their own extra rules
  // (e.g. alignment) and never validate again.
  // Pointers in this backend's own memory space (see nf4.h).
  virtual void dequantize(std::span<const ValidTensor> tensors);
  // Host pointers; returns when every output is written.
  virtual void dequantize_host(std::span<const ValidTensor> tensors) = 0;
  // Prepared form of dequantize(); the tensors are copied into the result.
  virtual std::unique_ptr<PreparedLaunch> prepare(std::span<const ValidTensor> tensors);

  virtual void set_cuda_stream(void* stream);
  virtual BenchRunner* bench_runner() { return nullptr; }

  // Applies the context's options, once, right after creation (backends ignore what is not theirs).
  virtual void configure(const BackendOptions& /*options*/) {}
  // Threads a host-side call runs on (the cpu backend's pool, caller included); 0 for backends
  // that do their work on a device.
  virtual unsigned host_threads() const { return 0; }
  // ---- fused matrix-vector product (nf4.h, nf4_gemv_desc; defaults in core/gemv.cpp) ----
  // Not validated yet: implementations call validate_gemv() before any work. gemv(): pointers in
  // this backend's memory space (default: NF4_ERR_UNSUPPORTED); gemv_host(): host pointers,
  // returns when y is written (default: NF4_ERR_UNSUPPORTED).
  virtual void gemv(const nf4_gemv_desc& g);
  virtual void gemv_host(const nf4_gemv_desc& g);
  // Bench: uploads `rotations` copies of the weight and x (host pointers; y is the runner's) and
  // returns the median time of one product, as time_dequantize_us does; < 0 where not offered.
  virtual double time_gemv_us(const nf4_gemv_desc& /*host*/, int /*rotations*/, int /*iters*/) { return -1.0; }
  // ---- end of the matrix-vector product ----
};

// The backend behind a context (tests read host_threads() through it).
Backend& context_backend(nf4_context* ctx);

struct BackendEntry {
  const char* name;
  nf4_backend_kind kind;
  int priority;  // `auto` takes the available backend with the highest priority
  // Checks, once, whether the backend can run here. Sets the device name, or the reason it can't.
  bool (*probe)(std::string* device_or_reason);
  std::unique_ptr<Backend> (*create)();
};

struct RegisteredBackend {
  BackendEntry entry;
  bool compiled_in;
  bool available;
  std::string device_or_reason;
};

// All backends nf4 knows, compiled in or not, probed once (thread-safe).
const std::vector<RegisteredBackend>& registry();
const RegisteredBackend* find_backend(nf4_backend_kind kind);
// Resolves AUTO (and the NF4_BACKEND environment variable) to a concrete, available backend;
// throws nf4::Error otherwise.
nf4_backend_kind resolve_backend(nf4_backend_kind requested);
std::unique_ptr<Backend> create_backend(nf4_backend_kind requested);
const char* backend_name(nf4_backend_kind kind);

// Registration functions, one per backend.
BackendEntry cpu_backend_entry();
#if defined(NF4_HAVE_CUDA)
BackendEntry cuda_backend_entry();
#endif
#if defined(NF4_HAVE_VULKAN)
BackendEntry vulkan_backend_entry();
#endif

}  // namespace nf4
