// SPDX-License-Identifier: MIT
// The bitsandbytes peer (`nf4_lab bench --peer-bnb LIB`): its exported C entry points loaded at
// run time from the library the user names, timed like our kernels and checked against them.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "core/backend.h"
#include "bench/cuda/cuda_bench.h"
#include "lab/bnb_peer.h"
#include "core/error.h"
#include "core/tensor.h"

namespace nf4::lab {

using namespace nf4::cuda;

double time_bitsandbytes_us(Backend& backend, const char* library, const nf4_tensor* host, std::size_t count, int rotations,
                            int iters) {
  auto* device = backend.extension<DeviceExtension>();
  if (!device) {
    std::fprintf(stderr, "peer: bitsandbytes runs on the cuda backend only\n");
    return -1.0;
  }
  const DeviceScope scope(device->chosen_device());
  const DeviceInfo& dev = device->current_device();
  const std::optional<KernelConfig>& forced = device->forced_config();
  // bitsandbytes' exported C entry points, as Unsloth's fast_dequantize calls
  // them: the 8-bit blockwise dequantization of the nested absmax, `absmax += offset` (a PyTorch
  // elementwise kernel; ours here), then the 4-bit dequantization.
  using Fn = void (*)(float* code, unsigned char* a, float* absmax, void* out, int blocksize, int n, cudaStream_t stream);
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "peer: cannot load %s: %s\n", library, dlerror());
    return -1.0;
  }
  const std::unique_ptr<void, int (*)(void*)> closer(lib, dlclose);
  const auto sym = [&](const std::string& name) { return reinterpret_cast<Fn>(dlsym(lib, name.c_str())); };
  const Fn deq8 = sym("cdequantize_blockwise_fp32");
  std::vector<Fn> deq4(count);
  for (std::size_t i = 0; i < count; ++i) {
    const nf4_tensor& t = host[i];
    const char* d = t.out_dtype == NF4_DTYPE_F16 ? "fp16" : t.out_dtype == NF4_DTYPE_BF16 ? "bf16" : "fp32";
    deq4[i] = sym(std::string("cdequantize_blockwise_") + d + (t.quant_type == NF4_QUANT_NF4 ? "_nf4" : "_fp4"));
    if (!deq4[i] || !deq8) {
      std::fprintf(stderr, "peer: %s lacks the cdequantize_blockwise_* entry points\n", library);
      return -1.0;
    }
    if (t.numel > 0x7fffffff) {
      std::fprintf(stderr, "peer: bitsandbytes takes an int element count; %lld elements is too many\n", static_cast<long long>(t.numel));
      return -1.0;
    }
  }
  rotations = std::max(rotations, 1);
  Stream s;
  std::vector<std::unique_ptr<DeviceTensors>> copies;
  std::vector<DeviceBuffer> scratch;  // the fp32 absmax bitsandbytes materializes, per rotation and tensor
  for (int r = 0; r < rotations; ++r) {
    copies.push_back(std::make_unique<DeviceTensors>(host, count));
    copies.back()->upload(s);
    for (std::size_t i = 0; i < count; ++i) scratch.emplace_back(static_cast<std::size_t>(host[i].absmax_count) * 4);
  }
  // The offset as a 0-d device tensor, as bitsandbytes keeps it.
  std::vector<DeviceBuffer> offsets;
  for (std::size_t i = 0; i < count; ++i) {
    offsets.emplace_back(4);
    check(cudaMemcpyAsync(offsets.back().get(), host[i].nested_offset_ptr ? host[i].nested_offset_ptr : &host[i].nested_offset, 4,
                          cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  const auto run = [&](int it) {
    const int r = it % rotations;
    const nf4_tensor* ts = copies[r]->tensors();
    for (std::size_t i = 0; i < count; ++i) {
      const nf4_tensor& t = ts[i];
      float* absmax = const_cast<float*>(static_cast<const float*>(t.absmax));
      if (t.nested) {
        absmax = static_cast<float*>(scratch[r * count + i].get());
        deq8(const_cast<float*>(t.nested_code), static_cast<unsigned char*>(const_cast<void*>(t.absmax)), const_cast<float*>(t.nested_absmax),
             absmax, t.nested_blocksize, static_cast<int>(t.absmax_count), s);
        check(launch_add_offset(absmax, t.absmax_count, static_cast<const float*>(offsets[i].get()), s), "add offset");
      }
      deq4[i](const_cast<float*>(t.quant_map), const_cast<std::uint8_t*>(t.packed), absmax, t.out, t.blocksize, static_cast<int>(t.numel), s);
    }
  };
  double us = 0;
  try {
    us = time_median_us(s, iters, run);
  } catch (const Error& e) {
    // bitsandbytes might call something a stream capture refuses: time it per call instead.
    std::fprintf(stderr, "peer: %s; timing per call with events instead\n", e.what());
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    us = time_median_us(s, iters, run, bench::Timing::kEvents);
  }
  check(cudaGetLastError(), "bitsandbytes launches");

  // Cross-check: bitsandbytes' output against ours on the same inputs, bit for bit.
  run(0);
  std::vector<std::vector<std::uint8_t>> theirs(count), ours(count);
  for (std::size_t i = 0; i < count; ++i) {
    theirs[i].resize(static_cast<std::size_t>(expected_sizes(host[i]).out_bytes));
    check(cudaMemcpyAsync(theirs[i].data(), copies[0]->tensors()[i].out, theirs[i].size(), cudaMemcpyDeviceToHost, s), "download");
  }
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  enqueue(copies[0]->tensors(), count, s, dev, forced);
  std::int64_t differing = 0, total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    ours[i].resize(theirs[i].size());
    check(cudaMemcpyAsync(ours[i].data(), copies[0]->tensors()[i].out, ours[i].size(), cudaMemcpyDeviceToHost, s), "download");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const std::size_t es = nf4_dtype_size(host[i].out_dtype);
    for (std::size_t e = 0; e < ours[i].size(); e += es) differing += std::memcmp(&ours[i][e], &theirs[i][e], es) != 0;
    total += host[i].numel;
  }
  std::fprintf(stderr, "peer: bitsandbytes vs nf4 cuda on the same inputs: %lld of %lld elements differ\n", static_cast<long long>(differing),
               static_cast<long long>(total));
  return us;
}

}  // namespace nf4::lab
