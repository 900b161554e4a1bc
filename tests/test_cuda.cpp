// SPDX-License-Identifier: MIT
// The cuda backend with device pointers, bit for bit against the oracle (and bitsandbytes' own
// output on the golden cases). Without a GPU every case reports a visible skip.
//
// Environment (the GPU machine's script, tools/gpu_check.sh, sets them):
//   NF4_CUDA_FULL_SWEEP=1  every size 1..4096 x every blocksize x nested/flat x nf4/fp4 x 3 dtypes
//                          (default: a subset that stays quick, also under compute-sanitizer)
//   NF4_CUDA_LARGE=1       geometric sizes up to 2^28 elements
//
// Device inputs are placed in separate, exact-size allocations at chosen byte offsets, so an
// access past any array is caught by compute-sanitizer and misaligned pointers are exercised;
// outputs sit between poisoned guard bytes that must survive.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/oracle.h"
#include "testdata/quantizer.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tuning.h"
#include "backends/cuda/variants.h"
#include "core/backend.h"
#include "core/format.h"
#include "core/half.h"
#include "core/io/checkpoint.h"
#include "core/tensor.h"
#include "nf4/nf4.hpp"
#include "tests/support/common.h"
#include "tests/support/env.h"

using namespace nf4;
using cuda::DeviceBuffer;

namespace {

using test::env_on;

// True when the cuda backend can run here; otherwise says why, once per test case.
bool cuda_ready() { return test::backend_ready(NF4_BACKEND_CUDA); }

void cu(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float uniform(std::uint64_t& s, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) / static_cast<float>(1 << 24);
}

// Random bnb-shaped data (every code, random statistics): the oracle defines the answer.
struct HostTensor {
  nf4_quant_type qt = NF4_QUANT_NF4;
  std::int64_t n = 0;
  int bs = 64, bs2 = 256;
  bool nested = true;
  std::vector<std::uint8_t> packed, absmax_u8;
  std::vector<float> absmax_f32, quant_map, nested_absmax, nested_code;
  float offset = 0;

