// SPDX-License-Identifier: MIT
// nf4_cuda_tune: sweeps the kernel's launch geometry and cache hints on the GPU at hand and
// prints, per shape and dtype, the time of every variant against the copy ceiling of the same
// run; tuning.h is filled from its output (docs/PERFORMANCE.md keeps the tables). Built with
// -DNF4_CUDA_TUNER=ON for the native architecture only; not part of the library.
//
//   nf4_cuda_tune [--iters N] [--quick] [--csv FILE]
//
// Inputs are random codes and statistics made on the device (nested NF4, blocksize 64, nested
// blocksize 256, the offset as a device pointer): the kernel's speed does not depend on values.
// Every variant's output is compared with the library's default variant bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/cpu/quantizer.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernel.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/tuning.h"
#include "core/bench_util.h"
#include "core/error.h"

using namespace nf4;
using namespace nf4::cuda;

namespace {

constexpr int kMaxHints = 8;  // every combination of the three hint bits

template <nf4_dtype D, int U, int H>
cudaError_t launch_variant(const KernelConfig& c, unsigned grid, const LaunchArgs& args, cudaStream_t s) {
  void* params[] = {const_cast<LaunchArgs*>(&args)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&dequantize_kernel<D, U, H>), dim3(grid), dim3(static_cast<unsigned>(c.threads)),
                          params, 0, s);
}

template <nf4_dtype D, int U, int H>
cudaError_t dispatch(const KernelConfig& c, unsigned grid, const LaunchArgs& args, cudaStream_t s) {
  if (c.units == U && c.hints == H) return launch_variant<D, U, H>(c, grid, args, s);
  if constexpr (H + 1 < kMaxHints) return dispatch<D, U, H + 1>(c, grid, args, s);
  else if constexpr (U < 8) return dispatch<D, U * 2, 0>(c, grid, args, s);
  else return cudaErrorInvalidValue;
}

