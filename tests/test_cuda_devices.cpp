// SPDX-License-Identifier: MIT
// CUDA contexts on chosen devices (nf4.h, "Devices"): all of a context's work on its own GPU
// whatever the calling thread's current device, which every call leaves as it found it. With two
// GPUs: two contexts on devices 0 and 1, each used from its own thread whose current device is
// the other GPU, at once, with device pointers, the context's stream and the default one,
// prepared launches and host staging, every result the oracle's. Peer access is never enabled, so
// a kernel launched on the wrong GPU would fault on the other GPU's memory instead of passing.
// Fewer than two GPUs: the two-GPU cases say so and skip (NF4_TEST_REQUIRE_DEVICES=2 fails them).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/oracle.h"
#include "backends/cuda/gemv_backend.h"
#include "core/gemv.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/cuda.h"
#include "tests/support/gemv.h"

using namespace nf4;
using namespace nf4::test;

namespace {

// The GPUs here, or 0 with a visible skip when fewer than `need` (a failure where
// NF4_TEST_REQUIRE_DEVICES asks for them).
int gpus_for(int need) {
  if (!cuda_ready()) return 0;
  int n = 0;
  cu(cudaGetDeviceCount(&n));
  if (n >= need) return n;
  MESSAGE("needs " << need << " CUDA devices, found " << n << ": skipped");
  if (const char* want = std::getenv("NF4_TEST_REQUIRE_DEVICES"); want && std::atoi(want) >= need)
    FAIL("NF4_TEST_REQUIRE_DEVICES=" << want << " but only " << n << " CUDA device(s)");
  return 0;
}

int current_device() {
  int d = -1;
  cu(cudaGetDevice(&d));
  return d;
}

// The device a pointer's memory lives on.
int device_of(const void* p) {
  cudaPointerAttributes a{};
  cu(cudaPointerGetAttributes(&a, p));
  return a.device;
}

// What one thread found, reported on the test's thread; an exception (a failed REQUIRE, a
// StatusError) ends that thread's work as a failure instead of ending the process.
struct Outcome {
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
  template <typename F>
  void run(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      failures.push_back(std::string("stopped by an exception: ") + e.what());
    } catch (...) {
      failures.push_back("stopped by a failed assertion");
    }
  }
};