  nf4_tensor describe(nf4_dtype d, void* out = nullptr, std::int64_t out_bytes = 0) const {
    nf4_tensor t{};
    t.quant_type = qt;
    t.out_dtype = d;
    t.numel = n;
    t.blocksize = bs;
    t.nested = nested ? 1 : 0;
    t.packed = packed.data();
    t.packed_bytes = static_cast<std::int64_t>(packed.size());
    t.absmax = nested ? static_cast<const void*>(absmax_u8.data()) : absmax_f32.data();
    t.absmax_count = nested ? static_cast<std::int64_t>(absmax_u8.size()) : static_cast<std::int64_t>(absmax_f32.size());
    t.quant_map = quant_map.data();
    t.quant_map_count = 16;
    if (nested) {
      t.nested_absmax = nested_absmax.data();
      t.nested_absmax_count = static_cast<std::int64_t>(nested_absmax.size());
      t.nested_code = nested_code.data();
      t.nested_code_count = 256;
      t.nested_blocksize = bs2;
      t.nested_offset = offset;
    }
    t.out = out;
    t.out_bytes = out_bytes;
    return t;
  }
};

HostTensor random_tensor(std::int64_t n, nf4_quant_type qt, int bs, bool nested, std::uint64_t seed, int bs2 = 256) {
  HostTensor h;
  h.qt = qt;
  h.n = n;
  h.bs = bs;
  h.bs2 = bs2;
  h.nested = nested;
  std::uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
  h.packed.resize(static_cast<std::size_t>((n + 1) / 2));
  for (auto& b : h.packed) b = static_cast<std::uint8_t>(splitmix(s));
  const std::int64_t na = (n + bs - 1) / bs;
  h.quant_map = cpu::saved_quant_map(qt);
  if (nested) {
    h.absmax_u8.resize(static_cast<std::size_t>(na));
    for (auto& b : h.absmax_u8) b = static_cast<std::uint8_t>(splitmix(s));
    h.nested_absmax.resize(static_cast<std::size_t>((na + bs2 - 1) / bs2));
    for (auto& v : h.nested_absmax) v = uniform(s, 0.001f, 0.5f);
    h.nested_code = cpu::dynamic_code_map();
    h.offset = uniform(s, 0.0f, 0.1f);
  } else {
    h.absmax_f32.resize(static_cast<std::size_t>(na));
    for (auto& v : h.absmax_f32) v = uniform(s, 1e-4f, 3.0f);
  }
  return h;
}

// Device memory for test tensors. Exact mode: every array in its own cudaMalloc of exactly its
// size plus the requested shift (what compute-sanitizer checks against). Arena mode: one
// allocation, arrays packed at the requested shifts (fast for sweeps of many tensors).
class DeviceArena {
 public:
  explicit DeviceArena(bool exact, std::size_t capacity = 0) : exact_(exact) {
    if (!exact_) {
      arena_ = DeviceBuffer(capacity);
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
  DeviceBuffer arena_;
  std::vector<std::uint8_t> staging_;
  std::size_t used_ = 0;
  std::vector<DeviceBuffer> bufs_;
};

struct Shifts {
  std::size_t packed = 0, floats = 0, absmax_u8 = 0;
  std::size_t out_elems = 0;  // output offset in elements
};

constexpr std::size_t kGuard = 64;

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
    return test::differing_elements(expected.data(), got.data() + kGuard, host.numel, host.out_dtype);
  }
};

std::string label(const nf4_tensor& t) {
  return "n=" + std::to_string(t.numel) + " " + (t.quant_type == NF4_QUANT_NF4 ? "nf4" : "fp4") + " bs=" + std::to_string(t.blocksize) +
         (t.nested ? " nested" : " flat") + " " + test::dtype_label(t.out_dtype);
}

// Runs host tensors in grouped calls of up to `group` tensors through the public API.
void run_batches(Context& ctx, const std::vector<nf4_tensor>& hosts, std::size_t group, bool exact, const Shifts& shifts) {
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

}  // namespace

TEST_CASE("cuda: the backend reports a device, or why there is none") {
  const RegisteredBackend* b = find_backend(NF4_BACKEND_CUDA);
  REQUIRE(b != nullptr);
  CHECK(b->entry.name == std::string("cuda"));
  REQUIRE(b->compiled_in);
  if (b->available) {
    MESSAGE("cuda device: " << b->device_or_reason);
    Context ctx(NF4_BACKEND_CUDA);
    CHECK(!ctx.device_name().empty());
  } else {
    MESSAGE("cuda unavailable (expected without a GPU): " << b->device_or_reason);
    CHECK(!b->device_or_reason.empty());
    nf4_context* c = nullptr;
    CHECK(nf4_context_create(NF4_BACKEND_CUDA, &c) == NF4_ERR_BACKEND_UNAVAILABLE);
    CHECK(c == nullptr);
  }
}

TEST_CASE("cuda: every tuning-table entry names a compiled kernel variant") {
  for (const auto& e : cuda::kTuningTable)
    for (const cuda::KernelConfig& c : {e.small, e.large}) {
      CHECK(c.threads % 32 == 0);
      CHECK(c.threads >= 32);
      CHECK(c.threads <= 1024);
      for (nf4_dtype d : test::kDTypes) CHECK_MESSAGE(cuda::has_variant(d, c), "cc " << e.min_cc);
    }
}

TEST_CASE("cuda: fp16/bf16 conversions equal core/half.h on all 2^32 inputs") {
  if (!cuda_ready()) return;
  cuda::testing::ConversionReport r{};
  cu(cuda::testing::exhaustive_conversion_check(&r));
  const unsigned long long nans = 2ull * ((1ull << 23) - 1);  // NaN patterns, minus the canonical one checked
  CHECK(r.checked == (1ull << 32) - nans + 1);
  CHECK_MESSAGE(r.f16_mismatches == 0, "first fp16 mismatch at input bits " << r.first_f16_mismatch);
  CHECK_MESSAGE(r.bf16_mismatches == 0, "first bf16 mismatch at input bits " << r.first_bf16_mismatch);
  char bits[16];
  std::snprintf(bits, sizeof bits, "0x%08x", r.fmul_nan_bits);
  MESSAGE("__fmul_rn(NaN payload 0x7fc12345, 1) on the device gives " << std::string(bits));
}

TEST_CASE("cuda: every golden case equals bitsandbytes' output, device pointers") {
  if (!cuda_ready()) return;
  const auto& f = test::golden_file();
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(false, std::size_t{256} << 20);
  struct Item {
    DeviceCase c;
    const io::TensorInfo* expected;
    std::string name;
  };
  std::vector<Item> items;
  for (const auto& gc : test::golden_cases())
    for (nf4_dtype d : test::kDTypes)
      items.push_back(Item{DeviceCase(arena, io::describe(f, gc.param, d, nullptr, 0), Shifts{}), gc.expected[d],
                           gc.case_name + " " + test::dtype_label(d)});
  arena.upload();
  for (auto& it : items) ctx.dequantize(it.c.dev);
  cu(cudaDeviceSynchronize());
  for (auto& it : items) {
    std::vector<std::uint8_t> got;
    const std::int64_t diff = it.c.compare(&got);
    CHECK_MESSAGE(diff == 0, it.name << " vs oracle");
    REQUIRE(it.expected != nullptr);
    CHECK_MESSAGE(test::differing_elements(got.data(), f.data(*it.expected), it.c.host.numel, it.c.host.out_dtype) == 0,
                  it.name << " vs bitsandbytes");
  }
  MESSAGE(items.size() << " golden case x dtype runs compared");
}

TEST_CASE("cuda: random tensors of every size, blocksize and variant") {
  if (!cuda_ready()) return;
  const bool full = env_on("NF4_CUDA_FULL_SWEEP");
  Context ctx(NF4_BACKEND_CUDA);
  std::vector<std::int64_t> sizes;
  if (full) {
    for (std::int64_t n = 1; n <= 4096; ++n) sizes.push_back(n);
  } else {
    for (std::int64_t n = 1; n <= 40; ++n) sizes.push_back(n);
    for (std::int64_t n : {63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025, 2047, 2049, 4095, 4096, 8191, 8193, 65537})
      sizes.push_back(n);
  }
  const int blocksizes[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::uint64_t seed = 7;
  std::size_t runs = 0;
  for (nf4_dtype d : test::kDTypes) {
    std::vector<HostTensor> hs;
    std::vector<nf4_tensor> ts;
    hs.reserve(sizes.size() * 32);
    std::size_t variant = 0;
    for (std::int64_t n : sizes)
      for (int bs : blocksizes)
        for (nf4_quant_type qt : test::kQuantTypes)
          for (bool nested : {true, false}) {
            ++variant;
            // Subset: 4 of the 32 variants per size, rotating, so each appears at many sizes.
            if (!full && (variant + static_cast<std::size_t>(n)) % 8 != 0) continue;
            // Nested blocksize varies too (a power of two; 256 in practice).
            const int bs2 = nested ? (1 << (splitmix(seed) % 9)) : 256;
            hs.push_back(random_tensor(n, qt, bs, nested, seed++, bs2));
          }
    for (const auto& h : hs) ts.push_back(h.describe(d));
    run_batches(ctx, ts, 40, !full, Shifts{});
    runs += ts.size();
  }
  MESSAGE(runs << " random tensors compared" << std::string(full ? " (full sweep)" : " (subset; NF4_CUDA_FULL_SWEEP=1 for all)"));
}

TEST_CASE("cuda: geometric sizes up to 2^28 elements") {
  if (!cuda_ready()) return;
  if (!env_on("NF4_CUDA_LARGE")) {
    MESSAGE("large sizes skipped (NF4_CUDA_LARGE=1 runs them on the GPU machine)");
    return;
  }
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 1000;
  int i = 0;
  for (std::int64_t n = 5000; n <= (std::int64_t{1} << 28); n = n * 4 + 3) {
    for (std::int64_t m : {n, std::min<std::int64_t>(std::int64_t{1} << 28, n * 2 - 1)}) {
      const nf4_dtype d = test::kDTypes[i % test::kDTypes.size()];
      const HostTensor h = random_tensor(m, i % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64 << (i % 3), i % 4 != 3, seed++);
      run_batches(ctx, {h.describe(d)}, 1, true, Shifts{});
      ++i;
    }
  }
  const HostTensor h = random_tensor(std::int64_t{1} << 28, NF4_QUANT_NF4, 64, true, seed++);
  run_batches(ctx, {h.describe(NF4_DTYPE_BF16)}, 1, true, Shifts{});
  MESSAGE((i + 1) << " large tensors compared, up to 2^28 elements");
}

TEST_CASE("cuda: pointers at offsets into larger buffers (misaligned for vector access)") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::uint64_t seed = 77;
  std::size_t runs = 0;
  for (std::int64_t n : {1, 2, 7, 8, 9, 17, 4097, 65536 + 3})
    for (std::size_t ps : {0, 1, 2, 3})
      for (std::size_t oe : {0, 1, 3, 7}) {
        if (ps == 0 && oe == 0) continue;
        const Shifts s{ps, 4 * (ps + 1), ps + 5, oe};
        std::vector<HostTensor> hs;
        for (bool nested : {true, false}) hs.push_back(random_tensor(n, runs % 2 ? NF4_QUANT_FP4 : NF4_QUANT_NF4, 64, nested, seed++));
        std::vector<nf4_tensor> ts;
        for (const auto& h : hs)
          for (nf4_dtype d : test::kDTypes) ts.push_back(h.describe(d));
        run_batches(ctx, ts, ts.size(), true, s);
        runs += ts.size();
      }
  MESSAGE(runs << " misaligned runs compared");
}

TEST_CASE("cuda: chunks that start inside absmax blocks, grid-stride CTAs crossing chunks") {
  if (!cuda_ready()) return;
  const cuda::DeviceInfo dev = cuda::query_device(0);
  std::uint64_t seed = 500;
  // Small groups (threads=32) so chunks of 3 groups start inside 4096-element absmax blocks and
  // inside nested blocks; capped grids make each CTA loop over many groups and cross from chunk to
  // chunk (shared table reloads), with and without the pipelined loop. Every compiled variant.
  std::vector<cuda::KernelConfig> configs;
#define NF4_X(u, h, o)                                               \
  configs.push_back(cuda::KernelConfig{32, u, h, cuda::Grid::per_group(), o}); \
  configs.push_back(cuda::KernelConfig{32, u, h, cuda::Grid::per_sm(1), o});   \
  configs.push_back(cuda::KernelConfig{64, u, h, cuda::Grid::occupancy(1), o});
  NF4_CUDA_VARIANTS(NF4_X)
#undef NF4_X
  for (const cuda::KernelConfig& cfg : configs)
    for (nf4_dtype d : test::kDTypes) {
      DeviceArena arena(true);
      std::vector<HostTensor> hs = {random_tensor(300000, NF4_QUANT_NF4, 4096, true, seed++, 2),
                                    random_tensor(70001, NF4_QUANT_FP4, 32, true, seed++, 4),
                                    random_tensor(12345, NF4_QUANT_NF4, 128, false, seed++)};
      std::vector<DeviceCase> cases;
      cases.reserve(hs.size());
      for (const auto& h : hs) cases.emplace_back(arena, h.describe(d), Shifts{});
      std::vector<nf4_tensor> devs;
      for (const auto& c : cases) devs.push_back(c.dev);
      const std::int64_t per_group = std::int64_t{cfg.threads} * cfg.units * cuda::unit_elements(d);
      cuda::enqueue(devs.data(), devs.size(), nullptr, dev, cfg, 3 * per_group);
      cu(cudaDeviceSynchronize());
      for (const auto& c : cases) CHECK_MESSAGE(c.compare() == 0, label(c.host) << " threads=" << cfg.threads << " grid=" << cfg.grid.shape << "x" << cfg.grid.factor);
    }
}

TEST_CASE("cuda: mixed dtypes and more tensors than one launch holds, in one grouped call") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  std::vector<HostTensor> hs;
  std::vector<nf4_tensor> ts;
  for (int i = 0; i < 40; ++i) hs.push_back(random_tensor(1000 + 977 * i, i % 3 ? NF4_QUANT_NF4 : NF4_QUANT_FP4, 32 << (i % 8), i % 2, 900 + i));
  for (int i = 0; i < 40; ++i) ts.push_back(hs[i].describe(test::kDTypes[i % test::kDTypes.size()]));
  run_batches(ctx, ts, ts.size(), true, Shifts{});
}

