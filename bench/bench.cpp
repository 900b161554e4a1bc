// SPDX-License-Identifier: MIT
#include "bench/bench.h"

#include <iterator>

namespace nf4::bench {
namespace {

constexpr BenchEntry kRunners[] = {
    {NF4_BACKEND_CPU, make_cpu_runner},
#if defined(NF4_HAVE_CUDA)
    {NF4_BACKEND_CUDA, make_cuda_runner},
#endif
#if defined(NF4_HAVE_VULKAN)
    {NF4_BACKEND_VULKAN, make_vulkan_runner},
#endif
};

}  // namespace

std::unique_ptr<BenchRunner> make_bench_runner(Backend& backend) {
  for (const BenchEntry& e : kRunners)
    if (e.kind == backend.kind()) return e.create(backend);
  return nullptr;
}

}  // namespace nf4::bench