// The work of one context on `device`, from a thread whose current device is `other`.
void work_on(int device, int other, int rounds, Outcome& out) {
  const std::string on = "device " + std::to_string(device) + ": ";
  const auto status = [&](nf4_status s, nf4_context* ctx, const char* what) {
    out.expect(s == NF4_OK, on + what + ": " + nf4_status_string(s) + ": " + nf4_last_error(ctx));
    out.expect(current_device() == other, on + what + " left device " + std::to_string(current_device()) + " current, not " +
                                              std::to_string(other));
  };
  // The thread's buffers and stream on `device`, made there; then the other GPU becomes current.
  cu(cudaSetDevice(device));
  cudaStream_t stream = nullptr, foreign = nullptr;
  cu(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceArena arena(true);
  const cpu::QuantizedWeight w = synthetic_weight((1 << 22) + 13, NF4_QUANT_NF4, 64, true, 900 + device);
  const cpu::QuantizedWeight f = synthetic_weight(1 << 20, NF4_QUANT_FP4, 256, false, 910 + device);
  DeviceCase a(arena, w.describe(NF4_DTYPE_BF16), Shifts{}), b(arena, f.describe(NF4_DTYPE_F16), Shifts{});
  GemvCase gc;
  make_gemv_case(gc, 1024, 2048, 8, NF4_QUANT_NF4, 64, true, NF4_DTYPE_BF16, NF4_DTYPE_F32, 920 + device);
  std::vector<std::uint8_t> y_host(static_cast<std::size_t>(gc.y_bytes()));
  const ValidGemv host_product = validate_gemv(gc.describe(y_host.data(), gc.y_bytes()));
  cuda::DeviceGemv product(host_product);
  product.upload(stream);
  cu(cudaStreamSynchronize(stream));
  cu(cudaSetDevice(other));
  cu(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));  // a stream of the other GPU

  nf4_context* ctx = nullptr;
  status(nf4_context_create_on_device(NF4_BACKEND_CUDA, static_cast<std::size_t>(device), nullptr, &ctx), nullptr, "create");
  if (!ctx) return;
  out.expect(nf4_context_device_index(ctx) == device, on + "nf4_context_device_index");
#if CUDART_VERSION >= 12080
  out.expect(nf4_context_set_cuda_stream(ctx, foreign) == NF4_ERR_INVALID_ARGUMENT, on + "a stream of the other GPU was accepted");
#endif
  const nf4_tensor devs[] = {a.dev, b.dev};
  nf4_prepared* prepared = nullptr;
  nf4_gemv_prepared* prepared_product = nullptr;
  status(nf4_prepare(ctx, devs, 2, &prepared), ctx, "nf4_prepare");
  status(nf4_gemv_prepare(ctx, &product.valid().desc, &prepared_product), ctx, "nf4_gemv_prepare");
  const std::vector<std::uint8_t> y_expected = gc.oracle();
  for (int r = 0; r < rounds; ++r) {
    // The context's own stream, then the device's default stream.
    status(nf4_context_set_cuda_stream(ctx, r % 2 ? nullptr : stream), ctx, "nf4_context_set_cuda_stream");
    status(nf4_dequantize_grouped(ctx, devs, 2), ctx, "nf4_dequantize_grouped");
    status(nf4_gemv(ctx, &product.valid().desc), ctx, "nf4_gemv");
    // NULL: the context's stream, so that no two launches writing one output run at once.
    if (prepared) status(nf4_prepared_launch(prepared, nullptr, nullptr), ctx, "nf4_prepared_launch");
    if (prepared_product) status(nf4_gemv_prepared_launch(prepared_product, nullptr, nullptr, nullptr), ctx, "nf4_gemv_prepared_launch");
  }
  // Host staging: allocations, copies and the kernel on `device` too.
  std::vector<std::uint8_t> y_staged(y_host.size(), 0xA5);
  const nf4_gemv_desc staged = gc.describe(y_staged.data(), gc.y_bytes());
  status(nf4_gemv_host(ctx, &staged), ctx, "nf4_gemv_host");
  out.expect(y_staged == y_expected, on + "nf4_gemv_host differs from the oracle");
  const cpu::QuantizedWeight h = synthetic_weight(3 << 20, NF4_QUANT_NF4, 64, true, 930 + device);
  std::vector<std::uint8_t> dense(static_cast<std::size_t>(h.numel) * 2, 0xA5), expected(dense.size());
  cpu::oracle_dequantize(h.describe(NF4_DTYPE_BF16, expected.data(), static_cast<std::int64_t>(expected.size())));
  const nf4_tensor ht = h.describe(NF4_DTYPE_BF16, dense.data(), static_cast<std::int64_t>(dense.size()));
  status(nf4_dequantize_host(ctx, &ht), ctx, "nf4_dequantize_host");
  out.expect(dense == expected, on + "nf4_dequantize_host differs from the oracle");

  // Results, read back on `device`.
  cu(cudaSetDevice(device));
  cu(cudaDeviceSynchronize());
  out.expect(device_of(a.dev.out) == device && device_of(product.valid().desc.y) == device, on + "outputs are not on the device");
  out.expect(a.compare() == 0 && b.compare() == 0, on + "nf4_dequantize differs from the oracle");
  std::vector<std::uint8_t> y(y_host.size());
  product.download_y(stream, y.data());
  cu(cudaStreamSynchronize(stream));
  out.expect(y == y_expected, on + "nf4_gemv differs from the oracle");
  cu(cudaSetDevice(other));
  nf4_gemv_prepared_destroy(prepared_product);
  nf4_prepared_destroy(prepared);
  nf4_context_destroy(ctx);
  cu(cudaStreamDestroy(foreign));
  cu(cudaSetDevice(device));
  cu(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("cuda devices: every CUDA ordinal is a device, described as the runtime describes it") {
  if (!cuda_ready()) return;
  int n = 0;
  cu(cudaGetDeviceCount(&n));
  REQUIRE(nf4_device_count(NF4_BACKEND_CUDA) == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    nf4_device_info info = NF4_DEVICE_INFO_INIT;
    REQUIRE(nf4_device_get_info(NF4_BACKEND_CUDA, static_cast<std::size_t>(i), &info) == NF4_OK);
    cudaDeviceProp prop{};
    cu(cudaGetDeviceProperties(&prop, i));
    CHECK(std::string(info.name) == prop.name);
    CHECK(info.memory_bytes == prop.totalGlobalMem);
    CHECK(std::memcmp(info.uuid, prop.uuid.bytes, 16) == 0);
    CHECK((info.caps & NF4_DEVICE_CAP_DEVICE_POINTERS) != 0);
    CHECK((info.caps & NF4_DEVICE_CAP_PREPARED) != 0);
  }
}

TEST_CASE("cuda devices: a context on a device leaves the calling thread's device as it found it") {
  const int n = gpus_for(1);
  if (n == 0) return;
  // On a fresh thread (no CUDA context yet) and on one whose current device is each GPU.
  for (int start = -1; start < n; ++start) {
    Outcome out;
    std::thread([&] { out.run([&] {
      if (start >= 0) cu(cudaSetDevice(start));
      const int before = current_device();
      for (int d = 0; d < n; ++d) {
        Context ctx = Context::on_device(NF4_BACKEND_CUDA, static_cast<std::size_t>(d));
        const cpu::QuantizedWeight h = synthetic_weight(5000, NF4_QUANT_NF4, 64, true, 77);
        std::vector<std::uint16_t> got(5000), expected(5000);
        cpu::oracle_dequantize(h.describe(NF4_DTYPE_BF16, expected.data(), 10000));
        ctx.dequantize_host(h.describe(NF4_DTYPE_BF16, got.data(), 10000));
        out.expect(got == expected, "device " + std::to_string(d) + ": differs from the oracle");
        out.expect(current_device() == before, "device " + std::to_string(d) + ": the current device changed");
      }
    }); }).join();
    CAPTURE(start);
    for (const std::string& f : out.failures) FAIL_CHECK(f);
  }
}

TEST_CASE("cuda devices: contexts on GPUs 0 and 1 from threads whose current device is the other GPU, at once, bit for bit") {
  if (gpus_for(2) == 0) return;
  int can = 0;
  cu(cudaDeviceCanAccessPeer(&can, 0, 1));
  MESSAGE("peer access 0 -> 1 possible: " << can << " (never enabled here: a launch on the wrong GPU faults)");
  Outcome outcome[2];
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int d = 0; d < 2; ++d)
    threads.emplace_back([&, d] {
      ready.fetch_add(1);
      while (ready.load() < 2) std::this_thread::yield();
      outcome[d].run([&] { work_on(d, 1 - d, 20, outcome[d]); });
    });
  for (std::thread& t : threads) t.join();
  for (int d = 0; d < 2; ++d) {
    CAPTURE(d);
    for (const std::string& f : outcome[d].failures) FAIL_CHECK(f);
    if (outcome[d].failures.empty()) MESSAGE("device " << d << ": every result the oracle's, the thread's current device untouched");
  }
}
