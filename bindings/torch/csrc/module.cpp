// SPDX-License-Identifier: MIT
// The Python module nf4_torch._C: prepared launches for nf4_torch's eager helpers.
//
// torch.ops.nf4.dequantize goes through torch's dispatcher and, inside, through nf4's full
// validation and planning on every call: several microseconds of CPU time per weight, as much as
// the kernel itself for small weights. Eager callers dequantize the same weight over and over
// (once per step or per token), so the helpers keep an nf4 prepared launch (nf4_prepare) on the
// weight's quant state and relaunch it straight from Python:
//
//   prepare(W, quant_state) -> bool
//       Reads the quant state (bitsandbytes' QuantState form, duck-typed), checks everything as
//       the operator does (same messages), prepares the launch and stores it on the quant state
//       as `_nf4_prepared`. False when the quant state is not of a form read here (the list form,
//       no `code` table, ...), or when a tensor is not a plain CPU/CUDA tensor or a
//       TorchDispatchMode is active: the caller then uses the operator.
//   launch(W, quant_state, out, use_global_buffer, unsloth) -> Tensor | None
//       Relaunches the stored plan into `out`, into the buffer the plan keeps
//       (use_global_buffer), or into a new tensor; `unsloth` applies Unsloth's rule (a [1, N/2]
//       weight returns the transpose). None, with nothing launched, whenever the plan may not
//       apply: no plan, any attribute of the quant state that it was made from is now another
//       object, a tensor's data pointer or version changed, W is at another address, `out`
//       does not match, a dispatch mode is active, or the current CUDA stream is capturing a
//       graph (the operator is what a graph records).
//
// Everything a launch checks is a pointer comparison or a field read: no dispatcher, no
// allocation (unless a new output is asked for), no device query, no host synchronization.
#include <Python.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#ifdef NF4_TORCH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "common.h"

namespace nf4_torch {
namespace {

// ---- attribute names (interned once) -------------------------------------------------------

enum Field { kAbsmax, kCode, kDtype, kShape, kBlocksize, kQuantType, kOffset, kState2, kAbsmax2, kCode2, kBlocksize2, kFieldCount };
// Fields read from the quant state itself; the last three are read from quant_state.state2.
const char* const kFieldNames[kFieldCount] = {"absmax", "code", "dtype", "shape", "blocksize", "quant_type",
                                              "offset", "state2", "absmax", "code", "blocksize"};
PyObject* g_names[kFieldCount];
PyObject* g_plan_name;  // "_nf4_prepared"

// getattr(obj, name, None) without raising (a missing attribute is nullptr, no error set).
PyObject* lookup(PyObject* obj, PyObject* name) {
  PyObject* result = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  if (PyObject_GetOptionalAttr(obj, name, &result) < 0) PyErr_Clear();
#else
  if (_PyObject_LookupAttr(obj, name, &result) < 0) PyErr_Clear();
#endif
  return result;
}

// The quant state's attributes, as new references (nullptr where missing).
struct Fields {
  std::array<PyObject*, kFieldCount> v{};
  Fields(PyObject* qs) {
    for (int f = kAbsmax; f <= kState2; ++f) v[f] = lookup(qs, g_names[f]);
    if (v[kState2] && v[kState2] != Py_None)
      for (int f = kAbsmax2; f <= kBlocksize2; ++f) v[f] = lookup(v[kState2], g_names[f]);
  }
  ~Fields() {
    for (PyObject* o : v) Py_XDECREF(o);
  }
  Fields(const Fields&) = delete;
  Fields& operator=(const Fields&) = delete;
  bool nested() const { return v[kState2] && v[kState2] != Py_None; }
};

// ---- tensors the fast path accepts ------------------------------------------------------------

// A dense CPU/CUDA tensor that no Python subclass, functionalization or functorch layer wraps:
// only for those is calling the backend directly the same as going through the dispatcher.
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                            c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Conjugate,
                                            c10::DispatchKey::Negative, c10::DispatchKey::ZeroTensor});
  return t.defined() && t.layout() == at::kStrided && (t.is_cpu() || t.is_cuda()) && !t.key_set().has_any(wrapped) &&
         t.has_storage();
}