TEST_CASE("cuda: the caller's stream, one kernel per call, the offset read on the device") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  cudaStream_t s = nullptr;
  cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ctx.set_cuda_stream(s);
  DeviceArena arena(true);
  HostTensor h = random_tensor(3 * 4096 * 64 + 5, NF4_QUANT_NF4, 64, true, 4242);
  float offset = h.offset;
  nf4_tensor ht = h.describe(NF4_DTYPE_BF16);
  ht.nested_offset = 1234.0f;  // must be ignored: the device pointer wins
  ht.nested_offset_ptr = &offset;
  const HostTensor h2 = random_tensor(5000, NF4_QUANT_FP4, 128, false, 4243);
  DeviceCase a(arena, ht, Shifts{}), b(arena, h2.describe(NF4_DTYPE_BF16), Shifts{});
  const nf4_tensor devs[] = {a.dev, b.dev};

  // Captured in global mode: an allocation, a synchronization or work on another stream inside
  // the call would fail the capture. The graph must hold exactly one kernel node.
  cu(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const nf4_status st = nf4_dequantize_grouped(ctx.get(), devs, 2);
  cudaGraph_t graph = nullptr;
  cu(cudaStreamEndCapture(s, &graph));
  REQUIRE_MESSAGE(st == NF4_OK, nf4_last_error(ctx.get()));
  std::size_t nodes = 0;
  cu(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes == 1);
  std::vector<cudaGraphNode_t> list(nodes);
  cu(cudaGraphGetNodes(graph, list.data(), &nodes));
  cudaGraphNodeType type{};
  cu(cudaGraphNodeGetType(list[0], &type));
  CHECK(type == cudaGraphNodeTypeKernel);
  cudaGraphExec_t exec = nullptr;
  cu(cudaGraphInstantiate(&exec, graph, 0));
  cu(cudaGraphLaunch(exec, s));
  cu(cudaStreamSynchronize(s));
  CHECK(a.compare() == 0);
  CHECK(b.compare() == 0);

  // A new offset written to the device after capture is what the replay uses.
  offset = offset + 0.03125f;
  cu(cudaMemcpy(const_cast<float*>(a.dev.nested_offset_ptr), &offset, 4, cudaMemcpyHostToDevice));
  cu(cudaGraphLaunch(exec, s));
  cu(cudaStreamSynchronize(s));
  CHECK(a.compare() == 0);  // the oracle reads the same (host) offset value

  cu(cudaGraphExecDestroy(exec));
  cu(cudaGraphDestroy(graph));
  ctx.set_cuda_stream(nullptr);
  cu(cudaStreamDestroy(s));
}

