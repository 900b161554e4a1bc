// SPDX-License-Identifier: MIT
// Fixtures of the cuda tests (tests/test_cuda_*.cpp): device memory for host tensors (such as
// test::synthetic_weight's: exact-size allocations at chosen byte offsets, so that
// compute-sanitizer catches an access past any array, or one arena for sweeps), guarded and
// poisoned outputs compared with the oracle, and grouped calls through the public API.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/oracle.h"
#include "backends/cuda/cuda_backend.h"
#include "core/tensor.h"
#include "core/types.h"
#include "nf4/nf4.hpp"
#include "lab/testdata/quantizer.h"
#include "tests/support/common.h"
#include "tests/support/env.h"

namespace nf4::test {

// True when the cuda backend can run here; otherwise says why, once per test case.
inline bool cuda_ready() { return backend_ready(NF4_BACKEND_CUDA); }

inline void cu(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

// A non-blocking stream of the test's own, on the current device, synchronized and destroyed when
// its scope ends (a failed REQUIRE included). Where a context uses it, declare it after the
// context and give the context its default stream back before the end of the scope.
class TestStream {
 public:
  TestStream() { cu(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() {
    if (!s_) return;
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Device memory for test tensors. Exact mode: every array in its own cudaMalloc of exactly its
// size plus the requested shift (what compute-sanitizer checks against). Arena mode: one
// allocation, arrays packed at the requested shifts (fast for sweeps of many tensors).
class DeviceArena {
 public:
  explicit DeviceArena(bool exact, std::size_t capacity = 0) : exact_(exact) {
    if (!exact_) {
      arena_ = cuda::DeviceBuffer(capacity);
      staging_.resize(capacity);
    }
  }
  // Device address of `bytes` copied from `src` (nullptr: poisoned), `shift` bytes past an
  // address aligned to 256.
  std::uint8_t* put(const void* src, std::size_t bytes, std::size_t shift, std::uint8_t poison = 0xA5) {
    if (exact_) {
      bufs_.emplace_back(bytes + shift);
      auto* d = static_cast<std::uint8_t*>(bufs_.back().get()) + shift;
      std::vector<std::uint8_t> tmp(bytes, poison);
      if (src) std::memcpy(tmp.data(), src, bytes);
      cu(cudaMemcpy(d, tmp.data(), bytes, cudaMemcpyHostToDevice));
      return d;
    }
    const std::size_t at = (used_ + 255) / 256 * 256 + shift;
    REQUIRE(at + bytes <= staging_.size());
    if (src) std::memcpy(&staging_[at], src, bytes);
    else std::memset(&staging_[at], poison, bytes);
    used_ = at + bytes;
    return static_cast<std::uint8_t*>(arena_.get()) + at;
  }
  void upload() {
    if (!exact_ && used_) cu(cudaMemcpy(arena_.get(), staging_.data(), used_, cudaMemcpyHostToDevice));
  }

 private:
  bool exact_;
  cuda::DeviceBuffer arena_;
  std::vector<std::uint8_t> staging_;
  std::size_t used_ = 0;
  std::vector<cuda::DeviceBuffer> bufs_;
};

struct Shifts {
  std::size_t packed = 0, floats = 0, absmax_u8 = 0;
  std::size_t out_elems = 0;  // output offset in elements
};

inline constexpr std::size_t kGuard = 64;

// A host tensor's inputs and a guarded, poisoned output on the device.
struct DeviceCase {
  nf4_tensor host{};    // host pointers (for the oracle)
  nf4_tensor dev{};     // device pointers
  std::uint8_t* out_region = nullptr;  // guard + output + guard
  std::size_t out_bytes = 0;

  DeviceCase(DeviceArena& a, const nf4_tensor& h, const Shifts& s) : host(h), dev(h) {
    const TensorSizes z = expected_sizes(h);
    dev.packed = a.put(h.packed, static_cast<std::size_t>(z.packed_bytes), s.packed);
    dev.absmax = h.nested ? a.put(h.absmax, static_cast<std::size_t>(z.absmax_count), s.absmax_u8)
                          : a.put(h.absmax, static_cast<std::size_t>(z.absmax_count) * 4, s.floats);
    if (h.quant_map) dev.quant_map = reinterpret_cast<const float*>(a.put(h.quant_map, 64, s.floats));
    if (h.nested) {
      dev.nested_absmax = reinterpret_cast<const float*>(a.put(h.nested_absmax, static_cast<std::size_t>(z.nested_absmax_count) * 4, s.floats));
      dev.nested_code = reinterpret_cast<const float*>(a.put(h.nested_code, 1024, s.floats));
      if (h.nested_offset_ptr) dev.nested_offset_ptr = reinterpret_cast<const float*>(a.put(h.nested_offset_ptr, 4, s.floats));
    }
    out_bytes = static_cast<std::size_t>(z.out_bytes);
    const std::size_t es = nf4_dtype_size(h.out_dtype);
    out_region = a.put(nullptr, kGuard + out_bytes + kGuard, s.out_elems * es);
    dev.out = out_region + kGuard;
    dev.out_bytes = z.out_bytes;
  }

  // Differing elements against the oracle; -1 if a guard byte changed.
  std::int64_t compare(std::vector<std::uint8_t>* got_out = nullptr) const {
    std::vector<std::uint8_t> got(kGuard + out_bytes + kGuard);
    cu(cudaMemcpy(got.data(), out_region, got.size(), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kGuard; ++i)
      if (got[i] != 0xA5 || got[kGuard + out_bytes + i] != 0xA5) return -1;
    std::vector<std::uint8_t> expected(out_bytes);
    nf4_tensor t = host;
    t.out = expected.data();
    t.out_bytes = static_cast<std::int64_t>(out_bytes);
    cpu::oracle_dequantize(t);
    if (got_out) got_out->assign(got.begin() + kGuard, got.begin() + static_cast<std::ptrdiff_t>(kGuard + out_bytes));
    return differing_elements(expected.data(), got.data() + kGuard, host.numel, host.out_dtype);
  }
};

inline std::string label(const nf4_tensor& t) {
  return "n=" + std::to_string(t.numel) + " " + std::string(quant_type_name(t.quant_type)) + " bs=" + std::to_string(t.blocksize) +
         (t.nested ? " nested" : " flat") + " " + dtype_label(t.out_dtype);
}

// Runs host tensors in grouped calls of up to `group` tensors through the public API.
inline void run_batches(Context& ctx, const std::vector<nf4_tensor>& hosts, std::size_t group, bool exact, const Shifts& shifts) {
  for (std::size_t first = 0; first < hosts.size(); first += group) {
    const std::size_t count = std::min(group, hosts.size() - first);
    std::size_t need = 0;
    for (std::size_t i = first; i < first + count; ++i) {
      const TensorSizes z = expected_sizes(hosts[i]);
      need += static_cast<std::size_t>(z.packed_bytes + z.absmax_count * 4 + z.nested_absmax_count * 4 + z.out_bytes) + 4096 + 2 * kGuard;
    }
    DeviceArena arena(exact, exact ? 0 : need);
    std::vector<DeviceCase> cases;
    cases.reserve(count);
    for (std::size_t i = first; i < first + count; ++i) cases.emplace_back(arena, hosts[i], shifts);
    arena.upload();
    std::vector<nf4_tensor> devs;
    for (const auto& c : cases) devs.push_back(c.dev);
    ctx.dequantize(devs.data(), devs.size());
    cu(cudaDeviceSynchronize());
    for (const auto& c : cases) {
      const std::int64_t diff = c.compare();
      CHECK_MESSAGE(diff == 0, label(c.host) << (diff < 0 ? ": wrote outside the output" : ": elements differ: " + std::to_string(diff)));
    }
  }
}

}  // namespace nf4::test
