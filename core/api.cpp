// SPDX-License-Identifier: MIT
// The C API: argument checks, exception-to-status translation, per-context last-error messages.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/c_api_errors.h"
#include "core/error.h"
#include "core/gemv.h"
#include "core/types.h"
#include "core/tensor.h"
#include "nf4/nf4.h"

struct nf4_context {
  std::unique_ptr<nf4::Backend> backend;
  std::string device_name;
  std::optional<std::size_t> device_index;  // fixed at creation (nf4_context_device_index)
  std::mutex call_mutex;  // serializes calls on one context (see nf4.h, thread safety)
  nf4::ErrorSlots errors;
};

struct nf4_prepared {
  nf4_context* ctx;
  std::vector<nf4::ValidTensor> tensors;
  std::unique_ptr<nf4::PreparedLaunch> launch;
};

// A prepared product owns a copy of its description and weight, which the backend's launch refers to.
struct nf4_gemv_prepared {
  nf4_context* ctx = nullptr;
  nf4_tensor weight{};
  nf4::ValidGemv valid{};  // valid.desc.weight == &weight; desc.mode is the contract that runs
  // One launch per slice of X's rows (all of them in one, unless the exact contract slices them:
  // nf4::resolve_gemv); declared last: destroyed before what they refer to.
  struct Slice {
    std::int32_t first;
    nf4::ValidGemv valid;  // what `launch` refers to: the vector is sized once, never reallocated
    std::unique_ptr<nf4::PreparedGemv> launch;
  };
  std::vector<Slice> slices;
};

namespace {

using nf4::guarded;

// Validates the call once, here, then hands the validated tensors to the backend.
nf4_status with_backend(nf4_context* ctx, void (*run)(nf4::Backend&, std::span<const nf4::ValidTensor>),
                        const nf4_tensor* tensors, std::size_t count) noexcept {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!tensors) nf4::fail(NF4_ERR_NULL_POINTER, "tensors is NULL");
    if (count == 0) return;
    const std::vector<nf4::ValidTensor> valid = nf4::validate_call(tensors, count);
    std::lock_guard lock(ctx->call_mutex);
    run(*ctx->backend, valid);
  });
}

nf4_status launch_prepared(const nf4_prepared* p, void* const* outs, const nf4_buffers* buffers, void* stream) noexcept {
  if (!p) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "prepared is NULL"); });
  return guarded(&p->ctx->errors, [&] {
    nf4::check_launch_buffers(p->tensors, outs, buffers);
    p->launch->launch(outs, buffers, stream);
  });
}

// A caller's backend kind, read as its integer (loading a value outside the enum as the enum is
// undefined), then returned as the enum once it is known to be one of them. By reference: a copy
// would load it.
nf4_backend_kind checked_backend_kind(const nf4_backend_kind& backend) {
  const std::int32_t requested = nf4::enum_bits(backend);
  const std::vector<nf4_backend_kind> kinds = nf4::backend_kinds();
  if (std::none_of(kinds.begin(), kinds.end(), [&](nf4_backend_kind k) { return nf4::enum_bits(k) == requested; }))
    nf4::fail(NF4_ERR_UNKNOWN_BACKEND, "unknown backend kind {} (expected {}..{}: {})", requested, nf4::enum_bits(kinds.front()),
              nf4::enum_bits(kinds.back()), nf4::backend_names(", ", ", "));
  return static_cast<nf4_backend_kind>(requested);
}

// The registration of `backend` (AUTO resolved) where it is known and available, else nullptr.
const nf4::RegisteredBackend* registered(const nf4_backend_kind& backend) {
  const nf4_backend_kind kind = checked_backend_kind(backend);
  if (kind == NF4_BACKEND_AUTO) return nf4::find_backend(nf4::resolve_backend(kind));
  const nf4::RegisteredBackend* b = nf4::find_backend(kind);
  return b && b->available ? b : nullptr;
}