TEST_CASE("cuda: back-to-back calls see each other's writes (programmatic dependent launch)") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  cudaStream_t s = nullptr;
  cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ctx.set_cuda_stream(s);
  DeviceArena arena(true);
  // Read after write: call A writes 4 Mi floats; call B reads the last 64 of them as its nested
  // absmax. On sm_90 both are programmatic dependent launches: B's CTAs may be resident while A
  // drains, and must not read before A's writes are visible.
  const std::int64_t na = std::int64_t{4} << 20, nb = 64 * 256 * 64;
  const HostTensor a = random_tensor(na, NF4_QUANT_NF4, 64, false, 71);
  HostTensor b = random_tensor(nb, NF4_QUANT_FP4, 64, true, 72);
  REQUIRE(b.nested_absmax.size() == 64);
  DeviceCase da(arena, a.describe(NF4_DTYPE_F32), Shifts{}), db(arena, b.describe(NF4_DTYPE_BF16), Shifts{});
  std::vector<float> a_out(static_cast<std::size_t>(na));
  cpu::oracle_dequantize(a.describe(NF4_DTYPE_F32, a_out.data(), na * 4));
  std::copy(a_out.end() - 64, a_out.end(), b.nested_absmax.begin());  // what B must see
  db.host = b.describe(NF4_DTYPE_BF16);
  db.dev.nested_absmax = static_cast<const float*>(da.dev.out) + (na - 64);
  // Write after read: call C reads 4 Mi codes; call D then writes its output over the last
  // 128 KiB of C's packed codes, which C's last CTAs read.
  const HostTensor c = random_tensor(std::int64_t{8} << 20, NF4_QUANT_NF4, 64, true, 73);
  const HostTensor d = random_tensor(64 << 10, NF4_QUANT_NF4, 64, true, 74);
  DeviceCase dc(arena, c.describe(NF4_DTYPE_F16), Shifts{}), dd(arena, d.describe(NF4_DTYPE_F16), Shifts{});
  nf4_tensor d_over = dd.dev;
  d_over.out = const_cast<std::uint8_t*>(dc.dev.packed) + c.packed.size() - (128 << 10);
  for (int round = 0; round < 3; ++round) {
    cu(cudaMemsetAsync(da.dev.out, 0xff, static_cast<std::size_t>(na) * 4, s));  // NaN until A writes
    cu(cudaMemcpyAsync(const_cast<std::uint8_t*>(dc.dev.packed), c.packed.data(), c.packed.size(), cudaMemcpyHostToDevice, s));
    ctx.dequantize(da.dev);
    ctx.dequantize(db.dev);
    ctx.dequantize(dc.dev);
    ctx.dequantize(d_over);
    cu(cudaStreamSynchronize(s));
    CHECK_MESSAGE(da.compare() == 0, "round " << round);
    CHECK_MESSAGE(db.compare() == 0, "round " << round << ": B read A's output too early");
    CHECK_MESSAGE(dc.compare() == 0, "round " << round << ": D overwrote C's input too early");
  }
  ctx.set_cuda_stream(nullptr);
  cu(cudaStreamDestroy(s));
}

