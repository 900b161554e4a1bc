# SPDX-License-Identifier: MIT
"""bitsandbytes quant states -> torch.ops.nf4.dequantize arguments, and an Unsloth-style entry point.

A bitsandbytes 4-bit weight is a uint8 tensor ``W`` (shape ``[ceil(N/2), 1]``, or its transpose
``[1, ceil(N/2)]``) plus a quant state, either

* the class form (``bitsandbytes.functional.QuantState``), read duck-typed: ``absmax``, ``code``
  (the 16-entry NF4/FP4 table), ``blocksize``, ``dtype``, ``shape``, ``quant_type``, and for
  nested ("double quant") statistics ``offset`` (a 0-d float32 tensor, normally on the GPU) and
  ``state2`` with ``absmax``, ``code`` (256 entries) and ``blocksize``; or
* the old list form ``[absmax, shape, dtype, blocksize, compressed_stats, quant_type, code]`` with
  ``compressed_stats = [offset, state2]`` (or None) and ``state2 = [absmax2, code2, blocksize2, ...]``.
"""
import functools
import operator
from typing import List, NamedTuple, Optional

import torch
from torch.compiler import is_compiling

from ._ops import GEMV_MAX_ROWS, _C, check_gemv_mode
from .reference import NF4_TABLE, fp4_table


class QuantArgs(NamedTuple):
    """The arguments of torch.ops.nf4.dequantize after W, in schema order."""
    absmax: torch.Tensor
    quant_map: torch.Tensor
    nested_absmax: Optional[torch.Tensor]
    nested_quant_map: Optional[torch.Tensor]
    offset: Optional[torch.Tensor]
    blocksize: int
    nested_blocksize: int
    shape: List[int]
    dtype: torch.dtype
    quant_type: str


def _default_table(quant_type, device):
    # A quant state always carries its table; this is only for hand-made states without one.
    # (For FP4 the kernels use bitsandbytes' device table whatever quant_map holds.)
    values = NF4_TABLE if quant_type == "nf4" else fp4_table().tolist()
    return torch.tensor(values, dtype=torch.float32, device=device)


def _as_offset(offset):
    if offset is None or isinstance(offset, torch.Tensor):
        return offset
    # A plain number (e.g. parsed from a checkpoint's JSON): a host scalar, which the operator
    # reads on the host. Making a device tensor here would cost a copy per call.
    return torch.tensor(float(offset), dtype=torch.float32)


def _integer(value, name) -> int:
    # int() of None or of a list fails naming neither the field nor the quant state; a bool is an
    # int in Python but never a size.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"nf4_torch: quant_state.{name} must be an integer, got {value!r}") from None


def _shape(value) -> List[int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"nf4_torch: quant_state.shape must be a sequence of integers, got {value!r}")
    return [_integer(d, "shape") for d in value]


def unpack_quant_state(quant_state) -> QuantArgs:
    """Reads a class-form or list-form bitsandbytes quant state (see the module docstring)."""
    if isinstance(quant_state, (list, tuple)):
        if len(quant_state) < 7:
            raise ValueError(
                "nf4_torch: a list-form quant state is [absmax, shape, dtype, blocksize, compressed_stats, "
                f"quant_type, code]; got {len(quant_state)} entries")
        absmax, shape, dtype, blocksize, compressed_stats, quant_type, code = quant_state[:7]
        if compressed_stats is not None:
            offset, state2 = compressed_stats
            absmax2, code2, blocksize2 = state2[0], state2[1], state2[2]
        else:
            offset = absmax2 = code2 = None
            blocksize2 = 0
    else:
        absmax = quant_state.absmax
        shape = quant_state.shape
        dtype = quant_state.dtype
        blocksize = quant_state.blocksize
        quant_type = getattr(quant_state, "quant_type", "nf4")
        code = getattr(quant_state, "code", None)
        state2 = getattr(quant_state, "state2", None)
        if state2 is not None:
            offset = getattr(quant_state, "offset", None)
            absmax2, code2, blocksize2 = state2.absmax, state2.code, state2.blocksize
        else:
            offset = absmax2 = code2 = None
            blocksize2 = 0
    quant_type = quant_type or "nf4"
    if code is None:
        code = _default_table(quant_type, absmax.device)
    return QuantArgs(absmax, code, absmax2, code2, _as_offset(offset), _integer(blocksize, "blocksize"),
                     _integer(blocksize2, "state2.blocksize"), _shape(shape), dtype, str(quant_type))