// The options after their checks (nf4.h, nf4_context_options).
nf4::BackendOptions backend_options(const nf4_context_options* options) {
  nf4::BackendOptions opts;
  if (!options) return opts;
  // Version 1 of the struct is 8 bytes; fields past it come from a newer header and must be 0.
  constexpr std::uint32_t known = sizeof(nf4_context_options), limit = 4096;
  static_assert(known == 8);
  if (options->struct_size < known || options->struct_size > limit)
    nf4::fail(NF4_ERR_INVALID_ARGUMENT, "options->struct_size is {}, expected {} (sizeof(nf4_context_options)) up to {}",
              options->struct_size, known, limit);
  const auto* bytes = reinterpret_cast<const unsigned char*>(options);
  for (std::uint32_t i = known; i < options->struct_size; ++i)
    if (bytes[i] != 0)
      nf4::fail(NF4_ERR_UNSUPPORTED, "options: byte {} of {} is set, a field this nf4 ({}) does not know (struct_size {})", i,
                options->struct_size, nf4_version(), known);
  if (options->cpu_threads < 0 || options->cpu_threads > nf4::kMaxCpuThreads)
    nf4::fail(NF4_ERR_INVALID_ARGUMENT, "options->cpu_threads is {}, expected 0 (default) to {}", options->cpu_threads,
              nf4::kMaxCpuThreads);
  opts.cpu_threads = options->cpu_threads;
  return opts;
}

void create_context(const nf4_backend_kind& backend, nf4::DeviceChoice device, const nf4_context_options* options, nf4_context** ctx) {
  if (!ctx) nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL");
  *ctx = nullptr;
  const nf4_backend_kind kind = checked_backend_kind(backend);
  const nf4::BackendOptions opts = backend_options(options);
  auto c = std::make_unique<nf4_context>();
  c->backend = nf4::create_backend(kind, device);
  c->backend->configure(opts);
  c->device_name = c->backend->device_name();
  c->device_index = c->backend->device_index();
  *ctx = c.release();
}

}  // namespace

namespace nf4 {
namespace {

// Whether the backend runs the fast contract for a product that asks for it (gemv_wants_fast).
bool runs_fast(Backend& backend, const ValidGemv& v) {
  switch (backend.capabilities().gemv_fast) {
    case GemvFastSupport::never: return false;
    case GemvFastSupport::whenever: return true;
    case GemvFastSupport::some: return backend.gemv_fast(v);
  }
  unknown_row();
}

// The description with its mode resolved to the contract the backend runs.
ValidGemv resolve_gemv(Backend& backend, ValidGemv v) {
  v.desc.mode = gemv_wants_fast(v.desc) && runs_fast(backend, v) ? NF4_GEMV_FAST : NF4_GEMV_EXACT;
  return v;
}

}  // namespace
}  // namespace nf4

