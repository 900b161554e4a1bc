// SPDX-License-Identifier: MIT
// Small helpers shared by convert, inspect and verify: option parsing, a context that reports
// failures as nf4::Error, and human-readable sizes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/backend.h"
#include "core/error.h"
#include "tools/checkpoint/checkpoint.h"
#include "core/types.h"
#include "nf4/nf4.h"

namespace nf4::cli {

// An option value the command does not accept, found after CLI11's parse: the tool exits 2 with
// the command's usage line, as for CLI11's own parse errors (tools/cli_main.h).
class UsageError : public Error {
 public:
  using Error::Error;
};

// A dtype of core/types.h by its name or torch spelling ("bf16", "bfloat16", ...).
inline nf4_dtype parse_dtype_option(const std::string& s) {
  nf4_dtype d;
  if (!io::parse_torch_dtype(s, &d))
    throw UsageError(NF4_ERR_INVALID_ARGUMENT, fmt::format("--dtype '{}' is not {}", s, joined_names(kDtypes, ", ", " or ")));
  return d;
}

inline nf4_backend_kind parse_backend_option(const std::string& s) {
  nf4_backend_kind k;
  if (nf4_backend_parse(s.c_str(), &k) != NF4_OK)
    throw UsageError(NF4_ERR_UNKNOWN_BACKEND, fmt::format("--backend '{}' is not {}", s, backend_names(", ", " or ")));
  return k;
}

// --device N of a backend (nf4_device_get_info's index; -1: the backend's default device). An index
// past the devices of an available backend is a usage error naming them; an unavailable backend
// fails later, when its context is made, with the library's reason.
inline DeviceChoice parse_device_option(nf4_backend_kind kind, int device) {
  if (device < 0) return std::nullopt;
  const std::size_t count = nf4_device_count(kind);
  if (count > 0 && static_cast<std::size_t>(device) >= count) {
    std::string names;
    nf4_backend_kind resolved = kind;  // AUTO's backend
    for (std::size_t i = 0; i < count; ++i) {
      nf4_device_info info = NF4_DEVICE_INFO_INIT;
      if (nf4_device_get_info(kind, i, &info) != NF4_OK) continue;
      names += fmt::format("{}{}: {}", i ? "; " : "", i, info.name);
      resolved = info.backend;
    }
    throw UsageError(NF4_ERR_INVALID_ARGUMENT, fmt::format("--device {} does not exist: the {} backend has {} device{} ({})", device,
                                                           nf4::backend_name(resolved), count, count == 1 ? "" : "s", names));
  }
  return static_cast<std::size_t>(device);
}

// Help texts: "auto | cpu | cuda | vulkan", "fp16, bf16, fp32".
inline std::string backend_choices() { return backend_names(" | ", " | "); }
inline std::string dtype_choices() { return joined_names(kDtypes); }

inline const char* dtype_label(nf4_dtype d) { return dtype_name(d).data(); }

// An nf4_context whose failures become nf4::Error with the library's message.
class ContextHandle {
 public:
  // On `device` of the backend, or its default device (nullopt).
  explicit ContextHandle(nf4_backend_kind kind, DeviceChoice device = std::nullopt) {
    const nf4_status s = device ? nf4_context_create_on_device(kind, *device, nullptr, &ctx_) : nf4_context_create(kind, &ctx_);
    if (s != NF4_OK) throw Error(s, nf4_last_error(nullptr));
  }
  ~ContextHandle() { nf4_context_destroy(ctx_); }
  ContextHandle(const ContextHandle&) = delete;
  ContextHandle& operator=(const ContextHandle&) = delete;
  nf4_context* get() const { return ctx_; }
  const char* device_name() const { return nf4_context_device_name(ctx_); }
  nf4_backend_kind kind() const { return nf4_context_backend(ctx_); }
  void dequantize_host(const nf4_tensor* ts, std::size_t n) const {
    const nf4_status s = nf4_dequantize_grouped_host(ctx_, ts, n);
    if (s != NF4_OK) throw Error(s, nf4_last_error(ctx_));
  }

 private:
  nf4_context* ctx_ = nullptr;
};

// The backend's name from the table alone (nf4_backend_get_info would probe every backend's
// devices: driver libraries loaded and file descriptors opened to name the one in use).
inline std::string backend_name(nf4_backend_kind k) { return nf4::backend_name(k); }

// 1536 -> "1.5 KiB"
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

inline std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace nf4::cli
