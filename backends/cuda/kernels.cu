// SPDX-License-Identifier: MIT
// The library's kernel instantiations and their host entry points (kernels.h).
#include <cmath>

#include "backends/cuda/kernel.cuh"
#include "backends/cuda/kernels.h"
#include "backends/cuda/variants.h"

namespace nf4::cuda {
namespace {

template <nf4_dtype D>
cudaError_t resolve_dtype(const KernelConfig& c, std::uint32_t chunk_count, std::uint32_t total_groups, int sms, KernelLaunch* k) {
#define NF4_X(u, h, o)                                                                  \
  if (c.units == (u) && c.hints == (h) && c.options == (o))                             \
    return resolve_variant<D, u, h, (o) & kKernelOptionMask, ((o) & kOptSingleChunkArgs) != 0>(c, chunk_count, total_groups, sms, k);
  NF4_CUDA_VARIANTS(NF4_X)
#undef NF4_X
  return cudaErrorInvalidValue;
}

__global__ void conversion_check_kernel(testing::ConversionReport* r) {
  unsigned long long checked = 0, f16_bad = 0, bf16_bad = 0;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t x = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; x <= 0xffffffffull; x += stride) {
    const auto bits = static_cast<std::uint32_t>(x);
    // A product that is NaN is the canonical NaN on the device; other NaN inputs never reach
    // the conversions.
    if ((bits & 0x7fffffffu) > 0x7f800000u && bits != 0x7fffffffu) continue;
    const float f = __uint_as_float(bits);
    ++checked;
    const auto f16 = static_cast<std::uint16_t>(pack2<NF4_DTYPE_F16>(f, 0.0f));
    const auto bf16 = static_cast<std::uint16_t>(pack2<NF4_DTYPE_BF16>(0.0f, f) >> 16);
    if (f16 != f16_from_bits(bits)) {
      ++f16_bad;
      atomicCAS(&r->first_f16_mismatch, 0u, bits);
    }
    if (bf16 != bf16_from_bits(bits)) {
      ++bf16_bad;
      atomicCAS(&r->first_bf16_mismatch, 0u, bits);
    }
  }
  atomicAdd(&r->checked, checked);
  atomicAdd(&r->f16_mismatches, f16_bad);
  atomicAdd(&r->bf16_mismatches, bf16_bad);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    volatile float one = 1.0f;  // keeps the product at run time
    r->fmul_nan_bits = __float_as_uint(__fmul_rn(__uint_as_float(0x7fc12345u), one));
  }
}

}  // namespace

bool has_variant(nf4_dtype dtype, const KernelConfig& c) {
  if (!find_dtype(static_cast<std::int32_t>(dtype))) return false;
#define NF4_X(u, h, o) \
  if (c.units == (u) && c.hints == (h) && c.options == (o)) return true;
  NF4_CUDA_VARIANTS(NF4_X)
#undef NF4_X
  return false;
}

cudaError_t resolve_dequantize(nf4_dtype dtype, const KernelConfig& config, std::uint32_t chunk_count, std::uint32_t total_groups,
                               int sms, KernelLaunch* launch) {
  if (!find_dtype(static_cast<std::int32_t>(dtype))) return cudaErrorInvalidValue;
  return dispatch_dtype(dtype, [&](auto d) { return resolve_dtype<decltype(d)::value>(config, chunk_count, total_groups, sms, launch); });
}

cudaError_t launch_resolved(const KernelLaunch& k, const LaunchArgs& args, cudaStream_t stream) {
  LaunchArgsN<1> one;
  void* params[1] = {const_cast<LaunchArgs*>(&args)};
  if (k.one_chunk_args) {
    one.chunks[0] = args.chunks[0];
    for (int i = 0; i < 16; ++i) one.fp4_table[i] = args.fp4_table[i];
    one.chunk_count = 1;
    one.total_groups = args.total_groups;
    one.timestamps = args.timestamps;
    params[0] = &one;
  }
  // cudaLaunchKernel returns this launch's own error (cudaGetLastError would also report an
  // earlier, unrelated failure of the caller's).
  if (k.pdl && stream_takes_pdl(stream)) {
    cudaLaunchAttribute attr[1] = {pdl_attribute()};
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(k.grid);
    lc.blockDim = dim3(k.threads);
    lc.dynamicSmemBytes = 0;
    lc.stream = stream;
    lc.attrs = attr;
    lc.numAttrs = 1;
    return cudaLaunchKernelExC(&lc, k.fn, params);
  }
  return cudaLaunchKernel(k.fn, dim3(k.grid), dim3(k.threads), params, 0, stream);
}

cudaError_t launch_dequantize(nf4_dtype dtype, const KernelConfig& config, const LaunchArgs& args, int sms, cudaStream_t stream) {
  KernelLaunch k;
  const cudaError_t e = resolve_dequantize(dtype, config, args.chunk_count, args.total_groups, sms, &k);
  return e != cudaSuccess ? e : launch_resolved(k, args, stream);
}

cudaError_t check_kernel_image() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&dequantize_kernel<NF4_DTYPE_F16, 4, 0, 0, kMaxChunksPerLaunch>));
}

namespace testing {

cudaError_t exhaustive_conversion_check(ConversionReport* report) {
  ConversionReport* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof *d);
  if (e != cudaSuccess) return e;
  e = cudaMemset(d, 0, sizeof *d);
  if (e == cudaSuccess) {
    conversion_check_kernel<<<1024, 256>>>(d);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(report, d, sizeof *d, cudaMemcpyDeviceToHost);
  const cudaError_t f = cudaFree(d);
  return e != cudaSuccess ? e : f;
}

}  // namespace testing
}  // namespace nf4::cuda
