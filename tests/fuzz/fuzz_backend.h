// SPDX-License-Identifier: MIT
// The backend the C-API fuzz targets (fuzz_capi, fuzz_gemv) call, and what may differ between
// backends in their results.
//
// The targets run on the cpu backend, unless NF4_FUZZ_BACKEND names another (cuda, vulkan): the
// GPU machine replays the seed corpora and the regressions through the GPU backends this way
// (lab/gpu_check.sh, phases fuzz-gpu-cuda under compute-sanitizer and fuzz-gpu-vulkan under the
// Khronos validation layer), with every check of the target unchanged: the status of each call is
// the validation's (so the same as the cpu backend's), a refused call writes nothing, and an
// accepted one writes the oracle's bits and nothing else. A backend that cannot be created ends
// the run: a replay meant for the GPU must never pass on the cpu.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "nf4/nf4.h"
#include "tests/fuzz/fuzz_support.h"

namespace nf4::fuzz {

inline nf4_context* target_context() {
  static nf4_context* ctx = [] {
    const char* name = std::getenv("NF4_FUZZ_BACKEND");
    nf4_backend_kind kind = NF4_BACKEND_CPU;
    if (name && *name)
      FUZZ_ASSERT(nf4_backend_parse(name, &kind) == NF4_OK && kind != NF4_BACKEND_AUTO,
                  "NF4_FUZZ_BACKEND=%s: not a backend name (cpu, cuda, vulkan)", name);
    nf4_context* c = nullptr;
    FUZZ_ASSERT(nf4_context_create(kind, &c) == NF4_OK, "cannot create the %s context: %s", name ? name : "cpu",
                nf4_last_error(nullptr));
    if (kind != NF4_BACKEND_CPU) std::fprintf(stderr, "fuzz target backend: %s (%s)\n", name, nf4_context_device_name(c));
    return c;
  }();
  return ctx;
}

inline bool target_is_cpu() { return nf4_context_backend(target_context()) == NF4_BACKEND_CPU; }

}  // namespace nf4::fuzz