def _check_out(out, a: QuantArgs):
    if list(out.shape) != a.shape or out.dtype != a.dtype:
        raise ValueError(
            f"nf4_torch: out must have shape {a.shape} and dtype {a.dtype}, got {list(out.shape)} and {out.dtype}")


def _op(W, a: QuantArgs, out):
    if out is None:
        return torch.ops.nf4.dequantize(W, *a)
    return torch.ops.nf4.dequantize.out(W, *a, out=out)


def _capturing(W) -> bool:
    return W.is_cuda and torch.cuda.is_current_stream_capturing()


def _prepare_and_launch(W, quant_state, out, use_global_buffer, unsloth):
    """The eager path when no usable prepared launch is on the quant state: check, prepare one
    (kept on the quant state as ``_nf4_prepared``) and launch it; the operator where that is not
    possible (list-form or incomplete quant states, CUDA graph capture, tensor subclasses,
    dispatch modes). Errors are the operator's."""
    a = unpack_quant_state(quant_state)
    if out is not None:
        _check_out(out, a)
    if (getattr(quant_state, "_nf4_prepared", None) is not False and not isinstance(quant_state, (list, tuple))
            and not _capturing(W) and _C.prepare(W, quant_state)):
        result = _C.launch(W, quant_state, out, use_global_buffer, unsloth)
        if result is not None:
            return result
    result = _op(W, a, out)
    if unsloth and W.dim() >= 1 and W.shape[0] == 1 and result.dim() <= 2:
        return result.t()
    return result


