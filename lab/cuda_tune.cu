// SPDX-License-Identifier: MIT
// nf4_cuda_tune: sweeps the kernel's launch geometry and cache hints on the GPU at hand and
// prints, per shape and dtype, the time of every variant against the copy ceiling of the same
// run; backends/cuda/tuning.h is filled from its output (docs/PERFORMANCE_LOG.md keeps the tables). Built with
// -DNF4_CUDA_TUNER=ON for the native architecture only; not part of the library.
//
//   nf4_cuda_tune [--iters N] [--quick] [--csv FILE]
//
// Inputs are random codes and statistics made on the device (nested NF4, blocksize 64, nested
// blocksize 256, the offset as a device pointer): the kernel's speed does not depend on values.
// Every variant's output is compared with the library's default variant bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernel.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tuning.h"
#include "bench/cuda/bench_kernels.h"
#include "bench/cuda/cuda_bench.h"
#include "bench/util.h"
#include "lab/testdata/quantizer.h"

using namespace nf4;
using namespace nf4::cuda;
using nf4::bench::median;
using nf4::bench::Timing;

namespace {

// The variants this sweep can launch: fp16 over units x hints x kernel options x argument-block
// size (plus the timestamped bodies), bf16 over a few.
struct Variant {
  int u, h, o;
  bool single;
};
constexpr int kF16Count = 4 * 3 * 4 * 2 - 3 * 2 * 2 + 2 * 4 * 2;  // no pipelined 8-unit bodies: they spill
constexpr std::array<Variant, kF16Count> make_f16() {
  std::array<Variant, kF16Count> a{};
  int i = 0;
  for (int u : {1, 2, 4, 8})
    for (int h : {0, 3, 7})
      for (int o : {0, 1, 2, 3})
        for (bool s : {false, true})
          if (!(u == 8 && (o & kOptPipeline))) a[i++] = Variant{u, h, o, s};
  for (int u : {2, 4})
    for (int o : {4, 5, 6, 7})
      for (bool s : {false, true}) a[i++] = Variant{u, 3, o, s};
  return a;
}
constexpr int kBf16Count = 3 * 3 - 1;
constexpr std::array<Variant, kBf16Count> make_bf16() {
  std::array<Variant, kBf16Count> a{};
  int i = 0;
  for (int u : {2, 4, 8})
    for (int o : {0, 1, 3})
      if (!(u == 8 && (o & kOptPipeline))) a[i++] = Variant{u, 3, o, true};
  return a;
}
constexpr auto kF16 = make_f16();
constexpr auto kBf16 = make_bf16();

unsigned long long* g_timestamps = nullptr;  // set per timed call when measuring kernel-internal time

template <nf4_dtype D>
constexpr const auto& variants() {
  if constexpr (D == NF4_DTYPE_F16) return kF16;
  else return kBf16;
}

template <nf4_dtype D, std::size_t I>
cudaError_t dispatch(const KernelConfig& c, const LaunchArgs& args, int sms, cudaStream_t s) {
  constexpr auto& list = variants<D>();
  if constexpr (I >= list.size()) {
    return cudaErrorInvalidValue;
  } else {
    constexpr Variant v = list[I];
    const bool single = (c.options & kOptSingleChunkArgs) != 0;
    if (c.units == v.u && c.hints == v.h && (c.options & kKernelOptionMask) == v.o && single == v.single)
      return launch_variant<D, v.u, v.h, v.o, v.single>(c, args, sms, s);
    return dispatch<D, I + 1>(c, args, sms, s);
  }
}

cudaError_t tune_launch(nf4_dtype d, const KernelConfig& c, const LaunchArgs& args, int sms, cudaStream_t s) {
  LaunchArgs a = args;
  a.timestamps = g_timestamps;
  if (d == NF4_DTYPE_F16) return dispatch<NF4_DTYPE_F16, 0>(c, a, sms, s);
  if (d == NF4_DTYPE_BF16) return dispatch<NF4_DTYPE_BF16, 0>(c, a, sms, s);
  return launch_dequantize(d, c, args, sms, s);  // fp32: the library's variants
}

__global__ void null_kernel_big(const __grid_constant__ LaunchArgs a) {
  if (a.total_groups == 0xffffffffu) a.timestamps[0] = 1;  // never true; keeps the parameter used
}
__global__ void null_kernel_small(const __grid_constant__ LaunchArgsN<1> a) {
  if (a.total_groups == 0xffffffffu) a.timestamps[0] = 1;
}

__device__ std::uint32_t hash(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return static_cast<std::uint32_t>(x ^ (x >> 33));
}

__global__ void fill_bytes(std::uint8_t* p, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<std::uint8_t>(hash(seed * 0x9e3779b97f4a7c15ull + i));
}

__global__ void fill_floats(float* p, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    p[i] = 0.001f + 0.5f * static_cast<float>(hash(seed * 0x9e3779b97f4a7c15ull + i) >> 8) / 16777216.0f;
}

__global__ void count_diff(const std::uint32_t* a, const std::uint32_t* b, std::int64_t words, unsigned long long* diff) {
  unsigned long long local = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < words; i += std::int64_t{gridDim.x} * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(diff, local);
}

// The memory pattern of the kernel without its arithmetic: 4 bytes in, 16 bytes out per unit,
// U units per thread at a block stride. The ceiling for this read:write mix.
template <int U>
__global__ void expand_kernel(const std::uint32_t* in, uint4* out, unsigned units) {
  for (unsigned g = blockIdx.x; g * blockDim.x * U < units; g += gridDim.x) {
    std::uint32_t w[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const unsigned u = g * blockDim.x * U + k * blockDim.x + threadIdx.x;
      w[k] = u < units ? __ldg(in + u) : 0;
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const unsigned u = g * blockDim.x * U + k * blockDim.x + threadIdx.x;
      if (u < units) out[u] = make_uint4(w[k], w[k] ^ 1u, w[k] ^ 2u, w[k] ^ 3u);
    }
  }
}

// One nested NF4 weight on the device.
struct Weight {
  std::int64_t n;
  DeviceBuffer packed, absmax, nested_absmax, tables, out, ref;
  nf4_tensor t{};