TEST_CASE("cuda: bad input returns its status and writes nothing") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(true);
  const HostTensor h = random_tensor(1000, NF4_QUANT_NF4, 64, true, 31);
  DeviceCase good(arena, h.describe(NF4_DTYPE_F16), Shifts{}), other(arena, h.describe(NF4_DTYPE_F16), Shifts{});
  const auto untouched = [&](const DeviceCase& c) {
    std::vector<std::uint8_t> got(c.out_bytes);
    cu(cudaMemcpy(got.data(), c.dev.out, got.size(), cudaMemcpyDeviceToHost));
    return std::all_of(got.begin(), got.end(), [](std::uint8_t v) { return v == 0xA5; });
  };
  nf4_tensor bad = other.dev;
  bad.blocksize = 48;
  nf4_tensor pair[] = {good.dev, bad};
  CHECK(nf4_dequantize_grouped(ctx.get(), pair, 2) == NF4_ERR_BLOCKSIZE);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 1") != std::string::npos);
  bad = other.dev;
  bad.out_bytes -= 1;
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_OUTPUT_TOO_SMALL);
  bad = other.dev;
  bad.nested_absmax = reinterpret_cast<const float*>(reinterpret_cast<const std::uint8_t*>(bad.nested_absmax) + 1);
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nf4_last_error(ctx.get())).find("nested_absmax") != std::string::npos);
  bad = other.dev;
  bad.out = static_cast<std::uint8_t*>(bad.out) + 1;  // not 2-byte aligned for fp16
  CHECK(nf4_dequantize(ctx.get(), &bad) == NF4_ERR_INVALID_ARGUMENT);
  cu(cudaDeviceSynchronize());
  CHECK(untouched(good));
  CHECK(untouched(other));
}

