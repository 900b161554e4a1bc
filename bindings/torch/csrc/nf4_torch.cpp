// SPDX-License-Identifier: MIT
// The PyTorch operator nf4::dequantize: a thin adapter from torch tensors to nf4's C API.
//
//   CUDA key : nf4's cuda backend, enqueued on torch's current stream for the weight's device
//              (one nf4 context per device, created on first use). No host synchronization, no
//              allocation besides the output, no .item(): the nested offset stays a 0-d device
//              tensor that the kernel reads, so the call can be captured in a CUDA graph.
//   CPU key  : nf4's cpu backend (the oracle, spread over threads): the reference answer.
//   Meta/fake: registered in Python (nf4_torch/_ops.py, torch.library.register_fake), so
//              torch.compile(fullgraph=True) traces through without running anything.
//   Functionalize (the out= overload only): torch.compile rewrites mutations into functional
//              ops, and refuses custom ops that return an alias (`-> Tensor(a!)`) unless they
//              come with a functionalization kernel: this one computes the functional result
//              and writes it back into `out`, as PyTorch's generated kernels do for aten out=.
//
// This file and module.cpp make one shared library, the Python module nf4_torch._C: importing it
// runs TORCH_LIBRARY below (the operator is registered with torch's dispatcher) and module.cpp
// adds the prepared launches that nf4_torch's eager helpers call directly, without the dispatcher.
// Built without CUDA (no NF4_TORCH_CUDA), the CUDA key refuses with a message saying so.
//
// Everything about the format (sizes, blocksizes, table sizes) is validated by nf4 itself; this
// file checks what only torch knows (devices, dtypes, contiguity, int64 -> int32 narrowing) and
// turns nf4's status + last-error message into a c10::Error (RuntimeError in Python).
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#ifdef NF4_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "common.h"

namespace nf4_torch {
namespace {

// ---- contexts ------------------------------------------------------------------------------

// One nf4 context per CUDA device, made on that device (nf4_context_create_on_device: its work runs
// there whatever the calling thread's current device), and one for the CPU. The mutex guards creation, and in the operator it serializes "set stream +
// dequantize": nf4 serializes single calls on a context, but two threads on different torch
// streams must not interleave the pair. (Prepared launches name their stream and take no lock.)
struct Slot {
  std::mutex mutex;
  nf4_context* ctx = nullptr;
};

constexpr int kMaxDevices = 64;

Slot& cpu_slot() {
  static Slot slot;
  return slot;
}

#ifdef NF4_TORCH_CUDA
Slot& cuda_slot(int device) {
  static std::array<Slot, kMaxDevices> slots;
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "nf4::dequantize: CUDA device index ", device,
              " is out of the supported range [0, ", kMaxDevices, ")");
  return slots[static_cast<std::size_t>(device)];
}
#endif

// Creates the slot's context on first use, on CUDA device `device` (ignored for the CPU); the
// caller holds slot.mutex. The contexts live until the process exits (deliberately never
// destroyed: CUDA may already be torn down at exit).
nf4_status create_context(nf4_backend_kind kind, int device, nf4_context** ctx) {
  return kind == NF4_BACKEND_CUDA ? nf4_context_create_on_device(kind, static_cast<size_t>(device), nullptr, ctx)
                                  : nf4_context_create(kind, ctx);
}

nf4_context* context_locked(Slot& slot, nf4_backend_kind kind, int device, const char* what) {
  if (slot.ctx) return slot.ctx;
  nf4_context* ctx = nullptr;
  const nf4_status st = create_context(kind, device, &ctx);
  TORCH_CHECK(st == NF4_OK, "nf4::dequantize: cannot create the nf4 ", what, " context: ",
              nf4_status_string(st), ": ", nf4_last_error(nullptr));
  slot.ctx = ctx;
  return ctx;
}

#ifdef NF4_TORCH_CUDA
// Like context_locked, but returns nullptr instead of throwing (the message stays in
// nf4_last_error(nullptr)).
nf4_context* context_or_null(Slot& slot, nf4_backend_kind kind, int device) {
  if (slot.ctx) return slot.ctx;
  nf4_context* ctx = nullptr;
  if (create_context(kind, device, &ctx) != NF4_OK) return nullptr;
  slot.ctx = ctx;
  return ctx;
}
#endif

// ---- argument checks -----------------------------------------------------------------------

int32_t narrow_int32(int64_t v, const char* name, const char* op) {
  TORCH_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
              op, ": ", name, " must fit in 32 bits, got ", v);
  return static_cast<int32_t>(v);
}