// The tensor inside a Python object, or nullptr if it is not a plain tensor.
const at::Tensor* plain_tensor(PyObject* obj) {
  if (!obj || !THPVariable_Check(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  return plain(t) ? &t : nullptr;
}

int64_t version_of(const at::Tensor& t) {
  return t.is_inference() ? -1 : static_cast<int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}

// ---- the plan --------------------------------------------------------------------------------

// One watched attribute: the object the plan was made from, and for a tensor what the plan took
// from it. `.data = ...` can give the same object other metadata at the same address (a shorter
// view, another dtype) without moving its version, so those are watched too.
struct Watched {
  PyObject* obj = nullptr;  // owned reference, nullptr where the attribute was missing
  bool tensor = false;
  const void* data = nullptr;
  int64_t version = -1;
  int64_t numel = 0;
  int64_t bytes = 0;
  at::ScalarType dtype = at::kByte;
  at::Device device{at::kCPU};
};

struct Plan {
  nf4_prepared* prepared = nullptr;
  nf4_context* ctx = nullptr;
  at::Device device{at::kCPU};
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  const void* w_data = nullptr;
  int64_t w_bytes = 0;
  bool nested = false;
  std::array<Watched, kFieldCount> watched;
  // Flat statistics read neither the offset nor state2's fields (state2 itself is watched: None).
  bool watches(int field) const { return nested || (field != kOffset && field < kAbsmax2); }
  // use_global_buffer: the output buffer kept on the plan, and its transpose (Unsloth's rule).
  PyObject* buffer = nullptr;
  PyObject* buffer_t = nullptr;

  ~Plan() {
    nf4_prepared_destroy(prepared);
    for (Watched& w : watched) Py_XDECREF(w.obj);
    Py_XDECREF(buffer);
    Py_XDECREF(buffer_t);
  }
};

struct PreparedObject {
  PyObject_HEAD
  Plan* plan;
};

PyObject* no_plan(PyObject*, PyObject*) { Py_RETURN_NONE; }

void prepared_dealloc(PyObject* self) {
  delete reinterpret_cast<PreparedObject*>(self)->plan;
  Py_TYPE(self)->tp_free(self);
}

PyObject* prepared_repr(PyObject* self) {
  const Plan* p = reinterpret_cast<PreparedObject*>(self)->plan;
  std::string shape;
  for (const int64_t d : p->shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  const std::string s = "<nf4_torch._C.Prepared " + p->device.str() + " [" + shape + "] " +
                        c10::toString(p->dtype) + (p->buffer ? " with buffer" : "") + ">";
  return PyUnicode_FromString(s.c_str());
}

// Pickled or copied (copy.deepcopy of a model), a plan becomes None: it refers to device memory
// and an nf4 context of this process; the copy prepares its own on first use.
PyObject* prepared_reduce(PyObject*, PyObject*);

PyMethodDef prepared_methods[] = {
    {"__reduce__", prepared_reduce, METH_NOARGS, "A plan is not carried over: it pickles and copies as None."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject PreparedType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* module_object = nullptr;

PyObject* prepared_reduce(PyObject*, PyObject*) {
  PyObject* fn = PyObject_GetAttrString(module_object, "_no_plan");
  if (!fn) return nullptr;
  return Py_BuildValue("(N())", fn);
}

// ---- errors ------------------------------------------------------------------------------------

template <typename F>
PyObject* guarded(F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

bool check_args(const char* fn, Py_ssize_t nargs, Py_ssize_t want) {
  if (nargs == want) return true;
  PyErr_Format(PyExc_TypeError, "nf4_torch._C.%s takes %zd arguments (%zd given)", fn, want, nargs);
  return false;
}

// ---- prepare ------------------------------------------------------------------------------------

bool read_int(PyObject* o, int64_t* v) {
  if (!o || !PyLong_Check(o)) return false;
  *v = PyLong_AsLongLong(o);
  if (*v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

bool read_shape(PyObject* o, std::vector<int64_t>* shape) {
  if (!o || !PySequence_Check(o) || PyUnicode_Check(o)) return false;
  PyObject* seq = PySequence_Fast(o, "shape");
  if (!seq) {
    PyErr_Clear();
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  shape->resize(static_cast<std::size_t>(n));
  bool ok = true;
  for (Py_ssize_t i = 0; i < n && ok; ++i) ok = read_int(PySequence_Fast_GET_ITEM(seq, i), &(*shape)[i]);
  Py_DECREF(seq);
  return ok;
}

// A dispatch mode (FakeTensorMode, FlopCounterMode, ...) must see the operator.
bool dispatch_mode_active() { return c10::impl::TorchDispatchModeTLS::any_modes_set(); }

PyObject* prepare(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_args("prepare", nargs, 2)) return nullptr;
  PyObject* W_obj = args[0];
  PyObject* qs = args[1];
  return guarded([&]() -> PyObject* {
    if (PyList_Check(qs) || PyTuple_Check(qs) || dispatch_mode_active()) Py_RETURN_FALSE;
    const at::Tensor* W = plain_tensor(W_obj);
    if (!W) Py_RETURN_FALSE;
    // The marker first: a quant state that takes no attribute (slots) costs nothing more.
    if (PyObject_SetAttr(qs, g_plan_name, Py_False) < 0) {
      PyErr_Clear();
      Py_RETURN_FALSE;
    }
    // From here, a quant state of a form not read here keeps the marker False: the helpers use
    // the operator for it from now on without asking again.
    Fields f(qs);
    const bool nested = f.nested();
    const at::Tensor* absmax = plain_tensor(f.v[kAbsmax]);
    const at::Tensor* code = plain_tensor(f.v[kCode]);
    if (!f.v[kAbsmax] || !f.v[kCode] || !THPVariable_Check(f.v[kAbsmax]) || !THPVariable_Check(f.v[kCode]))
      Py_RETURN_FALSE;
    if (!f.v[kDtype] || !THPDtype_Check(f.v[kDtype])) Py_RETURN_FALSE;
    const at::ScalarType dtype = reinterpret_cast<THPDtype*>(f.v[kDtype])->scalar_type;
    std::vector<int64_t> shape;
    int64_t blocksize = 0, blocksize2 = 0;
    if (!read_shape(f.v[kShape], &shape) || !read_int(f.v[kBlocksize], &blocksize)) Py_RETURN_FALSE;
    std::string quant_type = "nf4";
    if (f.v[kQuantType] && f.v[kQuantType] != Py_None) {
      if (!PyUnicode_Check(f.v[kQuantType])) Py_RETURN_FALSE;
      const char* s = PyUnicode_AsUTF8(f.v[kQuantType]);
      if (!s) {
        PyErr_Clear();
        Py_RETURN_FALSE;
      }
      if (*s) quant_type = s;
    }
    c10::optional<at::Tensor> absmax2, code2, offset;
    c10::optional<float> number_offset;
    if (nested) {
      if (!f.v[kAbsmax2] || !f.v[kCode2] || !THPVariable_Check(f.v[kAbsmax2]) || !THPVariable_Check(f.v[kCode2]) ||
          !read_int(f.v[kBlocksize2], &blocksize2))
        Py_RETURN_FALSE;
      PyObject* o = f.v[kOffset];
      if (o && o != Py_None) {
        if (THPVariable_Check(o)) {
          offset = THPVariable_Unpack(o);
        } else if (PyFloat_Check(o) || PyLong_Check(o)) {
          // A plain number (e.g. parsed from a checkpoint's JSON): the plan holds its value, as
          // a float32 like the one unpack_quant_state makes of it (the object is watched).
          const double value = PyFloat_AsDouble(o);
          if (value == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
          }
          number_offset = static_cast<float>(value);
        } else {
          Py_RETURN_FALSE;
        }
      }
    }
    // Tensors the fast path cannot call the backend with directly: no marker, the operator is
    // used for this call and the next call asks again.
    const bool plain_state = absmax && code && (!nested || (plain_tensor(f.v[kAbsmax2]) && plain_tensor(f.v[kCode2]))) &&
                             (!offset || plain(*offset));
    if (!plain_state) {
      if (PyObject_DelAttr(qs, g_plan_name) < 0) PyErr_Clear();
      Py_RETURN_FALSE;
    }
    if (nested) {
      absmax2 = THPVariable_Unpack(f.v[kAbsmax2]);
      code2 = THPVariable_Unpack(f.v[kCode2]);
    }

    // Any error from here is the operator's own error for these arguments: raise it, and leave
    // no marker, so a corrected quant state is prepared on its next call.
    struct Unmark {
      PyObject* qs;
      bool armed = true;
      ~Unmark() {
        if (!armed) return;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyObject_DelAttr(qs, g_plan_name) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
      }
    } unmark{qs};

    Call c = describe(*W, *absmax, *code, absmax2, code2, offset, blocksize, blocksize2, shape, dtype, quant_type);
    if (number_offset) c.t.nested_offset = *number_offset;
    if (c.numel == 0) Py_RETURN_FALSE;  // nothing to launch: the operator returns the empty tensor
    if (c.device.is_cuda() && !kHaveCuda) refuse_cuda_without_backend("nf4::dequantize");
    nf4_context* ctx = context_for(c.device);

    auto plan = std::make_unique<Plan>();
    plan->ctx = ctx;
    plan->device = c.device;
    plan->shape = shape;
    plan->dtype = dtype;
    plan->w_data = W->data_ptr();
    plan->w_bytes = static_cast<int64_t>(W->nbytes());
    {
      // nf4_prepare validates the description with an output; this one is only for that (every
      // launch names its own output).
      const at::Tensor out = at::empty(shape, W->options().dtype(dtype));
      c.t.out = out.data_ptr();
      c.t.out_bytes = static_cast<int64_t>(out.nbytes());
#ifdef NF4_TORCH_CUDA
      c10::cuda::OptionalCUDAGuard guard;
      if (c.device.is_cuda()) guard.set_device(c.device);
#endif
      const nf4_status st = nf4_prepare(ctx, &c.t, 1, &plan->prepared);
      if (st != NF4_OK)
        fail_status("nf4::dequantize", c10::DeviceTypeName(c.device.type(), /*lower_case=*/true), st, nf4_last_error(ctx));
    }
    plan->nested = nested;
    for (int i = 0; i < kFieldCount; ++i) {
      if (!plan->watches(i)) continue;
      Watched& w = plan->watched[i];
      w.obj = f.v[i];
      Py_XINCREF(w.obj);
      if (w.obj && THPVariable_Check(w.obj)) {
        const at::Tensor& t = THPVariable_Unpack(w.obj);
        w.tensor = true;
        w.data = t.data_ptr();
        w.version = version_of(t);
        w.numel = t.numel();
        w.bytes = static_cast<int64_t>(t.nbytes());
        w.dtype = t.scalar_type();
        w.device = t.device();
      }
    }

    PreparedObject* obj = PyObject_New(PreparedObject, &PreparedType);
    if (!obj) return nullptr;
    obj->plan = plan.release();
    const int set = PyObject_SetAttr(qs, g_plan_name, reinterpret_cast<PyObject*>(obj));
    Py_DECREF(obj);
    if (set < 0) return nullptr;
    unmark.armed = false;
    Py_RETURN_TRUE;
  });
}

// ---- launch ---------------------------------------------------------------------------------------

// True when the quant state still has exactly the objects, data pointers, versions and tensor
// metadata the plan was made from, with memory behind every tensor. (False sends the call to
// prepare, which raises the operator's error for whatever is wrong now.)
bool still_valid(const Plan& plan, const Fields& f) {
  for (int i = 0; i < kFieldCount; ++i) {
    if (!plan.watches(i)) continue;
    const Watched& w = plan.watched[i];
    if (w.obj != f.v[i]) return false;
    if (w.tensor) {
      const at::Tensor& t = THPVariable_Unpack(w.obj);
      if (!plain(t) || t.numel() != w.numel || t.scalar_type() != w.dtype || t.device() != w.device ||
          !t.is_contiguous() || !memory_ok(t) || t.data_ptr() != w.data || version_of(t) != w.version)
        return false;
    } else if (i == kShape && w.obj && PyList_Check(w.obj)) {
      // A list can change in place under the same object.
      std::vector<int64_t> shape;
      if (!read_shape(w.obj, &shape) || shape != plan.shape) return false;
    }
  }
  return true;
}

// Whether `out` shares a byte with W or a tensor the plan reads.
bool overlaps_inputs(const Plan& plan, const at::Tensor& out) {
  const auto hit = [&](const void* p, int64_t bytes) { return bytes_overlap(out.data_ptr(), static_cast<int64_t>(out.nbytes()), p, bytes); };
  if (hit(plan.w_data, plan.w_bytes)) return true;
  for (int i = 0; i < kFieldCount; ++i)
    if (plan.watches(i) && plan.watched[i].tensor && plan.watched[i].device == plan.device &&
        hit(plan.watched[i].data, plan.watched[i].bytes))
      return true;
  return false;
}

// Whether the caller's `out` fits the plan; when not, the caller takes the operator's path, which
// raises the right error. (An inference tensor can be written only under inference mode.)
bool usable_out(const Plan& plan, const at::Tensor& out) {
  return plain(out) && out.device() == plan.device && out.scalar_type() == plan.dtype &&
         out.sizes() == at::IntArrayRef(plan.shape) && out.is_contiguous() && (!out.is_inference() || c10::InferenceMode::is_enabled()) &&
         memory_ok(out) && !overlaps_inputs(plan, out);
}

at::Tensor new_output(const Plan& plan) {
#ifdef NF4_TORCH_CUDA
  if (plan.device.is_cuda()) return at::detail::empty_cuda(plan.shape, plan.dtype, plan.device, c10::nullopt);
#endif
  return at::detail::empty_cpu(plan.shape, plan.dtype, /*pin_memory=*/false, c10::nullopt);
}

void bump(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_args("launch", nargs, 5)) return nullptr;
  PyObject* W_obj = args[0];
  PyObject* qs = args[1];
  PyObject* out_obj = args[2];
  const bool global = PyObject_IsTrue(args[3]) == 1;
  const bool unsloth = PyObject_IsTrue(args[4]) == 1;
  if (PyList_Check(qs) || PyTuple_Check(qs)) Py_RETURN_NONE;
  PyObject* plan_obj = lookup(qs, g_plan_name);  // a new reference: the plan lives through the call
  if (!plan_obj) Py_RETURN_NONE;
  if (Py_TYPE(plan_obj) != &PreparedType) {
    Py_DECREF(plan_obj);
    Py_RETURN_NONE;
  }
  PyObject* result = guarded([&]() -> PyObject* {
    Plan& plan = *reinterpret_cast<PreparedObject*>(plan_obj)->plan;
    if (dispatch_mode_active()) Py_RETURN_NONE;
    const at::Tensor* W = plain_tensor(W_obj);
    if (!W || W->device() != plan.device || !W->is_contiguous() || !memory_ok(*W) || W->data_ptr() != plan.w_data ||
        static_cast<int64_t>(W->nbytes()) != plan.w_bytes)
      Py_RETURN_NONE;
    {
      const Fields f(qs);
      if (!still_valid(plan, f)) Py_RETURN_NONE;
    }
    const at::Tensor* out = nullptr;
    if (out_obj != Py_None) {
      out = plain_tensor(out_obj);
      if (!out || !usable_out(plan, *out)) Py_RETURN_NONE;
    }

    void* stream = nullptr;
#ifdef NF4_TORCH_CUDA
    c10::cuda::OptionalCUDAGuard guard;
    if (plan.device.is_cuda()) {
      const c10::DeviceIndex index = plan.device.index();
      const cudaStream_t s = c10::cuda::getCurrentCUDAStream(index).stream();
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
        (void)cudaGetLastError();
        Py_RETURN_NONE;
      }
      if (capture != cudaStreamCaptureStatusNone) Py_RETURN_NONE;
      if (c10::cuda::current_device() != index) guard.set_index(index);
      stream = static_cast<void*>(s);
    }
#endif

    // The output: the caller's, the plan's buffer, or a new tensor.
    at::Tensor fresh;
    const at::Tensor* target = out;
    if (!target && global) {
      if (!plan.buffer) {
        // A normal tensor even under inference mode, so it can be used anywhere afterwards.
        const c10::InferenceMode normal(false);
        at::Tensor b = new_output(plan);
        PyObject* b_obj = THPVariable_Wrap(b);
        if (!b_obj) return nullptr;
        PyObject* bt_obj = nullptr;
        if (plan.shape.size() <= 2) {
          bt_obj = THPVariable_Wrap(b.t());
          if (!bt_obj) {
            Py_DECREF(b_obj);
            return nullptr;
          }
        }
        plan.buffer = b_obj;
        plan.buffer_t = bt_obj;
      }
      target = &THPVariable_Unpack(plan.buffer);
    }
    if (!target) {
      fresh = new_output(plan);
      target = &fresh;
    }

    void* out_ptr = target->data_ptr();
    nf4_status st;
    if (plan.device.is_cpu()) {
      // The oracle runs here, on this thread's pool: other Python threads go on meanwhile.
      Py_BEGIN_ALLOW_THREADS
      st = nf4_prepared_launch(plan.prepared, &out_ptr, stream);
      Py_END_ALLOW_THREADS
    } else {
      st = nf4_prepared_launch(plan.prepared, &out_ptr, stream);
    }
    if (st != NF4_OK)
      fail_status("nf4::dequantize", c10::DeviceTypeName(plan.device.type(), /*lower_case=*/true) + ", prepared", st,
                  nf4_last_error(plan.ctx));
    if (target != &fresh) bump(*target);

    // Unsloth's rule: a weight stored as [1, N/2] gives the transpose.
    const bool transpose = unsloth && W->dim() >= 1 && W->size(0) == 1 && plan.shape.size() <= 2;
    if (!fresh.defined() && !out) {  // the plan's buffer
      PyObject* r = transpose ? plan.buffer_t : plan.buffer;
      Py_INCREF(r);
      return r;
    }
    if (transpose) return THPVariable_Wrap(target->t());
    if (out) {
      Py_INCREF(out_obj);
      return out_obj;
    }
    return THPVariable_Wrap(std::move(fresh));
  });
  Py_DECREF(plan_obj);
  return result;
}

PyObject* have_cuda(PyObject*, PyObject*) { return PyBool_FromLong(kHaveCuda ? 1 : 0); }

PyMethodDef module_methods[] = {
    {"prepare", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(prepare)), METH_FASTCALL,
     "prepare(W, quant_state) -> bool: store a prepared launch on the quant state (see module.cpp)."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(launch)), METH_FASTCALL,
     "launch(W, quant_state, out, use_global_buffer, unsloth) -> Tensor or None (see module.cpp)."},
    {"have_cuda", have_cuda, METH_NOARGS, "True when the extension was built with nf4's CUDA backend."},
    {"_no_plan", no_plan, METH_NOARGS, "What a pickled or copied plan becomes: None."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "nf4_torch._C",
                          "nf4's PyTorch extension: registers torch.ops.nf4.* and offers prepared launches.", -1,
                          module_methods};

}  // namespace
}  // namespace nf4_torch

PyMODINIT_FUNC PyInit__C(void) {
  using namespace nf4_torch;
  for (int i = 0; i < kFieldCount; ++i) {
    g_names[i] = PyUnicode_InternFromString(kFieldNames[i]);
    if (!g_names[i]) return nullptr;
  }
  g_plan_name = PyUnicode_InternFromString("_nf4_prepared");
  if (!g_plan_name) return nullptr;

  PreparedType.tp_name = "nf4_torch._C.Prepared";
  PreparedType.tp_basicsize = sizeof(PreparedObject);
  PreparedType.tp_dealloc = prepared_dealloc;
  PreparedType.tp_repr = prepared_repr;
  PreparedType.tp_flags = Py_TPFLAGS_DEFAULT;
  PreparedType.tp_doc = "A prepared nf4 launch kept on a quant state (made by prepare(), used by launch()).";
  PreparedType.tp_methods = prepared_methods;
  if (PyType_Ready(&PreparedType) < 0) return nullptr;

  PyObject* m = PyModule_Create(&module_def);
  if (!m) return nullptr;
  Py_INCREF(&PreparedType);
  if (PyModule_AddObject(m, "Prepared", reinterpret_cast<PyObject*>(&PreparedType)) < 0) {
    Py_DECREF(&PreparedType);
    Py_DECREF(m);
    return nullptr;
  }
  module_object = m;
  return m;
}
