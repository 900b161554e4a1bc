// SPDX-License-Identifier: MIT
// The bitsandbytes peer of nf4_lab's `bench --peer-bnb LIB` (lab/lab_main.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "nf4/nf4.h"

namespace nf4 {
class Backend;  // core/backend.h (C++20; this header is also compiled as CUDA C++17)
}

namespace nf4::lab {

// bitsandbytes' three-launch path loaded from `library` and timed on the same host tensors, the
// same way as `backend` (the CUDA backend), and its output compared with ours bit for bit
// (printed on stderr). The median in microseconds; < 0 where it cannot run.
double time_bitsandbytes_us(Backend& backend, const char* library, const nf4_tensor* host, std::size_t count, int rotations,
                            int iters);

// absmax[i] += *offset_ptr: the PyTorch `absmax += offset` step between bitsandbytes' two
// launches (bnb_peer_offset.cu).
cudaError_t launch_add_offset(float* absmax, std::int64_t n, const float* offset_ptr, cudaStream_t stream);

}  // namespace nf4::lab