extern "C" {

const char* nf4_version(void) { return NF4_VERSION_STRING; }

const char* nf4_status_string(nf4_status status_in) {
  switch (nf4::enum_bits(status_in)) {
    case NF4_OK: return "ok";
    case NF4_ERR_NULL_POINTER: return "null pointer";
    case NF4_ERR_QUANT_TYPE: return "invalid quant type";
    case NF4_ERR_DTYPE: return "invalid output dtype";
    case NF4_ERR_ELEMENT_COUNT: return "invalid element count";
    case NF4_ERR_BLOCKSIZE: return "invalid blocksize";
    case NF4_ERR_NESTED_BLOCKSIZE: return "invalid nested blocksize";
    case NF4_ERR_PACKED_SIZE: return "wrong packed byte count";
    case NF4_ERR_ABSMAX_SIZE: return "wrong absmax count";
    case NF4_ERR_NESTED_ABSMAX_SIZE: return "wrong nested absmax count";
    case NF4_ERR_QUANT_MAP_SIZE: return "wrong quant_map size";
    case NF4_ERR_NESTED_CODE_SIZE: return "wrong nested code table size";
    case NF4_ERR_OUTPUT_TOO_SMALL: return "output buffer too small";
    case NF4_ERR_INVALID_ARGUMENT: return "invalid argument";
    case NF4_ERR_ALIASING: return "output overlaps an input";
    case NF4_ERR_SHAPE: return "shape mismatch";
    case NF4_ERR_UNKNOWN_BACKEND: return "unknown backend";
    case NF4_ERR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case NF4_ERR_UNSUPPORTED: return "unsupported operation";
    case NF4_ERR_OUT_OF_MEMORY: return "out of memory";
    case NF4_ERR_DEVICE: return "device error";
    case NF4_ERR_IO: return "I/O error";
    case NF4_ERR_FORMAT: return "malformed file";
    case NF4_ERR_INTERRUPTED: return "interrupted";
    case NF4_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

size_t nf4_dtype_size(nf4_dtype dtype) {
  const nf4::DtypeInfo* d = nf4::find_dtype(nf4::enum_bits(dtype));
  return d ? d->size : 0;
}

size_t nf4_backend_count(void) {
  try {
    return nf4::registry().size();
  } catch (...) {
    return 0;
  }
}

nf4_status nf4_backend_get_info(size_t index, nf4_backend_info* info) {
  return guarded(nullptr, [&] {
    if (!info) nf4::fail(NF4_ERR_NULL_POINTER, "info is NULL");
    const auto& r = nf4::registry();
    if (index >= r.size()) nf4::fail(NF4_ERR_INVALID_ARGUMENT, "backend index {} out of range (count {})", index, r.size());
    info->name = r[index].entry.name;
    info->kind = r[index].entry.kind;
    info->available = r[index].available ? 1 : 0;
    info->device_name = r[index].device_or_reason.c_str();
  });
}

nf4_status nf4_backend_parse(const char* name, nf4_backend_kind* kind) {
  return guarded(nullptr, [&] {
    if (!name || !kind) nf4::fail(NF4_ERR_NULL_POINTER, "name or kind is NULL");
    const std::string_view n(name);
    if (const auto k = nf4::parse_backend_name(n)) {
      *kind = *k;
      return;
    }
    nf4::fail(NF4_ERR_UNKNOWN_BACKEND, "unknown backend '{}' (expected {})", n, nf4::backend_names(", ", " or "));
  });
}

nf4_status nf4_validate(const nf4_tensor* tensor) {
  return guarded(nullptr, [&] {
    if (!tensor) nf4::fail(NF4_ERR_NULL_POINTER, "tensor is NULL");
    nf4::validate(*tensor);
  });
}

nf4_status nf4_context_create(nf4_backend_kind backend, nf4_context** ctx) { return nf4_context_create_ex(backend, nullptr, ctx); }

nf4_status nf4_context_create_ex(nf4_backend_kind backend, const nf4_context_options* options, nf4_context** ctx) {
  return guarded(nullptr, [&] { create_context(backend, std::nullopt, options, ctx); });
}

nf4_status nf4_context_create_on_device(nf4_backend_kind backend, size_t device, const nf4_context_options* options, nf4_context** ctx) {
  return guarded(nullptr, [&] { create_context(backend, device, options, ctx); });
}

size_t nf4_device_count(nf4_backend_kind backend) {
  try {
    const nf4::RegisteredBackend* b = registered(backend);
    return b ? b->devices.size() : 0;
  } catch (...) {
    return 0;
  }
}

nf4_status nf4_device_get_info(nf4_backend_kind backend, size_t index, nf4_device_info* info) {
  return guarded(nullptr, [&] {
    if (!info) nf4::fail(NF4_ERR_NULL_POINTER, "info is NULL");
    // Version 1 of the struct is 64 bytes on 64-bit hosts; the caller's bytes past it are zeroed (a
    // newer header's fields read 0, unknown).
    constexpr std::uint32_t known = sizeof(nf4_device_info), limit = 4096;
    static_assert(sizeof(void*) != 8 || known == 64);
    const std::uint32_t size = info->struct_size;
    if (size < known || size > limit)
      nf4::fail(NF4_ERR_INVALID_ARGUMENT, "info->struct_size is {}, expected {} (sizeof(nf4_device_info)) up to {}", size, known, limit);
    const nf4::RegisteredBackend& b = *nf4::find_backend(nf4::resolve_backend(checked_backend_kind(backend)));
    if (index >= b.devices.size())
      nf4::fail(NF4_ERR_INVALID_ARGUMENT, "{} device {} does not exist: the {} backend has {} device{}", b.entry.name, index, b.entry.name,
                b.devices.size(), b.devices.size() == 1 ? "" : "s");
    const nf4::DeviceDescription& d = b.devices[index];
    nf4_device_info out{};
    out.struct_size = size;
    out.backend = b.entry.kind;
    out.index = static_cast<std::uint32_t>(index);
    out.type = d.type;
    out.name = d.name.c_str();
    out.description = d.description.c_str();
    out.memory_bytes = d.memory_bytes;
    out.caps = nf4::device_cap_bits(d.caps);
    std::copy(d.uuid.begin(), d.uuid.end(), out.uuid);
    std::memset(reinterpret_cast<unsigned char*>(info) + known, 0, size - known);
    std::memcpy(info, &out, known);
  });
}

// Internal (core/backend.h), so C++ linkage inside this extern "C" block.
extern "C++" nf4::Backend& nf4::context_backend(nf4_context* ctx) { return *ctx->backend; }

void nf4_context_destroy(nf4_context* ctx) { delete ctx; }

nf4_backend_kind nf4_context_backend(const nf4_context* ctx) { return ctx ? ctx->backend->kind() : NF4_BACKEND_AUTO; }

const char* nf4_context_device_name(const nf4_context* ctx) { return ctx ? ctx->device_name.c_str() : ""; }

int32_t nf4_context_device_index(const nf4_context* ctx) { return ctx && ctx->device_index ? static_cast<std::int32_t>(*ctx->device_index) : -1; }

const char* nf4_last_error(const nf4_context* ctx) { return ctx ? ctx->errors.get() : nf4::thread_last_error().c_str(); }

nf4_status nf4_context_set_cuda_stream(nf4_context* ctx, void* cuda_stream) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    std::lock_guard lock(ctx->call_mutex);
    auto* streams = ctx->backend->extension<nf4::CudaStreamExtension>();
    if (!streams) nf4::fail(NF4_ERR_UNSUPPORTED, "the {} backend has no CUDA stream", nf4::backend_name(ctx->backend->kind()));
    streams->set_cuda_stream(cuda_stream);
  });
}

