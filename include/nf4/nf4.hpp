// SPDX-License-Identifier: MIT
// A thin C++ RAII layer over the C API (nf4.h). Failures become nf4::StatusError exceptions on
// the C++ side only; the library itself never throws across the C boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nf4/nf4.h"

namespace nf4 {

class StatusError : public std::runtime_error {
 public:
  StatusError(nf4_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  nf4_status status() const noexcept { return status_; }

 private:
  nf4_status status_;
};

// The devices of `backend` (nf4.h, "Devices"); empty where it is unavailable.
inline std::vector<nf4_device_info> devices(nf4_backend_kind backend) {
  std::vector<nf4_device_info> out(nf4_device_count(backend));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = NF4_DEVICE_INFO_INIT;
    const nf4_status s = nf4_device_get_info(backend, i, &out[i]);
    if (s != NF4_OK) throw StatusError(s, nf4_last_error(nullptr));
  }
  return out;
}

class Context {
 public:
  explicit Context(nf4_backend_kind backend = NF4_BACKEND_AUTO) {
    nf4_context* c = nullptr;
    check(nf4_context_create(backend, &c), nullptr);
    ctx_ = c;
  }
  Context(nf4_backend_kind backend, const nf4_context_options& options) {
    nf4_context* c = nullptr;
    check(nf4_context_create_ex(backend, &options, &c), nullptr);
    ctx_ = c;
  }
  // A context on device `index` of `backend` (nf4_context_create_on_device); options NULL: defaults.
  static Context on_device(nf4_backend_kind backend, std::size_t index, const nf4_context_options* options = nullptr) {
    nf4_context* c = nullptr;
    check(nf4_context_create_on_device(backend, index, options, &c), nullptr);
    return Context(c);
  }
  ~Context() { nf4_context_destroy(ctx_); }
  Context(Context&& o) noexcept : ctx_(std::exchange(o.ctx_, nullptr)) {}
  Context& operator=(Context&& o) noexcept {
    if (this != &o) {
      nf4_context_destroy(ctx_);
      ctx_ = std::exchange(o.ctx_, nullptr);
    }
    return *this;
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  nf4_backend_kind backend() const { return nf4_context_backend(ctx_); }
  std::string device_name() const { return nf4_context_device_name(ctx_); }
  // The device index it runs on; -1 for a cuda context made without one (the current device).
  std::int32_t device_index() const { return nf4_context_device_index(ctx_); }
  nf4_context* get() const { return ctx_; }

  void set_cuda_stream(void* stream) { check(nf4_context_set_cuda_stream(ctx_, stream), ctx_); }
  void dequantize(const nf4_tensor& t) { check(nf4_dequantize(ctx_, &t), ctx_); }
  void dequantize(const nf4_tensor* ts, size_t n) { check(nf4_dequantize_grouped(ctx_, ts, n), ctx_); }
  void dequantize_host(const nf4_tensor& t) { check(nf4_dequantize_host(ctx_, &t), ctx_); }
  void dequantize_host(const nf4_tensor* ts, size_t n) { check(nf4_dequantize_grouped_host(ctx_, ts, n), ctx_); }
  // The fused matrix-vector product (nf4.h, nf4_gemv_desc).
  void gemv(const nf4_gemv_desc& g) { check(nf4_gemv(ctx_, &g), ctx_); }
  void gemv_host(const nf4_gemv_desc& g) { check(nf4_gemv_host(ctx_, &g), ctx_); }
  // The workspace bytes that let this context run `g` its fastest way (nf4_gemv_workspace_size).
  size_t gemv_workspace_size(const nf4_gemv_desc& g) {
    size_t bytes = 0;
    check(nf4_gemv_workspace_size(ctx_, &g, &bytes), ctx_);
    return bytes;
  }

 private:
  explicit Context(nf4_context* owned) : ctx_(owned) {}
  static void check(nf4_status s, const nf4_context* ctx) {
    if (s != NF4_OK) throw StatusError(s, nf4_last_error(ctx));
  }
  nf4_context* ctx_ = nullptr;
};

}  // namespace nf4
