// SPDX-License-Identifier: MIT
// What the operator (nf4_torch.cpp) and the Python module's prepared launches (module.cpp) share:
// the nf4 contexts, one per device, and the translation of torch arguments into an nf4_tensor
// with every check that only torch can make.
//
// NF4_TORCH_CUDA is defined (by bindings/torch/CMakeLists.txt) when the extension is built with
// the CUDA toolkit; without it nothing here includes a CUDA header, and CUDA tensors are refused
// with a message saying how the package was built.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include "nf4/nf4.h"

namespace nf4_torch {

// The arguments of nf4::dequantize, checked and turned into an nf4_tensor (everything but out).
struct Call {
  nf4_tensor t{};
  at::Device device{at::kCPU};
  int64_t numel = 0;
};

// Throws c10::Error (RuntimeError in Python) naming the operator `op`, the argument and the
// expected and actual values. The format itself (sizes, blocksizes, tables) is left to nf4, which
// checks it when the call runs or is prepared.
Call describe(const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
              const c10::optional<at::Tensor>& nested_absmax, const c10::optional<at::Tensor>& nested_quant_map,
              const c10::optional<at::Tensor>& offset, int64_t blocksize, int64_t nested_blocksize,
              at::IntArrayRef shape, at::ScalarType dtype, c10::string_view quant_type, const char* op = "nf4::dequantize");

// The nf4 context of a CPU or CUDA device, created on first use (thread-safe) and kept until the
// process exits. Throws if it cannot be created (no CUDA backend compiled in, no driver, ...).
nf4_context* context_for(const at::Device& device);

// Whether the tensor's storage holds every byte the (contiguous) tensor claims. A storage freed
// under its tensor (untyped_storage().resize_(0), as FSDP does between uses) or shrunk has no
// memory where the tensor says its data is: a kernel given data_ptr() would read past the
// allocation. Never throws (data_ptr() itself throws for a freed storage, naming no argument).
bool memory_ok(const at::Tensor& t) noexcept;

// Throws naming `name` and the operator `op` unless memory_ok(t).
void check_memory(const at::Tensor& t, const char* name, const char* op);

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte (empty ones share none).
bool bytes_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes);

// Whether two tensors on one device share a byte of memory.
bool shares_memory(const at::Tensor& a, const at::Tensor& b);

// Throws the error of an nf4 call that returned `st`: nf4's status and message, and the
// argument of the operator it concerns (nf4's messages name nf4_tensor's fields: packed is W,
// nested_code is nested_quant_map).
[[noreturn]] void fail_status(const char* op, const std::string& where, nf4_status st, const char* message);

// True when the package was built with its CUDA backend.
constexpr bool kHaveCuda =
#ifdef NF4_TORCH_CUDA
    true;
#else
    false;
#endif

// The message for a CUDA tensor given to a CPU-only build.
[[noreturn]] void refuse_cuda_without_backend(const char* what);

}  // namespace nf4_torch