cudaError_t tune_launch(nf4_dtype d, const KernelConfig& c, unsigned grid, const LaunchArgs& args, cudaStream_t s) {
  if (d == NF4_DTYPE_F16) return dispatch<NF4_DTYPE_F16, 1, 0>(c, grid, args, s);
  if (d == NF4_DTYPE_BF16) return dispatch<NF4_DTYPE_BF16, 1, 0>(c, grid, args, s);
  return launch_dequantize(d, c, grid, args, s);  // fp32: the library's variants
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

class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

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
    std::printf("nf4_cuda_tune: %s, sm_%d, %d SMs, L2 %lld MiB\n", dev.name.c_str(), dev.cc, dev.sms, static_cast<long long>(dev.l2_bytes >> 20));
    Stream s;
    const auto rotations_for = [&](std::int64_t bytes) {
      return static_cast<int>(std::clamp<std::int64_t>((4 * dev.l2_bytes + bytes - 1) / std::max<std::int64_t>(bytes, 1), 2, 64));
    };

    // Copy ceiling: 512 MiB device-to-device, as `nf4 bench` measures it.
    const std::int64_t copy_bytes = std::int64_t{512} << 20;
    double copy_gbps = 0;
    {
      DeviceBuffer a[2] = {DeviceBuffer(copy_bytes), DeviceBuffer(copy_bytes)}, b[2] = {DeviceBuffer(copy_bytes), DeviceBuffer(copy_bytes)};
      for (auto& x : a) check(cudaMemset(x.get(), 1, copy_bytes), "memset");
      const double us = time_median_us(s, iters, [&](int i) {
        check(cudaMemcpyAsync(b[i % 2].get(), a[i % 2].get(), copy_bytes, cudaMemcpyDeviceToDevice, s), "copy");
      });
      copy_gbps = 2.0 * copy_bytes / us / 1e3;
      std::printf("copy ceiling: %.1f GB/s (512 MiB in %.1f us)\n", copy_gbps, us);
      const double ws = time_median_us(s, iters, [&](int i) { check(cudaMemsetAsync(b[i % 2].get(), i, copy_bytes, s), "memset"); });
      std::printf("write-only (memset) : %.1f GB/s\n", copy_bytes / ws / 1e3);
      // The kernel's read:write mix (1:4) without arithmetic, on 4096x14336 fp16-sized buffers.
      const unsigned units = 4096u * 14336u / 8u;
      for (int u : {1, 2, 4}) {
        for (int ctas : {0, 8}) {
          const unsigned groups = (units + 256 * u - 1) / (256 * u);
          const unsigned grid = ctas ? std::min<unsigned>(groups, static_cast<unsigned>(dev.sms * ctas)) : groups;
          const double es = time_median_us(s, iters, [&](int i) {
            const auto* in = static_cast<const std::uint32_t*>(a[i % 2].get());
            auto* out = static_cast<uint4*>(b[i % 2].get());
            if (u == 1) expand_kernel<1><<<grid, 256, 0, s>>>(in, out, units);
            if (u == 2) expand_kernel<2><<<grid, 256, 0, s>>>(in, out, units);
            if (u == 4) expand_kernel<4><<<grid, 256, 0, s>>>(in, out, units);
          });
          check(cudaGetLastError(), "expand");
          const double bytes = units * 20.0;
          std::printf("expand 4B->16B pattern, U=%d ctas/SM=%d: %.1f us, %.1f GB/s, %.1f%% of copy\n", u, ctas, es, bytes / es / 1e3,
                      100.0 * bytes / es / 1e3 / copy_gbps);
        }
      }
    }
    std::fflush(stdout);

    std::vector<Case> cases = {{"1024x4096", {1024LL * 4096}},
                               {"2048x8192", {2048LL * 8192}},
                               {"4096x14336", {4096LL * 14336}},
                               {"8192x28672", {8192LL * 28672}},
                               {"mlp3 1024x4096", {1024LL * 4096, 1024LL * 4096, 1024LL * 4096}}};
    std::vector<int> threads = {128, 256, 512}, units = {1, 2, 4, 8}, ctas = {0, 4, 8, 16}, hints;
    for (int h = 0; h < kMaxHints; ++h) hints.push_back(h);
    if (quick) {
      threads = {256};
      ctas = {0, 8};
    }
    std::FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
    if (csv) std::fprintf(csv, "shape,dtype,threads,units,hints,ctas_per_sm,us,gbps,pct_of_copy,floor_us,mismatches\n");
    std::vector<Result> all;
    DeviceBuffer diff(8);

    for (const Case& c : cases)
      for (nf4_dtype d : {NF4_DTYPE_F16, NF4_DTYPE_BF16}) {
        const char* dn = d == NF4_DTYPE_F16 ? "fp16" : "bf16";
        std::int64_t bytes = 0;
        for (std::int64_t n : c.numels) bytes += (n + 1) / 2 + (n + 63) / 64 + (n / 64 + 255) / 256 * 4 + n * 2;
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
        const KernelConfig lc = select_config(dev.cc, [&] {
          std::int64_t t = 0;
          for (auto n : c.numels) t += n;
          return t;
        }());
        std::printf("\n== %s %s: %lld bytes, floor %.2f us, %d rotations; library default {%d,%d,%d,%d}: %.2f us (%.1f%%)\n", c.name.c_str(), dn,
                    static_cast<long long>(bytes), floor_us, rot, lc.threads, lc.units, lc.hints, lc.ctas_per_sm, lib_us, 100 * floor_us / lib_us);
        std::fflush(stdout);
        Result best{c.name, dn, {}, 1e30, 0};
        for (int T : threads)
          for (int U : units)
            for (int C : ctas)
              for (int H : hints) {
                const KernelConfig kc{T, U, H, C};
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
                  std::fprintf(csv, "%s,%s,%d,%d,%d,%d,%.3f,%.1f,%.2f,%.3f,%llu\n", c.name.c_str(), dn, T, U, H, C, us, bytes / us / 1e3, pct, floor_us,
                               mism);
                if (mism) std::printf("MISMATCH: {%d,%d,%d,%d} %llu words differ\n", T, U, H, C, mism);
                if (us < best.us) best = all.back();
              }
        std::printf("best {%d,%d,%d,%d}: %.2f us, %.1f%% of copy\n", best.c.threads, best.c.units, best.c.hints, best.c.ctas_per_sm, best.us,
                    best.pct);
        // Hint A/B at the best geometry.
        std::printf("hints at T=%d U=%d ctas=%d:", best.c.threads, best.c.units, best.c.ctas_per_sm);
        for (const Result& r : all)
          if (r.shape == c.name && r.dtype == dn && r.c.threads == best.c.threads && r.c.units == best.c.units && r.c.ctas_per_sm == best.c.ctas_per_sm)
            std::printf(" h%d=%.2f", r.c.hints, r.us);
        std::printf("\n");
        // Top 8.
        std::vector<Result> mine;
        for (const Result& r : all)
          if (r.shape == c.name && r.dtype == dn) mine.push_back(r);
        std::sort(mine.begin(), mine.end(), [](const Result& a, const Result& b) { return a.us < b.us; });
        for (std::size_t i = 0; i < std::min<std::size_t>(8, mine.size()); ++i)
          std::printf("  #%zu {%d,%d,%d,%d} %.2f us %.1f%%\n", i + 1, mine[i].c.threads, mine[i].c.units, mine[i].c.hints, mine[i].c.ctas_per_sm,
                      mine[i].us, mine[i].pct);
        std::fflush(stdout);
      }

    // Configs good everywhere: the sum over cases of time / best time of that case.
    std::map<std::string, double> best_of;
    for (const Result& r : all) {
      const std::string k = r.shape + r.dtype;
      if (!best_of.count(k) || r.us < best_of[k]) best_of[k] = r.us;
    }
    std::map<std::tuple<int, int, int, int>, std::pair<double, int>> score_large, score_small;
    for (const Result& r : all) {
      auto& m = r.shape.rfind("1024", 0) == 0 || r.shape.rfind("mlp", 0) == 0 ? score_small : score_large;
      auto& e = m[{r.c.threads, r.c.units, r.c.hints, r.c.ctas_per_sm}];
      e.first += r.us / best_of[r.shape + r.dtype];
      e.second += 1;
    }
    for (auto* m : {&score_large, &score_small}) {
      std::vector<std::pair<double, std::tuple<int, int, int, int>>> v;
      for (auto& [k, e] : *m) v.push_back({e.first / e.second, k});
      std::sort(v.begin(), v.end());
      std::printf("\n%s shapes: configs by mean time / best time\n", m == &score_large ? "large (2048x8192 and up)" : "small (1024x4096, mlp3)");
      for (std::size_t i = 0; i < std::min<std::size_t>(10, v.size()); ++i) {
        const auto [T, U, H, C] = v[i].second;
        std::printf("  {%d,%d,%d,%d} %.4f\n", T, U, H, C, v[i].first);
      }
    }
    if (csv) std::fclose(csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nf4_cuda_tune: %s\n", e.what());
    return 1;
  }
  return 0;
}