// That the staging buffers are freed on every path is checked by compute-sanitizer's leak check
// (tools/gpu_check.sh, memcheck --leak-check full): free device memory is no measure while other
// test processes create contexts and allocate on the same GPU (ctest -j).
TEST_CASE("cuda: host staging honours out_bytes and writes nothing on failure") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  const HostTensor h = random_tensor(100003, NF4_QUANT_NF4, 64, true, 5);
  std::vector<std::uint16_t> out(100003 + 32, 0x7777), expected(100003);
  cpu::oracle_dequantize(h.describe(NF4_DTYPE_F16, expected.data(), 100003 * 2));
  for (int i = 0; i < 5; ++i) ctx.dequantize_host(h.describe(NF4_DTYPE_F16, out.data(), static_cast<std::int64_t>(out.size() * 2)));
  CHECK(std::equal(expected.begin(), expected.end(), out.begin()));
  CHECK(std::all_of(out.begin() + 100003, out.end(), [](std::uint16_t v) { return v == 0x7777; }));
  // A failing call (bad blocksize) leaves out alone.
  nf4_tensor bad = h.describe(NF4_DTYPE_F16, out.data(), static_cast<std::int64_t>(out.size() * 2));
  bad.blocksize = 3;
  std::fill(out.begin(), out.end(), 0x7777);
  CHECK(nf4_dequantize_host(ctx.get(), &bad) == NF4_ERR_BLOCKSIZE);
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint16_t v) { return v == 0x7777; }));
}

