// SPDX-License-Identifier: MIT
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/env.h"
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

namespace {

// Every backend nf4 knows, compiled in or not, in registry order (the order nf4_backend_get_info
// lists them). Adding a backend: its enum value in include/nf4/nf4.h, a row here, its
// registration function declared in core/backend.h, its subdirectory under backends/ (and its
// NF4_<NAME> option in CMakeLists.txt). The API, the CLI's parser and help texts, and the tests
// derive from this table.
struct KnownBackend {
  const char* name;
  nf4_backend_kind kind;
  const char* option;          // the CMake option that compiles it in
  BackendEntry (*entry)();     // nullptr where it is not compiled in
};

constexpr KnownBackend kBackends[] = {
#if defined(NF4_HAVE_CUDA)
    {"cuda", NF4_BACKEND_CUDA, "-DNF4_CUDA", cuda_backend_entry},
#else
    {"cuda", NF4_BACKEND_CUDA, "-DNF4_CUDA", nullptr},
#endif
#if defined(NF4_HAVE_VULKAN)
    {"vulkan", NF4_BACKEND_VULKAN, "-DNF4_VULKAN", vulkan_backend_entry},
#else
    {"vulkan", NF4_BACKEND_VULKAN, "-DNF4_VULKAN", nullptr},
#endif
    {"cpu", NF4_BACKEND_CPU, nullptr, cpu_backend_entry},
};

}  // namespace

const char* backend_name(nf4_backend_kind kind) {
  if (enum_bits(kind) == NF4_BACKEND_AUTO) return "auto";
  for (const KnownBackend& b : kBackends)
    if (enum_bits(b.kind) == enum_bits(kind)) return b.name;
  return "unknown";
}

std::optional<nf4_backend_kind> parse_backend_name(std::string_view name) {
  if (name == "auto") return NF4_BACKEND_AUTO;
  for (const KnownBackend& b : kBackends)
    if (name == b.name) return b.kind;
  return std::nullopt;
}

std::vector<nf4_backend_kind> backend_kinds() {
  std::vector<nf4_backend_kind> kinds{NF4_BACKEND_AUTO};
  for (const KnownBackend& b : kBackends) kinds.push_back(b.kind);
  std::sort(kinds.begin(), kinds.end(), [](nf4_backend_kind a, nf4_backend_kind b) { return enum_bits(a) < enum_bits(b); });
  return kinds;
}

std::string backend_names(std::string_view sep, std::string_view last) {
  const std::vector<nf4_backend_kind> kinds = backend_kinds();
  std::string s;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (i > 0) s += i + 1 == kinds.size() ? last : sep;
    s += backend_name(kinds[i]);
  }
  return s;
}

namespace {

RegisteredBackend probed(BackendEntry entry) {
  RegisteredBackend r{entry, true, false, {}, {}};
  try {
    r.available = entry.probe(&r.device_or_reason);
    if (r.available) r.devices = entry.devices();
    if (r.available && r.devices.empty()) {
      r.available = false;
      r.device_or_reason = "no device found";
    }
  } catch (const std::exception& e) {
    r.available = false;
    r.device_or_reason = e.what();
    r.devices.clear();
  }
  return r;
}

std::vector<RegisteredBackend> build_registry() {
  std::vector<RegisteredBackend> r;
  for (const KnownBackend& b : kBackends) {
    if (b.entry) r.push_back(probed(b.entry()));
    else
      r.push_back(RegisteredBackend{BackendEntry{b.name, b.kind, 0, nullptr, nullptr, nullptr}, false, false,
                                    std::string("not compiled in (configure with ") + b.option + "=ON)", {}});
  }
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
    if (const char* env = env_value(EnvVar::kBackend); env && *env) {
      const std::optional<nf4_backend_kind> k = parse_backend_name(env);
      if (!k) fail(NF4_ERR_UNKNOWN_BACKEND, "NF4_BACKEND='{}' is not one of {}", env, backend_names(", ", ", "));
      if (*k != NF4_BACKEND_AUTO) return resolve_backend(*k);
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

std::unique_ptr<Backend> create_backend(nf4_backend_kind requested, DeviceChoice device) {
  const RegisteredBackend& b = *find_backend(resolve_backend(requested));
  if (device && *device >= b.devices.size()) {
    std::string listing;
    for (std::size_t i = 0; i < b.devices.size(); ++i) listing += fmt::format("{}{}: {}", i ? "; " : "", i, b.devices[i].name);
    fail(NF4_ERR_INVALID_ARGUMENT, "{} device {} does not exist: the {} backend has {} device{} ({})", b.entry.name, *device, b.entry.name,
         b.devices.size(), b.devices.size() == 1 ? "" : "s", listing);
  }
  return b.entry.create(device);
}

std::uint32_t device_cap_bits(const BackendCaps& caps) {
  std::uint32_t bits = 0;
  if (caps.device_pointers) bits |= NF4_DEVICE_CAP_DEVICE_POINTERS;
  if (caps.device_pointers_are_host) bits |= NF4_DEVICE_CAP_HOST_POINTERS;
  if (caps.prepared_launch) bits |= NF4_DEVICE_CAP_PREPARED;
  if (caps.prepared_gemv) bits |= NF4_DEVICE_CAP_PREPARED_GEMV;
  if (caps.gemv_fast != GemvFastSupport::never) bits |= NF4_DEVICE_CAP_GEMV_FAST;
  return bits;
}

}  // namespace nf4
