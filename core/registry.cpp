// SPDX-License-Identifier: MIT
#include <cstdlib>
#include <string_view>

#include "core/backend.h"
#include "core/error.h"

namespace nf4 {

void Backend::dequantize(std::span<const ValidTensor>) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no raw device pointers: use nf4_dequantize_host() or its native API",
       backend_name(kind()));
}

std::unique_ptr<PreparedLaunch> Backend::prepare(std::span<const ValidTensor>) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no raw device pointers to prepare a launch for: use its native API",
       backend_name(kind()));
}

void Backend::set_cuda_stream(void*) {
  fail(NF4_ERR_UNSUPPORTED, "the {} backend has no CUDA stream", backend_name(kind()));
}

const char* backend_name(nf4_backend_kind kind) {
  switch (kind) {
    case NF4_BACKEND_AUTO: return "auto";
    case NF4_BACKEND_CPU: return "cpu";
    case NF4_BACKEND_CUDA: return "cuda";
    case NF4_BACKEND_VULKAN: return "vulkan";
  }
  return "unknown";
}

namespace {

RegisteredBackend probed(BackendEntry entry) {
  RegisteredBackend r{entry, true, false, {}};
  try {
    r.available = entry.probe(&r.device_or_reason);
  } catch (const std::exception& e) {
    r.available = false;
    r.device_or_reason = e.what();
  }
  return r;
}

[[maybe_unused]] RegisteredBackend not_compiled(const char* name, nf4_backend_kind kind, const char* option) {
  return RegisteredBackend{BackendEntry{name, kind, 0, nullptr, nullptr}, false, false,
                           std::string("not compiled in (configure with ") + option + "=ON)"};
}

std::vector<RegisteredBackend> build_registry() {
  std::vector<RegisteredBackend> r;
#if defined(NF4_HAVE_CUDA)
  r.push_back(probed(cuda_backend_entry()));
#else
  r.push_back(not_compiled("cuda", NF4_BACKEND_CUDA, "-DNF4_CUDA"));
#endif
#if defined(NF4_HAVE_VULKAN)
  r.push_back(probed(vulkan_backend_entry()));
#else
  r.push_back(not_compiled("vulkan", NF4_BACKEND_VULKAN, "-DNF4_VULKAN"));
#endif
  r.push_back(probed(cpu_backend_entry()));
  return r;
}

}  // namespace

const std::vector<RegisteredBackend>& registry() {
  static const std::vector<RegisteredBackend> r = build_registry();  // C++11 magic static: thread-safe
  return r;
}

const RegisteredBackend* find_backend(nf4_backend_kind kind) {
  for (const auto& b : registry())
    if (b.entry.kind == kind) return &b;
  return nullptr;
}

nf4_backend_kind resolve_backend(nf4_backend_kind requested) {
  if (requested == NF4_BACKEND_AUTO) {
    if (const char* env = std::getenv("NF4_BACKEND"); env && *env) {
      nf4_backend_kind k;
      if (nf4_backend_parse(env, &k) != NF4_OK)
        fail(NF4_ERR_UNKNOWN_BACKEND, "NF4_BACKEND='{}' is not one of auto, cpu, cuda, vulkan", env);
      if (k != NF4_BACKEND_AUTO) return resolve_backend(k);
    }
    const RegisteredBackend* best = nullptr;
    for (const auto& b : registry())
      if (b.available && (!best || b.entry.priority > best->entry.priority)) best = &b;
    if (!best) fail(NF4_ERR_BACKEND_UNAVAILABLE, "no backend is available");
    return best->entry.kind;
  }
  const RegisteredBackend* b = find_backend(requested);
  if (!b) fail(NF4_ERR_UNKNOWN_BACKEND, "unknown backend kind {}", static_cast<int>(requested));
  if (!b->available) fail(NF4_ERR_BACKEND_UNAVAILABLE, "backend '{}' is unavailable: {}", b->entry.name, b->device_or_reason);
  return requested;
}

std::unique_ptr<Backend> create_backend(nf4_backend_kind requested) {
  return find_backend(resolve_backend(requested))->entry.create();
}

}  // namespace nf4