  Weight(std::int64_t numel, nf4_dtype d, std::uint64_t seed, cudaStream_t s) : n(numel) {
    const std::int64_t na = (n + 63) / 64, nn = (na + 255) / 256;
    packed = DeviceBuffer(static_cast<std::size_t>((n + 1) / 2));
    absmax = DeviceBuffer(static_cast<std::size_t>(na));
    nested_absmax = DeviceBuffer(static_cast<std::size_t>(nn) * 4);
    tables = DeviceBuffer((16 + 256 + 1) * 4);
    out = DeviceBuffer(static_cast<std::size_t>(n) * nf4_dtype_size(d));
    fill_bytes<<<1024, 256, 0, s>>>(static_cast<std::uint8_t*>(packed.get()), (n + 1) / 2, seed);
    fill_bytes<<<256, 256, 0, s>>>(static_cast<std::uint8_t*>(absmax.get()), na, seed + 1);
    fill_floats<<<64, 256, 0, s>>>(static_cast<float*>(nested_absmax.get()), nn, seed + 2);
    std::vector<float> host(16 + 256 + 1);
    const auto qm = cpu::saved_quant_map(NF4_QUANT_NF4);
    const auto code = cpu::dynamic_code_map();
    std::copy(qm.begin(), qm.end(), host.begin());
    std::copy(code.begin(), code.end(), host.begin() + 16);
    host[272] = 0.0519833266735077f;
    check(cudaMemcpyAsync(tables.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, s), "upload");
    check(cudaStreamSynchronize(s), "sync");
    const auto* tab = static_cast<const float*>(tables.get());
    t.quant_type = NF4_QUANT_NF4;
    t.out_dtype = d;
    t.numel = n;
    t.blocksize = 64;
    t.nested = 1;
    t.packed = static_cast<const std::uint8_t*>(packed.get());
    t.packed_bytes = (n + 1) / 2;
    t.absmax = absmax.get();
    t.absmax_count = na;
    t.quant_map = tab;
    t.quant_map_count = 16;
    t.nested_absmax = static_cast<const float*>(nested_absmax.get());
    t.nested_absmax_count = nn;
    t.nested_code = tab + 16;
    t.nested_code_count = 256;
    t.nested_blocksize = 256;
    t.nested_offset_ptr = tab + 272;
    t.out = out.get();
    t.out_bytes = n * static_cast<std::int64_t>(nf4_dtype_size(d));
  }
};

struct Case {
  std::string name;
  std::vector<std::int64_t> numels;
};

struct Result {
  std::string shape, dtype;
  KernelConfig c;
  double us, pct;
};

}  // namespace