def dequantize(W: torch.Tensor, quant_state, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dequantizes W to ``quant_state.shape`` / ``quant_state.dtype`` (into ``out`` if given).

    Eager calls relaunch a prepared launch kept on the quant state (see ``fast_dequantize``);
    under torch.compile this is torch.ops.nf4.dequantize (or its ``.out`` overload).
    """
    if not is_compiling():
        result = _C.launch(W, quant_state, out, False, False)
        if result is not None:
            return result
        return _prepare_and_launch(W, quant_state, out, False, False)
    a = unpack_quant_state(quant_state)
    if out is not None:
        _check_out(out, a)
    return _op(W, a, out)


def fast_dequantize(W, quant_state=None, out: Optional[torch.Tensor] = None, use_global_buffer: bool = False):
    """Drop-in for ``unsloth.kernels.utils.fast_dequantize`` on bitsandbytes 4-bit weights.

    Same contract as Unsloth's: no quant state -> W is returned unchanged; the result has the
    quant state's shape and dtype, written into ``out`` if given; and a weight stored transposed
    (``W.shape[0] == 1``, i.e. ``[1, N/2]``) gives the transposed result, ``out.t()``. The values
    are bit-identical to bitsandbytes' (and so to Unsloth's) in one kernel launch.

    ``quant_state`` defaults to ``W.quant_state`` (a bitsandbytes ``Params4bit``).

    Eager calls (not under torch.compile) keep an nf4 prepared launch on the quant state (the
    attribute ``_nf4_prepared``, made on the first call) and relaunch it directly, without torch's
    dispatcher: a launch only checks that the quant state still holds the same tensor objects at
    the same addresses and versions (any change prepares anew) and enqueues the kernel on the
    current CUDA stream. Under torch.compile, and while the current stream captures a CUDA graph,
    the call is torch.ops.nf4.dequantize, as for quant states in the old list form.

    ``use_global_buffer=True`` (Unsloth's inference path): the result is written into a buffer kept
    with the prepared launch on the quant state and returned; the next call with
    ``use_global_buffer=True`` on the same weight overwrites it, as Unsloth's global buffer is. Use
    it before dequantizing that weight again, or copy it. (Unsloth's buffer is an inference-mode
    tensor; this one is an ordinary tensor whose version is bumped on each write, so autograd
    reports a stale saved copy instead of computing with it.)

    Differences from Unsloth's: nested and flat statistics and NF4 and FP4 all work (Unsloth's
    assumes nested NF4); the result is an ordinary tensor rather than an inference-mode one, so
    it can be saved for backward and used under torch.compile.
    """
    if quant_state is None:
        quant_state = getattr(W, "quant_state", None)
        if quant_state is None:
            return W
    if not is_compiling():
        result = _C.launch(W, quant_state, out, use_global_buffer, True)
        if result is not None:
            return result
        return _prepare_and_launch(W, quant_state, out, use_global_buffer, True)
    a = unpack_quant_state(quant_state)
    if out is not None:
        _check_out(out, a)
    result = _op(W, a, out)
    # Unsloth's rule, kept as is: a [1, N/2] weight means the caller wants the transpose.
    if W.dim() >= 1 and W.shape[0] == 1 and result.dim() <= 2:
        return result.t()
    return result


def gemv(x: torch.Tensor, W: torch.Tensor, quant_state, out_dtype: Optional[torch.dtype] = None,
         mode: str = "exact") -> torch.Tensor:
    """``x @ dequantize(W).t()`` for at most ``GEMV_MAX_ROWS`` (256) rows of x (the product of its
    leading dimensions), without the dense weight (``torch.ops.nf4.gemv``), under one of two
    contracts (docs/GEMV.md), both batch-invariant (a row gives the same bits alone or in a batch):

    * ``mode="exact"`` (the default): a fixed fp32 summation tree, the same bits on CUDA and on the CPU;
    * ``mode="fast"``: tensor cores (CUDA sm_80+, fp16 on sm_75) for fp16/bf16 x, each weight rounded
      to x's dtype as ``dequantize`` writes it, fp32 accumulation in an order fixed by K; repeatable
      on a device, within the documented bound of a float64 sum, not the same bits everywhere.
      Where the device has no such path (fp32 x, bf16 below sm_80) the exact contract runs
      (``gemv_mode_used`` says which).
    """
    a = unpack_quant_state(quant_state)
    if len(a.shape) != 2:
        raise ValueError(f"nf4_torch.gemv: the weight must be 2-D [N, K], its quant state says {a.shape}")
    return torch.ops.nf4.gemv(x, W, a.absmax, a.quant_map, a.nested_absmax, a.nested_quant_map, a.offset,
                              a.blocksize, a.nested_blocksize, a.shape, a.quant_type, out_dtype, mode=mode)


@functools.lru_cache(maxsize=None)
def _mode_used(device: torch.device, x_dtype: torch.dtype, mode: str) -> str:
    return torch.ops.nf4.gemv_mode_used(device, x_dtype, mode)


@torch.compiler.assume_constant_result
def gemv_mode_used(device, x_dtype: torch.dtype, mode: str = "fast") -> str:
    """The contract (``"exact"`` or ``"fast"``) that ``gemv(..., mode=mode)`` runs under for x of
    ``x_dtype`` on ``device``: it depends on the backend, the device and the dtype only, so it is
    asked of the library once per combination and kept. Under torch.compile it is a constant of
    the traced program."""
    check_gemv_mode(mode, "nf4_torch.gemv_mode_used")
    return _mode_used(torch.device(device), x_dtype, mode)


# Rows of x up to which linear_4bit takes the fused product when asked for the fast contract
# (mode="fast"): all that torch.ops.nf4.gemv takes, so the layer stays batch-invariant. Above,
# dequantize + matmul.
LINEAR_FUSED_MAX_ROWS = GEMV_MAX_ROWS

# The default path (mode=None), by rows and weight size, from the measurements of
# docs/PERFORMANCE_LOG.md ("The fast contract up to 16 tokens", "... past 16 tokens", "... on
# warpgroup MMAs" and "... on a cluster's SMs", bf16, CUDA graphs, H100): one row takes the exact
# product (21.7 us at 14336x4096, against 24.5 for the tensor-core kernel, whose per-weight decode
# costs more than the exact kernel's at one row); 2 to LINEAR_DEFAULT_FAST_MAX_ROWS rows the fast
# product at every shape (at 32 rows: 19.0 us at 4096x4096 against 25.0 for dequantize + matmul,
# 38.6 against 99.6 at 14336x4096); up to LINEAR_DEFAULT_FAST_LARGE_MAX_ROWS rows also, for weights
# of at least LINEAR_DEFAULT_LARGE_WEIGHT elements (at 128 rows: 25.2 against 29.5 at 4096x4096,
# 60.6 against 100.9 at 14336x4096, 95.4 against 105.2 at 4096x14336, 240 against 386 at
# 8192x28672; smaller weights, such as a 1024x4096 projection, are not measured there); and up to
# LINEAR_DEFAULT_FAST_HUGE_MAX_ROWS rows for weights of at least LINEAR_DEFAULT_HUGE_WEIGHT
# elements ("The split forms' fold", at 256 rows: 88.9 against 113.9 at 4096x14336, 97.9 against
# 107.5 at 14336x4096, 281 against 391 at 8192x28672), and for weights of at least
# LINEAR_DEFAULT_LARGE_WEIGHT elements whose inner dimension K is at least
# LINEAR_DEFAULT_HUGE_MIN_K ("The default path past 128 rows for 2^24-element weights", at 160 /
# 256 rows: 29.6 / 30.5 against 30.7 / 33.5 at 4096x4096, 44.5 / 46.1 against 46.3 / 48.4 at
# 6144x4096, 30.5 / 32.5 against 31.7 / 37.5 at 2048x8192, 34.9 / 38.2 against 37.0 / 38.7 at
# 1024x16384; at 8192x2048, K = 2048 and two parts of k to spread, 33.8 / 34.6 against 27.9 /
# 31.6); above, dequantize + matmul. So the default is the fastest path per call, not one
# contract: rows computed alone and in a batch differ in their last bits (mode="fast" or "exact"
# keeps one).
LINEAR_DEFAULT_FAST_MAX_ROWS = 32
LINEAR_DEFAULT_FAST_LARGE_MAX_ROWS = 128
LINEAR_DEFAULT_LARGE_WEIGHT = 1 << 24
LINEAR_DEFAULT_FAST_HUGE_MAX_ROWS = 256
LINEAR_DEFAULT_HUGE_WEIGHT = 1 << 25
LINEAR_DEFAULT_HUGE_MIN_K = 4096

# The same under the exact contract (mode="exact", fp32 x, devices without the fast path).
# Measured on an H100 (bf16, CUDA graphs, docs/PERFORMANCE_LOG.md): at 4 rows the exact product beats
# dequantize + matmul at every layer shape (21.2 vs 24.9 us at 4096x4096, 62.6 vs 102 at
# 14336x4096); at 8 rows it loses at every one (157.6 vs 102 at 14336x4096), its CUDA-core issue
# slots being the limit.
LINEAR_EXACT_FUSED_MAX_ROWS = 4

_LINEAR_MODES = (None, "exact", "fast")


def linear_4bit_path(x: torch.Tensor, mode: Optional[str] = None, weight_shape=None) -> Optional[str]:
    """The path ``linear_4bit(x, W, ..., mode=mode)`` takes: ``"fast"`` or ``"exact"`` (the fused
    product under that contract) or None (dequantize + matmul). ``weight_shape``: W's logical shape
    (``quant_state.shape``), which the default mode weighs past ``LINEAR_DEFAULT_FAST_MAX_ROWS``
    rows; None counts as a small weight. See ``linear_4bit``."""
    if mode not in _LINEAR_MODES:
        raise ValueError(f"nf4_torch.linear_4bit: mode must be None, 'exact' or 'fast', got {mode!r}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return None
    rows = x.numel() // x.shape[-1] if x.dim() >= 1 and x.shape[-1] > 0 else 0
    if rows == 0:
        return None
    if mode != "exact" and x.dtype != torch.float32 and gemv_mode_used(x.device, x.dtype, "fast") == "fast":
        if mode == "fast":
            return "fast" if rows <= LINEAR_FUSED_MAX_ROWS else None
        if rows == 1:
            return "exact"
        if rows <= LINEAR_DEFAULT_FAST_MAX_ROWS:
            return "fast"
        # A plain loop: under torch.compile a generator expression here made Dynamo trace
        # gemv_mode_used with fake tensors instead of taking its constant result.
        numel, inner = 0, 0
        if weight_shape is not None:
            numel = 1
            for d in weight_shape:
                numel *= int(d)
                inner = int(d)  # the last: in_features (K)
        if numel >= LINEAR_DEFAULT_HUGE_WEIGHT or (numel >= LINEAR_DEFAULT_LARGE_WEIGHT and inner >= LINEAR_DEFAULT_HUGE_MIN_K):
            return "fast" if rows <= LINEAR_DEFAULT_FAST_HUGE_MAX_ROWS else None
        return "fast" if numel >= LINEAR_DEFAULT_LARGE_WEIGHT and rows <= LINEAR_DEFAULT_FAST_LARGE_MAX_ROWS else None
    return "exact" if rows <= LINEAR_EXACT_FUSED_MAX_ROWS else None


def linear_4bit(x: torch.Tensor, W, quant_state=None, bias: Optional[torch.Tensor] = None,
                mode: Optional[str] = None) -> torch.Tensor:
    """Drop-in for a bitsandbytes ``Linear4bit`` forward: ``x @ W^T + bias`` in x's dtype, by the
    fastest path for the number of rows of x (the product of its leading dimensions):

    * ``mode=None`` (the default): the fastest path per row count and weight size where the device
      runs the fast contract for fp16/bf16 x (tensor cores: CUDA sm_80+, fp16 on sm_75; the CPU
      backend): the exact product for one row, the fast product for 2 to
      ``LINEAR_DEFAULT_FAST_MAX_ROWS`` (32) rows, up to ``LINEAR_DEFAULT_FAST_LARGE_MAX_ROWS``
      (128) for weights of at least ``LINEAR_DEFAULT_LARGE_WEIGHT`` (2^24) elements, and up to
      ``LINEAR_DEFAULT_FAST_HUGE_MAX_ROWS`` (256) for those of at least
      ``LINEAR_DEFAULT_HUGE_WEIGHT`` (2^25) elements or of 2^24 with in_features of at least
      ``LINEAR_DEFAULT_HUGE_MIN_K`` (4096); dequantize + matmul above (measured: see the
      constants); otherwise (fp32 x, bf16 below sm_80) as for ``"exact"``. The default is
      therefore not one contract: a row alone and in a batch may differ in its last bits.
    * ``mode="fast"``: the fast contract for every fused call, up to ``LINEAR_FUSED_MAX_ROWS``
      (256) rows (batch-invariant), dequantize + matmul above; where the device has no fast path,
      as for ``"exact"``.
    * ``mode="exact"``: the fused product under the exact contract up to
      ``LINEAR_EXACT_FUSED_MAX_ROWS`` (4) rows (past that the exact product is slower than
      dequantize + matmul), dequantize + matmul above.

    Each fused contract is batch-invariant (a row's result does not depend on the other rows);
    dequantize + matmul is torch's matmul, which is not. ``linear_4bit_path(x, mode, W's shape)`` says which
    path a call takes. On the fused path torch adds the bias after the product; on the other it
    goes into the matmul. ``quant_state`` defaults to ``W.quant_state``.
    """
    if quant_state is None:
        quant_state = W.quant_state
    path = linear_4bit_path(x, mode, quant_state.shape)
    if path is not None:
        y = gemv(x.contiguous(), W, quant_state, mode=path)
        return y if bias is None else y + bias.to(y.dtype)
    dense = dequantize(W, quant_state).to(x.dtype)
    return torch.nn.functional.linear(x, dense, None if bias is None else bias.to(x.dtype))