nf4_dtype to_nf4_dtype(at::ScalarType dtype, const char* op, const char* name = "dtype") {
  switch (dtype) {
    case at::kHalf: return NF4_DTYPE_F16;
    case at::kBFloat16: return NF4_DTYPE_BF16;
    case at::kFloat: return NF4_DTYPE_F32;
    default: break;
  }
  TORCH_CHECK(false, op, ": ", name, " must be torch.float16, torch.bfloat16 or torch.float32, got ", dtype);
}

nf4_quant_type to_quant_type(c10::string_view quant_type, const char* op) {
  if (quant_type == "nf4") return NF4_QUANT_NF4;
  if (quant_type == "fp4") return NF4_QUANT_FP4;
  TORCH_CHECK(false, op, ": quant_type must be 'nf4' or 'fp4', got '", std::string(quant_type), "'");
}

void check_tensor(const at::Tensor& t, const char* name, const at::Device& device, c10::optional<at::ScalarType> dtype,
                  const char* op) {
  // Python's None reaches a Tensor argument as an undefined tensor, which has no device to ask
  // about; the layout next: a sparse tensor has no strides to ask about.
  TORCH_CHECK(t.defined(), op, ": ", name, " is None, expected a tensor");
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor, got layout ", t.layout());
  TORCH_CHECK(t.device() == device, op, ": ", name, " must be on ", device, " (the device of W), got ",
              t.device());
  if (dtype)
    TORCH_CHECK(t.scalar_type() == *dtype, op, ": ", name, " must be ", *dtype, ", got ", t.scalar_type());
  TORCH_CHECK(!t.is_complex(), op, ": ", name, " must not be complex, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (shape ", t.sizes(), ", strides ",
              t.strides(), ")");
  check_memory(t, name, op);
}

// The operator's argument that an nf4 status about a description concerns, or nullptr.
const char* argument_of(nf4_status st) {
  switch (st) {
    case NF4_ERR_PACKED_SIZE: return "W";
    case NF4_ERR_ABSMAX_SIZE: return "absmax";
    case NF4_ERR_QUANT_MAP_SIZE: return "quant_map";
    case NF4_ERR_NESTED_ABSMAX_SIZE: return "nested_absmax";
    case NF4_ERR_NESTED_CODE_SIZE: return "nested_quant_map";
    case NF4_ERR_BLOCKSIZE: return "blocksize";
    case NF4_ERR_NESTED_BLOCKSIZE: return "nested_blocksize";
    case NF4_ERR_ELEMENT_COUNT:
    case NF4_ERR_SHAPE: return "shape";
    case NF4_ERR_OUTPUT_TOO_SMALL:
    case NF4_ERR_ALIASING: return "out";
    default: return nullptr;
  }
}

int64_t numel_of(at::IntArrayRef shape, const char* op) {
  int64_t n = 1;
  for (const int64_t d : shape) {
    TORCH_CHECK(d >= 0, op, ": shape must not have negative sizes, got ", shape);
    TORCH_CHECK(d == 0 || n <= NF4_MAX_ELEMENTS / d, op, ": shape ", shape, " has more than 2^56 elements");
    n *= d;
  }
  return n;
}

}  // namespace