// The NF4_CUDA_CONFIG spelling of a grid.
std::string grid_str(const Grid& g) {
  switch (g.shape) {
    case Grid::kPerGroup: return "group";
    case Grid::kPerSm: return std::to_string(g.factor) + "/sm";
    case Grid::kPerOccupancy: return std::to_string(g.factor) + "xocc";
  }
  return "?";
}

std::string cfg_str(const KernelConfig& c) {
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for "{" + std::string.
  std::string s = "{";
  for (const std::string& part : {std::to_string(c.threads), std::to_string(c.units), std::to_string(c.hints), grid_str(c.grid)})
    s.append(part).append(",");
  return s.append(std::to_string(c.options)).append("}");
}

int main(int argc, char** argv) {
  int iters = 25;
  bool quick = false;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--csv" && i + 1 < argc) csv_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: nf4_cuda_tune [--iters N] [--quick] [--csv FILE]\n");
      return 2;
    }
  }
  try {
    int devid = 0;
    check(cudaGetDevice(&devid), "cudaGetDevice");
    const DeviceInfo dev = query_device(devid);
    std::printf("nf4_cuda_tune: %s, sm_%d, %d SMs, L2 %lld MiB; timing: %s\n", dev.name.c_str(), dev.cc, dev.sms,
                static_cast<long long>(dev.l2_bytes >> 20), timing_name(bench::timing_from_env()));
    Stream s;
    const auto rotations_for = [&](std::int64_t bytes) {
      return static_cast<int>(std::clamp<std::int64_t>((4 * dev.l2_bytes + bytes - 1) / std::max<std::int64_t>(bytes, 1), 2, 64));
    };
    DeviceBuffer stamps(sizeof(unsigned long long) * 2 * static_cast<std::size_t>(iters + 2));

    // Copy ceiling: 512 MiB device-to-device, as `nf4 bench` measures it; a write-only ceiling;
    // launch cost of an empty kernel with the large and the small argument block.
    const std::int64_t copy_bytes = std::int64_t{512} << 20;
    double copy_gbps = 0;
    DeviceBuffer big_a[2] = {DeviceBuffer(copy_bytes), DeviceBuffer(copy_bytes)}, big_b[2] = {DeviceBuffer(copy_bytes), DeviceBuffer(copy_bytes)};
    for (auto& x : big_a) check(cudaMemset(x.get(), 1, copy_bytes), "memset");
    {
      const double us = time_median_us(s, iters, [&](int i) {
        check(cudaMemcpyAsync(big_b[i % 2].get(), big_a[i % 2].get(), copy_bytes, cudaMemcpyDeviceToDevice, s), "copy");
      });
      copy_gbps = 2.0 * copy_bytes / us / 1e3;
      std::printf("copy ceiling: %.1f GB/s (512 MiB in %.1f us)\n", copy_gbps, us);
      const double ws = time_median_us(s, iters, [&](int i) { check(cudaMemsetAsync(big_b[i % 2].get(), i, copy_bytes, s), "memset"); });
      std::printf("write-only (memset 512 MiB): %.1f GB/s\n", copy_bytes / ws / 1e3);
      LaunchArgs big{};
      LaunchArgsN<1> small{};
      const double nb = time_median_us(s, iters, [&](int) { null_kernel_big<<<1, 32, 0, s>>>(big); });
      const double ns = time_median_us(s, iters, [&](int) { null_kernel_small<<<1, 32, 0, s>>>(small); });
      const double nbe = time_median_us(s, iters, [&](int) { null_kernel_big<<<1, 32, 0, s>>>(big); }, Timing::kEvents);
      const double nse = time_median_us(s, iters, [&](int) { null_kernel_small<<<1, 32, 0, s>>>(small); }, Timing::kEvents);
      std::printf("empty kernel: %.2f us with the %zu-byte argument block, %.2f us with the %zu-byte one (events per call: %.2f / %.2f us)\n",
                  nb, sizeof big, ns, sizeof small, nbe, nse);
    }
    std::fflush(stdout);

    const std::vector<Case> cases = {{"1024x4096", {1024LL * 4096}},
                                     {"2048x8192", {2048LL * 8192}},
                                     {"4096x14336", {4096LL * 14336}},
                                     {"8192x28672", {8192LL * 28672}},
                                     {"mlp3 1024x4096", {1024LL * 4096, 1024LL * 4096, 1024LL * 4096}}};
    std::FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
    if (csv) std::fprintf(csv, "shape,dtype,threads,units,hints,grid,options,us,gbps,pct_of_copy,floor_us,mismatches\n");
    std::vector<Result> all;
    DeviceBuffer diff(8);

    for (const Case& c : cases) {
      std::int64_t elements = 0;
      for (auto n : c.numels) elements += n;
      for (nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_BF16}) {
        const char* dn = d == NF4_DTYPE_F16 ? "fp16" : "bf16";
        std::int64_t bytes = 0;
        for (std::int64_t n : c.numels) bytes += (n + 1) / 2 + (n + 63) / 64 + ((n + 63) / 64 + 255) / 256 * 4 + n * 2;
        const int rot = rotations_for(bytes);
        std::vector<std::vector<std::unique_ptr<Weight>>> ws(rot);
        std::vector<std::vector<nf4_tensor>> ts(rot);
        std::uint64_t seed = 1;
        for (int r = 0; r < rot; ++r)
          for (std::int64_t n : c.numels) {
            ws[r].push_back(std::make_unique<Weight>(n, d, seed++, s));
            ts[r].push_back(ws[r].back()->t);
          }
        // Reference output: the library's default variant.
        enqueue(ts[0].data(), ts[0].size(), s, dev);
        for (auto& w : ws[0]) {
          w->ref = DeviceBuffer(w->out.size());
          check(cudaMemcpyAsync(w->ref.get(), w->out.get(), w->out.size(), cudaMemcpyDeviceToDevice, s), "copy");
        }
        const double floor_us = bytes / copy_gbps / 1e3;
        const double lib_us = time_median_us(s, iters, [&](int i) { enqueue(ts[i % rot].data(), ts[i % rot].size(), s, dev); });
        const KernelConfig lc = select_config(dev.cc, elements, c.numels.size());
        std::printf("\n== %s %s: %lld bytes, floor %.2f us, %d rotations; library default %s: %.2f us (%.1f%%)\n", c.name.c_str(), dn,
                    static_cast<long long>(bytes), floor_us, rot, cfg_str(lc).c_str(), lib_us, 100 * floor_us / lib_us);
        if (d == NF4_DTYPE_F16) {
          // The same traffic as a copy, and as the kernel's access pattern without arithmetic
          // (inside the 512 MiB buffers, at rotating offsets).
          const std::int64_t span = copy_bytes - bytes;
          const double cu = span <= 0 ? 0.0 : time_median_us(s, iters, [&](int i) {
            const std::size_t off = static_cast<std::size_t>((i % 8) * (bytes / 2) % span);
            check(cudaMemcpyAsync(static_cast<char*>(big_b[i % 2].get()) + off, static_cast<char*>(big_a[i % 2].get()) + off,
                                  static_cast<std::size_t>(bytes / 2), cudaMemcpyDeviceToDevice, s),
                  "copy");
          });
          const unsigned units = static_cast<unsigned>(elements / 8);
          const double eu = span <= 0 ? 0.0 : time_median_us(s, iters, [&](int i) {
            const std::size_t off = static_cast<std::size_t>((i % 4) * bytes % span) / 16 * 16;
            const auto* in = reinterpret_cast<const std::uint32_t*>(static_cast<char*>(big_a[i % 2].get()) + off);
            auto* out = reinterpret_cast<uint4*>(static_cast<char*>(big_b[i % 2].get()) + off);
            expand_kernel<2><<<(units + 511) / 512, 256, 0, s>>>(in, out, units);
          });
          std::printf("same bytes as a device copy: %.2f us (%.1f%% of the ceiling); as the expand pattern: %.2f us (%.1f%%)\n", cu,
                      100 * floor_us / cu, eu, 100 * floor_us / eu);
        }
        std::fflush(stdout);

        // The sweep.
        std::vector<KernelConfig> configs;
        const std::vector<int> threads = quick ? std::vector<int>{128} : std::vector<int>{128, 256};
        if (d == NF4_DTYPE_F16) {
          for (int T : threads)
            for (int U : {1, 2, 4, 8})
              for (int H : {0, 3, 7})
                for (int S : {0, static_cast<int>(kOptSingleChunkArgs)})
                  for (Grid C : {Grid::per_group(), Grid::occupancy(1), Grid::occupancy(2)})
                    for (int O : {0, 1, 2, 3}) {
                      if (C == Grid::per_group() && (O & kOptPipeline)) continue;  // one group per CTA: nothing to pipeline
                      if (U == 8 && (O & kOptPipeline)) continue;  // not built: spills
                      configs.push_back(KernelConfig{T, U, H, C, O | S});
                    }
        } else {
          for (int T : threads)
            for (int U : {2, 4, 8})
              for (Grid C : {Grid::per_group(), Grid::occupancy(1)})
                for (int O : {0, 1, 3}) {
                  if (C == Grid::per_group() && (O & kOptPipeline)) continue;
                  if (U == 8 && (O & kOptPipeline)) continue;
                  configs.push_back(KernelConfig{T, U, 3, C, O | kOptSingleChunkArgs});
                }
        }
        Result best{c.name, dn, {}, 1e30, 0};
        for (const KernelConfig& kc : configs) {
          const double us = time_median_us(s, iters, [&](int i) {
            enqueue(ts[i % rot].data(), ts[i % rot].size(), s, dev, kc, kMaxChunkElements, tune_launch);
          });
          // Bit-exact against the reference.
          check(cudaMemsetAsync(diff.get(), 0, 8, s), "memset");
          enqueue(ts[0].data(), ts[0].size(), s, dev, kc, kMaxChunkElements, tune_launch);
          for (auto& w : ws[0])
            count_diff<<<256, 256, 0, s>>>(static_cast<const std::uint32_t*>(w->out.get()), static_cast<const std::uint32_t*>(w->ref.get()),
                                           static_cast<std::int64_t>(w->out.size() / 4), static_cast<unsigned long long*>(diff.get()));
          unsigned long long mism = 0;
          check(cudaMemcpyAsync(&mism, diff.get(), 8, cudaMemcpyDeviceToHost, s), "download");
          check(cudaStreamSynchronize(s), "sync");
          const double pct = 100.0 * floor_us / us;
          all.push_back(Result{c.name, dn, kc, us, pct});
          if (csv)
            std::fprintf(csv, "%s,%s,%d,%d,%d,%s,%d,%.3f,%.1f,%.2f,%.3f,%llu\n", c.name.c_str(), dn, kc.threads, kc.units, kc.hints, grid_str(kc.grid).c_str(),
                         kc.options, us, bytes / us / 1e3, pct, floor_us, mism);
          if (mism) std::printf("MISMATCH: %s %llu words differ\n", cfg_str(kc).c_str(), mism);
          if (us < best.us) best = all.back();
        }
        std::printf("best %s: %.2f us, %.1f%% of copy\n", cfg_str(best.c).c_str(), best.us, best.pct);
        std::vector<Result> mine;
        for (const Result& r : all)
          if (r.shape == c.name && r.dtype == dn) mine.push_back(r);
        std::sort(mine.begin(), mine.end(), [](const Result& a, const Result& b) { return a.us < b.us; });
        for (std::size_t i = 0; i < std::min<std::size_t>(10, mine.size()); ++i)
          std::printf("  #%zu %s %.2f us %.1f%%\n", i + 1, cfg_str(mine[i].c).c_str(), mine[i].us, mine[i].pct);
        if (d == NF4_DTYPE_F16) {
          // Hint A/B and option A/B at the best geometry.
          std::printf("hints at the best geometry:");
          for (const Result& r : mine)
            if (r.c.threads == best.c.threads && r.c.units == best.c.units && r.c.grid == best.c.grid && r.c.options == best.c.options)
              std::printf(" h%d=%.2f", r.c.hints, r.us);
          std::printf("\noptions at the best geometry:");
          for (const Result& r : mine)
            if (r.c.threads == best.c.threads && r.c.units == best.c.units && r.c.grid == best.c.grid && r.c.hints == best.c.hints)
              std::printf(" o%d=%.2f", r.c.options, r.us);
          std::printf("\n");
          // Where the time goes: device-clock span from the first CTA's start to the last CTA's end,
          // against the event time.
          for (int U : {2, 4})
            for (int O : {0, 1, 3})
              for (int S : {0, static_cast<int>(kOptSingleChunkArgs)}) {
                const KernelConfig kc{128, U, 3, (O & kOptPipeline) ? Grid::occupancy(1) : Grid::per_group(), O | kOptTimestamps | S};
                std::vector<unsigned long long> host(2 * static_cast<std::size_t>(iters + 2));
                for (std::size_t i = 0; i < host.size(); i += 2) host[i] = ~0ull, host[i + 1] = 0;
                check(cudaMemcpy(stamps.get(), host.data(), host.size() * 8, cudaMemcpyHostToDevice), "upload");
                int call = 0;
                const double us = time_median_us(
                    s, iters,
                    [&](int i) {
                      g_timestamps = static_cast<unsigned long long*>(stamps.get()) + 2 * call++;
                      enqueue(ts[i % rot].data(), ts[i % rot].size(), s, dev, kc, kMaxChunkElements, tune_launch);
                    },
                    Timing::kEvents);  // one stamp pair per launch: not replayable
                g_timestamps = nullptr;
                check(cudaMemcpy(host.data(), stamps.get(), host.size() * 8, cudaMemcpyDeviceToHost), "download");
                std::vector<double> span;
                for (int i = 2; i < iters + 2; ++i) span.push_back((host[2 * i + 1] - host[2 * i]) / 1e3);
                std::printf("timestamps %s: event %.2f us, first CTA start to last CTA end %.2f us\n", cfg_str(kc).c_str(), us, median(span));
              }
        }
        std::fflush(stdout);
      }
    }

    // Configs good everywhere: the mean over cases of time / best time of that case (fp16).
    std::map<std::string, double> best_of;
    for (const Result& r : all) {
      const std::string k = r.shape + r.dtype;
      if (!best_of.count(k) || r.us < best_of[k]) best_of[k] = r.us;
    }
    using Key = std::tuple<int, int, int, Grid, int>;
    std::map<Key, std::pair<double, int>> score_large, score_small;
    for (const Result& r : all) {
      if (r.dtype != "fp16") continue;
      auto& m = r.shape.rfind("1024", 0) == 0 || r.shape.rfind("mlp", 0) == 0 ? score_small : score_large;
      auto& e = m[{r.c.threads, r.c.units, r.c.hints, r.c.grid, r.c.options}];
      e.first += r.us / best_of[r.shape + r.dtype];
      e.second += 1;
    }
    for (auto* m : {&score_large, &score_small}) {
      std::vector<std::pair<double, Key>> v;
      for (auto& [k, e] : *m) v.push_back({e.first / e.second, k});
      std::sort(v.begin(), v.end());
      std::printf("\n%s shapes: configs by mean time / best time (fp16)\n", m == &score_large ? "large (2048x8192 and up)" : "small (1024x4096, mlp3)");
      for (std::size_t i = 0; i < std::min<std::size_t>(12, v.size()); ++i) {
        const auto [T, U, H, C, O] = v[i].second;
        std::printf("  %s %.4f\n", cfg_str(KernelConfig{T, U, H, C, O}).c_str(), v[i].first);
      }
    }
    if (csv) std::fclose(csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nf4_cuda_tune: %s\n", e.what());
    return 1;
  }
  return 0;
}