nf4_status nf4_dequantize(nf4_context* ctx, const nf4_tensor* tensor) {
  return nf4_dequantize_grouped(ctx, tensor, 1);
}

nf4_status nf4_dequantize_grouped(nf4_context* ctx, const nf4_tensor* tensors, size_t count) {
  return with_backend(ctx, [](nf4::Backend& b, std::span<const nf4::ValidTensor> t) { b.dequantize(t); }, tensors, count);
}

nf4_status nf4_dequantize_host(nf4_context* ctx, const nf4_tensor* tensor) {
  return nf4_dequantize_grouped_host(ctx, tensor, 1);
}

nf4_status nf4_dequantize_grouped_host(nf4_context* ctx, const nf4_tensor* tensors, size_t count) {
  return with_backend(ctx, [](nf4::Backend& b, std::span<const nf4::ValidTensor> t) { b.dequantize_host(t); }, tensors, count);
}

nf4_status nf4_prepare(nf4_context* ctx, const nf4_tensor* tensors, size_t count, nf4_prepared** prepared) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!prepared) nf4::fail(NF4_ERR_NULL_POINTER, "prepared is NULL");
    *prepared = nullptr;
    if (!tensors) nf4::fail(NF4_ERR_NULL_POINTER, "tensors is NULL");
    if (count == 0) nf4::fail(NF4_ERR_INVALID_ARGUMENT, "count is 0: nothing to prepare");
    auto p = std::make_unique<nf4_prepared>();
    p->ctx = ctx;
    p->tensors = nf4::validate_call(tensors, count);
    {
      std::lock_guard lock(ctx->call_mutex);
      p->launch = ctx->backend->prepare(p->tensors);
    }
    *prepared = p.release();
  });
}

nf4_status nf4_prepared_launch(const nf4_prepared* prepared, void* const* outs, void* stream) {
  return launch_prepared(prepared, outs, nullptr, stream);
}

nf4_status nf4_prepared_launch_buffers(const nf4_prepared* prepared, const nf4_buffers* buffers, void* stream) {
  if (!buffers) return guarded(prepared ? &prepared->ctx->errors : nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "buffers is NULL"); });
  return launch_prepared(prepared, nullptr, buffers, stream);
}

size_t nf4_prepared_count(const nf4_prepared* prepared) { return prepared ? prepared->tensors.size() : 0; }

void nf4_prepared_destroy(nf4_prepared* prepared) { delete prepared; }

// ---- fused matrix-vector product ----

nf4_status nf4_gemv_validate(const nf4_gemv_desc* gemv) {
  return guarded(nullptr, [&] {
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    nf4::validate_gemv(*gemv);
  });
}

static nf4_status run_gemv(nf4_context* ctx, const nf4_gemv_desc* gemv, bool host) noexcept {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    std::lock_guard lock(ctx->call_mutex);
    const nf4::ValidGemv valid = nf4::resolve_gemv(*ctx->backend, nf4::validate_gemv(*gemv));
    nf4::for_each_gemv_slice(valid, [&](std::int32_t, const nf4::ValidGemv& slice) {
      if (host) ctx->backend->gemv_host(slice);
      else ctx->backend->gemv(slice);
    });
  });
}