Call describe(const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
              const c10::optional<at::Tensor>& nested_absmax, const c10::optional<at::Tensor>& nested_quant_map,
              const c10::optional<at::Tensor>& offset, int64_t blocksize, int64_t nested_blocksize,
              at::IntArrayRef shape, at::ScalarType dtype, c10::string_view quant_type, const char* op) {
  Call c;
  TORCH_CHECK(W.defined(), op, ": W is None, expected a tensor");
  c.device = W.device();
  TORCH_CHECK(c.device.is_cpu() || c.device.is_cuda(), op, ": W must be a CPU or CUDA tensor, got ",
              c.device);
  c.numel = numel_of(shape, op);

  // W holds the packed bytes; bitsandbytes may store them in another dtype (quant_storage), so
  // any dtype is accepted and read as bytes. nf4 checks the byte count against the shape.
  check_tensor(W, "W", c.device, c10::nullopt, op);
  const bool nested = nested_absmax.has_value();
  TORCH_CHECK(nested || !nested_quant_map.has_value(),
              op, ": nested_quant_map is given but nested_absmax is not (both or neither)");
  TORCH_CHECK(!nested || nested_quant_map.has_value(),
              op, ": nested_absmax is given but nested_quant_map is not (both or neither)");
  TORCH_CHECK(nested || !offset.has_value(), op, ": offset is only meaningful with nested statistics "
              "(nested_absmax is None)");
  check_tensor(absmax, "absmax", c.device, nested ? at::kByte : at::kFloat, op);
  check_tensor(quant_map, "quant_map", c.device, at::kFloat, op);

  nf4_tensor& t = c.t;
  t.quant_type = to_quant_type(quant_type, op);
  // An empty tensor's data pointer is NULL, which nf4 would name by its own field; say which
  // argument it is. (FP4 may leave quant_map empty: the kernels use bitsandbytes' own table.)
  const auto not_empty = [&](const at::Tensor& x, const char* name) {
    TORCH_CHECK(c.numel == 0 || x.numel() > 0, op, ": ", name, " is empty, but shape ", shape, " has ", c.numel,
                " elements");
  };
  not_empty(W, "W");
  not_empty(absmax, "absmax");
  if (t.quant_type == NF4_QUANT_NF4) not_empty(quant_map, "quant_map");
  t.out_dtype = to_nf4_dtype(dtype, op);
  t.numel = c.numel;
  t.blocksize = narrow_int32(blocksize, "blocksize", op);
  t.nested = nested ? 1 : 0;
  t.packed = static_cast<const uint8_t*>(W.data_ptr());
  t.packed_bytes = static_cast<int64_t>(W.nbytes());
  t.absmax = absmax.data_ptr();
  t.absmax_count = absmax.numel();
  t.quant_map = quant_map.data_ptr<float>();
  t.quant_map_count = quant_map.numel();

  if (nested) {
    check_tensor(*nested_absmax, "nested_absmax", c.device, at::kFloat, op);
    check_tensor(*nested_quant_map, "nested_quant_map", c.device, at::kFloat, op);
    not_empty(*nested_absmax, "nested_absmax");
    not_empty(*nested_quant_map, "nested_quant_map");
    t.nested_absmax = nested_absmax->data_ptr<float>();
    t.nested_absmax_count = nested_absmax->numel();
    t.nested_code = nested_quant_map->data_ptr<float>();
    t.nested_code_count = nested_quant_map->numel();
    t.nested_blocksize = narrow_int32(nested_blocksize, "nested_blocksize", op);
    t.nested_offset = 0.0f;
    if (offset.has_value()) {
      const at::Tensor& o = *offset;
      TORCH_CHECK(o.numel() == 1, op, ": offset must hold one value (a 0-d tensor), got shape ", o.sizes());
      TORCH_CHECK(o.scalar_type() == at::kFloat, op, ": offset must be torch.float32, got ", o.scalar_type());
      TORCH_CHECK(o.layout() == at::kStrided, op, ": offset must be a dense (strided) tensor, got layout ", o.layout());
      check_memory(o, "offset", op);
      if (o.device() == c.device) {
        // Same memory space as the kernel: pass the pointer, the backend reads it (on CUDA, on
        // the device, at run time: no sync, and a captured graph sees later updates).
        t.nested_offset_ptr = o.data_ptr<float>();
      } else {
        // A host scalar with device data (e.g. a quant state loaded from JSON): reading host
        // memory does not synchronize the device.
        TORCH_CHECK(o.device().is_cpu(), op, ": offset must be on ", c.device, " or the CPU, got ",
                    o.device());
        t.nested_offset = *o.data_ptr<float>();
      }
    }
  }
  return c;
}

bool memory_ok(const at::Tensor& t) noexcept {
  try {
    if (t.numel() == 0) return true;
    if (!t.has_storage()) return false;
    const c10::Storage& s = t.storage();
    if (!s.data()) return false;
    // Contiguous tensors only (every caller checks that first): their last element is numel - 1
    // elements past the first.
    const auto need = static_cast<std::uint64_t>(t.storage_offset() + t.numel()) * static_cast<std::uint64_t>(t.element_size());
    return need <= static_cast<std::uint64_t>(s.nbytes());
  } catch (...) {
    return false;
  }
}