TEST_CASE("cuda: prepared launches on a caller stream, into other outputs, from other inputs; bad addresses refused") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  cudaStream_t s = nullptr;
  cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DeviceArena arena(true);
  const HostTensor a = random_tensor(3 * 4096 * 64 + 77, NF4_QUANT_NF4, 64, true, 81);
  const HostTensor b = random_tensor(3 * 4096 * 64 + 77, NF4_QUANT_NF4, 64, true, 82);
  const HostTensor c = random_tensor(12345, NF4_QUANT_FP4, 128, false, 83);
  for (nf4_dtype d : test::kDTypes) {
    DeviceCase da(arena, a.describe(d), Shifts{}), da2(arena, a.describe(d), Shifts{}), db(arena, b.describe(d), Shifts{});
    DeviceCase dc(arena, c.describe(NF4_DTYPE_F32), Shifts{}), dc2(arena, c.describe(NF4_DTYPE_F32), Shifts{});
    // One tensor.
    nf4_prepared* p = nullptr;
    REQUIRE(nf4_prepare(ctx.get(), &da.dev, 1, &p) == NF4_OK);
    REQUIRE(nf4_prepared_launch(p, nullptr, s) == NF4_OK);
    void* other = da2.dev.out;
    REQUIRE(nf4_prepared_launch(p, &other, s) == NF4_OK);
    nf4_buffers bb{db.dev.packed, db.dev.absmax, db.dev.quant_map, db.dev.nested_absmax, db.dev.nested_code, db.dev.nested_offset_ptr,
                   db.dev.nested_offset, db.dev.out};
    REQUIRE(nf4_prepared_launch_buffers(p, &bb, s) == NF4_OK);
    // Refused before anything is enqueued: an output over the codes, a misaligned output.
    void* over = const_cast<std::uint8_t*>(da.dev.packed);
    CHECK(nf4_prepared_launch(p, &over, s) == NF4_ERR_ALIASING);
    void* misaligned = static_cast<std::uint8_t*>(da2.dev.out) + 1;
    CHECK(nf4_prepared_launch(p, &misaligned, s) == NF4_ERR_INVALID_ARGUMENT);
    cu(cudaStreamSynchronize(s));
    CHECK(da.compare() == 0);
    CHECK(da2.compare() == 0);
    CHECK(db.compare() == 0);
    nf4_prepared_destroy(p);
    // A group of two dtypes (two launches), relaunched into other outputs.
    const nf4_tensor group[2] = {da.dev, dc.dev};
    REQUIRE(nf4_prepare(ctx.get(), group, 2, &p) == NF4_OK);
    void* outs[2] = {da2.dev.out, dc2.dev.out};
    cu(cudaMemsetAsync(da2.dev.out, 0, da2.out_bytes, s));
    REQUIRE(nf4_prepared_launch(p, outs, s) == NF4_OK);
    cu(cudaStreamSynchronize(s));
    CHECK(da2.compare() == 0);
    CHECK(dc2.compare() == 0);
    nf4_prepared_destroy(p);
  }
  cu(cudaStreamDestroy(s));
}

TEST_CASE("cuda: a grouped call refuses an output over another tensor's input of another dtype") {
  if (!cuda_ready()) return;
  Context ctx(NF4_BACKEND_CUDA);
  DeviceArena arena(true);
  const HostTensor a = random_tensor(4096, NF4_QUANT_NF4, 64, false, 91);
  const HostTensor b = random_tensor(4096, NF4_QUANT_NF4, 64, false, 92);
  DeviceCase da(arena, a.describe(NF4_DTYPE_F32), Shifts{}), db(arena, b.describe(NF4_DTYPE_BF16), Shifts{});
  nf4_tensor group[2] = {da.dev, db.dev};
  group[0].out = const_cast<void*>(db.dev.absmax);  // fp32 output over the bf16 tensor's absmax
  CHECK(nf4_dequantize_grouped(ctx.get(), group, 2) == NF4_ERR_ALIASING);
  CHECK(std::string(nf4_last_error(ctx.get())).find("tensor 0: out overlaps tensor 1's absmax") != std::string::npos);
}