nf4_status nf4_gemv(nf4_context* ctx, const nf4_gemv_desc* gemv) { return run_gemv(ctx, gemv, false); }

nf4_status nf4_gemv_host(nf4_context* ctx, const nf4_gemv_desc* gemv) { return run_gemv(ctx, gemv, true); }

nf4_status nf4_gemv_mode_used(nf4_context* ctx, const nf4_gemv_desc* gemv, nf4_gemv_mode* mode) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!mode) nf4::fail(NF4_ERR_NULL_POINTER, "mode is NULL");
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    std::lock_guard lock(ctx->call_mutex);
    *mode = nf4::resolve_gemv(*ctx->backend, nf4::validate_gemv(*gemv)).desc.mode;
  });
}

nf4_status nf4_gemv_workspace_size(nf4_context* ctx, const nf4_gemv_desc* gemv, size_t* bytes) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!bytes) nf4::fail(NF4_ERR_NULL_POINTER, "bytes is NULL");
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    std::lock_guard lock(ctx->call_mutex);
    const nf4::ValidGemv valid = nf4::resolve_gemv(*ctx->backend, nf4::validate_gemv(*gemv));
    std::int64_t most = 0;  // slices run one after another: the largest one's
    nf4::for_each_gemv_slice(valid, [&](std::int32_t, const nf4::ValidGemv& slice) { most = std::max(most, ctx->backend->gemv_workspace_bytes(slice)); });
    *bytes = static_cast<size_t>(most);
  });
}

nf4_status nf4_gemv_prepare(nf4_context* ctx, const nf4_gemv_desc* gemv, nf4_gemv_prepared** prepared) {
  if (!ctx) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "ctx is NULL"); });
  return guarded(&ctx->errors, [&] {
    if (!prepared) nf4::fail(NF4_ERR_NULL_POINTER, "prepared is NULL");
    *prepared = nullptr;
    if (!gemv) nf4::fail(NF4_ERR_NULL_POINTER, "gemv is NULL");
    auto p = std::make_unique<nf4_gemv_prepared>();
    p->ctx = ctx;
    nf4_gemv_desc desc = *gemv;
    if (gemv->weight) p->weight = *gemv->weight;
    desc.weight = gemv->weight ? &p->weight : nullptr;
    std::lock_guard lock(ctx->call_mutex);
    p->valid = nf4::resolve_gemv(*ctx->backend, nf4::validate_gemv(desc));
    const std::int32_t rows = nf4::gemv_slice_rows(p->valid);
    p->slices.reserve(static_cast<std::size_t>((p->valid.desc.m + rows - 1) / rows));
    nf4::for_each_gemv_slice(p->valid, [&](std::int32_t first, const nf4::ValidGemv& slice) {
      p->slices.push_back({first, slice, nullptr});
      p->slices.back().launch = ctx->backend->prepare_gemv(p->slices.back().valid);
    });
    *prepared = p.release();
  });
}

nf4_status nf4_gemv_prepared_launch(const nf4_gemv_prepared* prepared, const void* x, void* y, void* stream) {
  if (!prepared) return guarded(nullptr, [] { nf4::fail(NF4_ERR_NULL_POINTER, "prepared is NULL"); });
  return guarded(&prepared->ctx->errors, [&] {
    nf4_gemv_desc g = prepared->valid.desc;
    if (x) g.x = x;
    if (y) g.y = y;
    if (x || y) nf4::check_gemv_y(g, prepared->valid.sizes);  // the prepared pair was checked when prepared
    const auto xs = static_cast<std::int64_t>(nf4_dtype_size(g.x_dtype)), ys = static_cast<std::int64_t>(nf4_dtype_size(g.y_dtype));
    for (const auto& s : prepared->slices)
      s.launch->launch(static_cast<const unsigned char*>(g.x) + s.first * g.k * xs, static_cast<unsigned char*>(g.y) + s.first * g.n * ys,
                       stream);
  });
}

nf4_gemv_mode nf4_gemv_prepared_mode(const nf4_gemv_prepared* prepared) {
  return prepared ? prepared->valid.desc.mode : NF4_GEMV_EXACT;
}

void nf4_gemv_prepared_destroy(nf4_gemv_prepared* prepared) { delete prepared; }

}  // extern "C"