void check_memory(const at::Tensor& t, const char* name, const char* op) {
  if (memory_ok(t)) return;
  const int64_t held = t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
  TORCH_CHECK(false, op, ": ", name, " has no memory behind it: its storage holds ", held, " bytes, the tensor (shape ",
              t.sizes(), ", ", t.scalar_type(), ", storage offset ", t.storage_offset(), ") needs ",
              (t.storage_offset() + t.numel()) * static_cast<int64_t>(t.element_size()),
              " (was its storage freed or resized, e.g. untyped_storage().resize_()?)");
}

bool bytes_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + static_cast<std::uintptr_t>(b_bytes) && y < x + static_cast<std::uintptr_t>(a_bytes);
}

bool shares_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.device() != b.device() || a.numel() == 0 || b.numel() == 0) return false;
  return bytes_overlap(a.data_ptr(), static_cast<int64_t>(a.nbytes()), b.data_ptr(), static_cast<int64_t>(b.nbytes()));
}

void fail_status(const char* op, const std::string& where, nf4_status st, const char* message) {
  const char* arg = argument_of(st);
  TORCH_CHECK(false, op, " (", where, "): ", nf4_status_string(st), ": ", message,
              arg ? std::string(" (argument ") + arg + ")" : std::string());
}

void refuse_cuda_without_backend(const char* what) {
  TORCH_CHECK(false, what, ": nf4_torch was built without its CUDA backend (no CUDA toolkit, or "
              "NF4_TORCH_CUDA=OFF, when it was built), so it takes CPU tensors only. Reinstall it where "
              "nvcc is found: pip install --force-reinstall ./bindings/torch");
}

nf4_context* context_for(const at::Device& device) {
  if (device.is_cpu()) {
    Slot& slot = cpu_slot();
    std::lock_guard<std::mutex> lock(slot.mutex);
    return context_locked(slot, NF4_BACKEND_CPU, 0, "cpu");
  }
  TORCH_CHECK(device.is_cuda(), "nf4_torch: tensors must be on the CPU or a CUDA device, got ", device);
#ifdef NF4_TORCH_CUDA
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  Slot& slot = cuda_slot(index);
  std::lock_guard<std::mutex> lock(slot.mutex);
  return context_locked(slot, NF4_BACKEND_CUDA, index, "cuda");
#else
  refuse_cuda_without_backend("nf4_torch");
#endif
}

namespace {

// Runs `call` (an nf4 C API call on the context it is given) with `device`'s nf4 context, the
// context's slot locked for the call and, on CUDA, the context bound to torch's current stream; a
// failed status becomes an error naming `op`. The first call on a CUDA device creates its context,
// which a CUDA graph capture may refuse: that is reported as such.
template <class F>
void with_context(const c10::Device& device, const char* op, F&& call) {
  if (device.is_cuda()) {
#ifdef NF4_TORCH_CUDA
    const c10::cuda::CUDAGuard guard(device);
    const int index = device.index();
    Slot& slot = cuda_slot(index);
    std::lock_guard<std::mutex> lock(slot.mutex);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).stream();
    if (!slot.ctx) {
      // Creating a context queries the device; inside a CUDA graph capture that may be refused.
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) (void)cudaGetLastError();
      TORCH_CHECK(capture == cudaStreamCaptureStatusNone || context_or_null(slot, NF4_BACKEND_CUDA, index), op,
                  ": the first call on ", device, " is inside a CUDA graph capture and nf4's CUDA context could not be "
                  "created there: ", nf4_last_error(nullptr),
                  ". Call the operator once before capturing (warm-up), as for any CUDA library.");
    }
    nf4_context* ctx = context_locked(slot, NF4_BACKEND_CUDA, index, "cuda");
    nf4_status st = nf4_context_set_cuda_stream(ctx, static_cast<void*>(stream));
    TORCH_CHECK(st == NF4_OK, op, ": cannot set the CUDA stream: ", nf4_status_string(st), ": ", nf4_last_error(ctx));
    st = call(ctx);
    if (st != NF4_OK) fail_status(op, "cuda", st, nf4_last_error(ctx));
#else
    (void)call;
    refuse_cuda_without_backend(op);
#endif
  } else {
    Slot& slot = cpu_slot();
    std::lock_guard<std::mutex> lock(slot.mutex);
    nf4_context* ctx = context_locked(slot, NF4_BACKEND_CPU, 0, "cpu");
    const nf4_status st = call(ctx);
    if (st != NF4_OK) fail_status(op, "cpu", st, nf4_last_error(ctx));
  }
}

void run(Call& c, at::Tensor& out) {
  c.t.out = out.data_ptr();
  c.t.out_bytes = static_cast<int64_t>(out.nbytes());
  with_context(c.device, "nf4::dequantize", [&](nf4_context* ctx) { return nf4_dequantize(ctx, &c.t); });
}

// ---- the two overloads ---------------------------------------------------------------------

at::Tensor& dequantize_out(const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
                           const c10::optional<at::Tensor>& nested_absmax,
                           const c10::optional<at::Tensor>& nested_quant_map, const c10::optional<at::Tensor>& offset,
                           int64_t blocksize, int64_t nested_blocksize, at::IntArrayRef shape, at::ScalarType dtype,
                           c10::string_view quant_type, at::Tensor& out) {
  Call c = describe(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize, nested_blocksize, shape,
                    dtype, quant_type);
  // out must already be what the functional overload would return: resizing an out= argument
  // would reallocate under a caller that expects its buffer (and a CUDA graph's) to stay put.
  TORCH_CHECK(out.device() == c.device, "nf4::dequantize: out must be on ", c.device, ", got ", out.device());
  TORCH_CHECK(out.scalar_type() == dtype, "nf4::dequantize: out must be ", dtype, ", got ", out.scalar_type());
  TORCH_CHECK(out.sizes() == shape, "nf4::dequantize: out must have shape ", shape, ", got ", out.sizes());
  TORCH_CHECK(out.is_contiguous(), "nf4::dequantize: out must be contiguous (strides ", out.strides(), ")");
  if (c.numel == 0) return out;
  check_memory(out, "out", "nf4::dequantize");
  // The kernel reads the inputs while it writes out: a shared byte makes the result depend on
  // the order the threads run in. (nf4 refuses it too, naming its own fields.)
  const auto refuse_overlap = [&](const at::Tensor& input, const char* name) {
    TORCH_CHECK(!shares_memory(out, input), "nf4::dequantize: out overlaps ", name,
                ": out must not share memory with an input");
  };
  refuse_overlap(W, "W");
  refuse_overlap(absmax, "absmax");
  refuse_overlap(quant_map, "quant_map");
  if (nested_absmax) refuse_overlap(*nested_absmax, "nested_absmax");
  if (nested_quant_map) refuse_overlap(*nested_quant_map, "nested_quant_map");
  if (offset) refuse_overlap(*offset, "offset");
  run(c, out);
  return out;
}

at::Tensor dequantize(const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
                      const c10::optional<at::Tensor>& nested_absmax, const c10::optional<at::Tensor>& nested_quant_map,
                      const c10::optional<at::Tensor>& offset, int64_t blocksize, int64_t nested_blocksize,
                      at::IntArrayRef shape, at::ScalarType dtype, c10::string_view quant_type) {
  Call c = describe(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize, nested_blocksize, shape,
                    dtype, quant_type);
  at::Tensor out = at::empty(shape, W.options().dtype(dtype));
  if (c.numel == 0) return out;
  run(c, out);
  return out;
}

// torch.compile / functionalization: out= becomes "dequantize, then replace out's value".
at::Tensor& dequantize_out_functionalize(const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
                                         const c10::optional<at::Tensor>& nested_absmax,
                                         const c10::optional<at::Tensor>& nested_quant_map,
                                         const c10::optional<at::Tensor>& offset, int64_t blocksize,
                                         int64_t nested_blocksize, at::IntArrayRef shape, at::ScalarType dtype,
                                         c10::string_view quant_type, at::Tensor& out) {
  namespace F = at::functionalization::impl;
  const auto unwrap = [](const at::Tensor& t) {
    if (!F::isFunctionalTensor(t)) return t;
    F::sync(t);
    return F::from_functional_tensor(t);
  };
  const auto unwrap_opt = [&](const c10::optional<at::Tensor>& t) -> c10::optional<at::Tensor> {
    if (!t.has_value()) return c10::nullopt;
    return unwrap(*t);
  };
  const at::Tensor W_ = unwrap(W), absmax_ = unwrap(absmax), quant_map_ = unwrap(quant_map);
  const c10::optional<at::Tensor> nested_absmax_ = unwrap_opt(nested_absmax),
                                  nested_quant_map_ = unwrap_opt(nested_quant_map), offset_ = unwrap_opt(offset);

  if (!F::isFunctionalTensor(out)) {
    // A plain out with functional inputs cannot be written consistently; plain everything:
    // nothing to functionalize, run the real kernel.
    TORCH_CHECK(!F::isFunctionalTensor(W) && !F::isFunctionalTensor(absmax) && !F::isFunctionalTensor(quant_map) &&
                    !F::isFunctionalTensor(nested_absmax) && !F::isFunctionalTensor(nested_quant_map) &&
                    !F::isFunctionalTensor(offset),
                "nf4::dequantize.out: out is not a functional tensor but an input is (mutating a non-functional tensor "
                "with a functional one is not allowed)");
    const at::AutoDispatchSkipFunctionalize guard;
    static const auto out_op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("nf4::dequantize", "out")
                                   .typed<decltype(dequantize_out)>();
    out_op.call(W_, absmax_, quant_map_, nested_absmax_, nested_quant_map_, offset_, blocksize, nested_blocksize,
                shape, dtype, quant_type, out);
    return out;
  }

  // Same checks as the real out= kernel, on sizes that may be symbolic while tracing.
  TORCH_CHECK(out.scalar_type() == dtype, "nf4::dequantize: out must be ", dtype, ", got ", out.scalar_type());
  TORCH_CHECK(out.dim() == static_cast<int64_t>(shape.size()), "nf4::dequantize: out must have shape ", shape,
              ", got ", out.sym_sizes());
  for (size_t i = 0; i < shape.size(); ++i)
    TORCH_CHECK(out.sym_size(static_cast<int64_t>(i)) == shape[i], "nf4::dequantize: out must have shape ", shape,
                ", got ", out.sym_sizes());
  at::Tensor result;
  {
    const at::AutoDispatchSkipFunctionalize guard;
    static const auto functional = c10::Dispatcher::singleton()
                                       .findSchemaOrThrow("nf4::dequantize", "")
                                       .typed<decltype(dequantize)>();
    result = functional.call(W_, absmax_, quant_map_, nested_absmax_, nested_quant_map_, offset_, blocksize,
                             nested_blocksize, shape, dtype, quant_type);
  }
  F::replace_(out, result);
  F::commit_update(out);
  F::sync(out);
  return out;
}

}  // namespace

// The weight, then bitsandbytes' quant state field by field, then the output dtype; `quant_type`
// comes last with a default of "nf4", so a call with the first ten arguments only means NF4.
TORCH_LIBRARY(nf4, m) {
  m.def(
      "dequantize(Tensor W, Tensor absmax, Tensor quant_map, Tensor? nested_absmax, Tensor? nested_quant_map, "
      "Tensor? offset, int blocksize, int nested_blocksize, int[] shape, ScalarType dtype, str quant_type=\"nf4\") "
      "-> Tensor");
  m.def(
      "dequantize.out(Tensor W, Tensor absmax, Tensor quant_map, Tensor? nested_absmax, Tensor? nested_quant_map, "
      "Tensor? offset, int blocksize, int nested_blocksize, int[] shape, ScalarType dtype, str quant_type=\"nf4\", *, "
      "Tensor(a!) out) -> Tensor(a!)");
  // The version of the nf4 library linked in (for bug reports and benchmark logs).
  m.def("version() -> str", [] { return std::string(nf4_version()); });
}

TORCH_LIBRARY_IMPL(nf4, CPU, m) {
  m.impl("dequantize", &dequantize);
  m.impl("dequantize.out", &dequantize_out);
}

TORCH_LIBRARY_IMPL(nf4, CUDA, m) {
  m.impl("dequantize", &dequantize);
  m.impl("dequantize.out", &dequantize_out);
}

TORCH_LIBRARY_IMPL(nf4, Functionalize, m) { m.impl("dequantize.out", &dequantize_out_functionalize); }

}  // namespace nf4_torch

// ---- the fused matrix-vector product: nf4::gemv (nf4.h, nf4_gemv_desc; docs/GEMV.md) ----------
// y[..., N] = x[..., K] @ dequant(W)^T for at most NF4_GEMV_MAX_M rows of x, on torch's current
// stream (CUDA) or on the cpu backend, under the contract `mode` names: "exact" (the same bits on
// every backend) or "fast" (tensor cores where the device has them; the exact contract where not).
// Both are batch-invariant: a row gives the same bits alone or in a batch. Same argument
// conventions as nf4::dequantize for the weight; shape must be [N, K].
namespace nf4_torch {
namespace {

nf4_gemv_mode parse_mode(c10::string_view mode, const char* op) {
  if (mode == "exact") return NF4_GEMV_EXACT;
  TORCH_CHECK(mode == "fast", op, ": mode must be 'exact' or 'fast', got '", std::string(mode), "'");
  return NF4_GEMV_FAST;
}

const char* mode_name(nf4_gemv_mode mode) { return mode == NF4_GEMV_FAST ? "fast" : "exact"; }

at::Tensor gemv(const at::Tensor& x, const at::Tensor& W, const at::Tensor& absmax, const at::Tensor& quant_map,
                const c10::optional<at::Tensor>& nested_absmax, const c10::optional<at::Tensor>& nested_quant_map,
                const c10::optional<at::Tensor>& offset, int64_t blocksize, int64_t nested_blocksize, at::IntArrayRef shape,
                c10::string_view quant_type, c10::optional<at::ScalarType> out_dtype, c10::string_view mode) {
  const nf4_gemv_mode gemv_mode = parse_mode(mode, "nf4::gemv");
  TORCH_CHECK(shape.size() == 2, "nf4::gemv: shape must be the weight's [N, K], got ", shape);
  const int64_t n = shape[0], k = shape[1];
  // The weight as for nf4::dequantize (its output dtype is not used by the product).
  Call c = describe(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize, nested_blocksize, shape,
                    at::kFloat, quant_type, "nf4::gemv");
  check_tensor(x, "x", c.device, c10::nullopt, "nf4::gemv");
  const nf4_dtype x_dtype = to_nf4_dtype(x.scalar_type(), "nf4::gemv", "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == k, "nf4::gemv: x must be [..., K] with K = ", k, ", got ", x.sizes());
  const at::ScalarType y_type = out_dtype.value_or(x.scalar_type());
  const nf4_dtype y_dtype = to_nf4_dtype(y_type, "nf4::gemv", "out_dtype");
  std::vector<int64_t> y_shape(x.sizes().begin(), x.sizes().end());
  y_shape.back() = n;
  at::Tensor y = at::empty(y_shape, x.options().dtype(y_type));
  if (k == 0) return y.zero_();  // an empty sum, as torch's matmul gives
  const int64_t m = x.numel() / k;
  TORCH_CHECK(m <= NF4_GEMV_MAX_M, "nf4::gemv: at most ", NF4_GEMV_MAX_M, " rows of x (the product of its leading "
              "dimensions), got ", m, "; use dequantize + matmul above that");
  if (m == 0 || n == 0) return y;

  nf4_gemv_desc g{};
  g.weight = &c.t;
  g.n = n;
  g.k = k;
  g.m = static_cast<int32_t>(m);
  g.x_dtype = x_dtype;
  g.x = x.data_ptr();
  g.y_dtype = y_dtype;
  g.y = y.data_ptr();
  g.y_bytes = static_cast<int64_t>(y.nbytes());
  g.mode = gemv_mode;
  with_context(c.device, "nf4::gemv", [&](nf4_context* ctx) {
    // The workspace the fastest plan takes (the split form, which only the fast contract past 16
    // rows uses), from torch's allocator on this stream: freed when the op returns, reused only by
    // work ordered after this product.
    at::Tensor workspace;
    if (gemv_mode == NF4_GEMV_FAST && c.device.is_cuda() && m > 16) {
      size_t bytes = 0;
      if (const nf4_status st = nf4_gemv_workspace_size(ctx, &g, &bytes); st != NF4_OK) return st;
      if (bytes > 0) {
        workspace = at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
        g.workspace = workspace.data_ptr();
        g.workspace_bytes = static_cast<int64_t>(bytes);
      }
    }
    return nf4_gemv(ctx, &g);
  });
  return y;
}

// The contract nf4::gemv runs under for x of `x_dtype` on `device` when `mode` is asked for
// (nf4_gemv_mode_used): which one depends on the backend, the device and x's dtype only, so it is
// asked of a one-row product with a small weight that is described, never computed. Its buffers
// are allocated without being written: no kernel runs, so a CUDA graph being captured records
// nothing of it (the device's nf4 context must exist by then, as for nf4::gemv).
std::string gemv_mode_used(at::Device device, at::ScalarType x_dtype, c10::string_view mode) {
  const nf4_gemv_mode wanted = parse_mode(mode, "nf4::gemv_mode_used");
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "nf4::gemv_mode_used: device must be the CPU or a CUDA device, got ",
              device);
  if (device.is_cuda() && !kHaveCuda) refuse_cuda_without_backend("nf4::gemv_mode_used");
  if (device.is_cuda() && !device.has_index()) device = at::Device(at::kCUDA, 0);
#ifdef NF4_TORCH_CUDA
  TORCH_CHECK(!device.is_cuda() || device.index() < static_cast<int>(c10::cuda::device_count()),
              "nf4::gemv_mode_used: device ", device, " does not exist (", static_cast<int>(c10::cuda::device_count()),
              " CUDA device(s))");
#endif
  constexpr int64_t k = 64;
  const auto on = [&](at::ScalarType t) { return at::TensorOptions().device(device).dtype(t); };
  const at::Tensor W = at::empty({k / 2}, on(at::kByte));
  const at::Tensor absmax = at::empty({1}, on(at::kFloat));
  const at::Tensor quant_map = at::empty({16}, on(at::kFloat));
  const std::vector<int64_t> shape{1, k};
  Call c = describe(W, absmax, quant_map, c10::nullopt, c10::nullopt, c10::nullopt, k, 0, shape, at::kFloat, "nf4",
                    "nf4::gemv_mode_used");
  const at::Tensor x = at::empty({1, k}, on(x_dtype));
  const at::Tensor y = at::empty({1, 1}, on(at::kFloat));
  nf4_gemv_desc g{};
  g.weight = &c.t;
  g.n = 1;
  g.k = k;
  g.m = 1;
  g.x_dtype = to_nf4_dtype(x_dtype, "nf4::gemv_mode_used", "x_dtype");
  g.x = x.data_ptr();
  g.y_dtype = NF4_DTYPE_F32;
  g.y = y.data_ptr();
  g.y_bytes = static_cast<int64_t>(y.nbytes());
  g.mode = wanted;
  nf4_context* ctx = context_for(device);
  nf4_gemv_mode used = NF4_GEMV_EXACT;
  nf4_status st = NF4_OK;
  {
#ifdef NF4_TORCH_CUDA
    c10::cuda::OptionalCUDAGuard guard;
    if (device.is_cuda()) guard.set_device(device);
#endif
    st = nf4_gemv_mode_used(ctx, &g, &used);
  }
  if (st != NF4_OK) fail_status("nf4::gemv_mode_used", c10::DeviceTypeName(device.type(), /*lower_case=*/true), st, nf4_last_error(ctx));
  return mode_name(used);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nf4, m) {
  m.def("gemv_mode_used(Device device, ScalarType x_dtype, str mode=\"fast\") -> str", &gemv_mode_used);
  m.def(
      "gemv(Tensor x, Tensor W, Tensor absmax, Tensor quant_map, Tensor? nested_absmax, Tensor? nested_quant_map, "
      "Tensor? offset, int blocksize, int nested_blocksize, int[] shape, str quant_type=\"nf4\", "
      "ScalarType? out_dtype=None, *, str mode=\"exact\") -> Tensor");
}

TORCH_LIBRARY_IMPL(nf4, CPU, m) { m.impl("gemv", &gemv); }

TORCH_LIBRARY_IMPL(nf4, CUDA, m) { m.impl("gemv", &gemv); }

}  // namespace nf4_torch
