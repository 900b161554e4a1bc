# SPDX-License-Identifier: MIT
"""Loads the C++ extension (which registers torch.ops.nf4.*) and the fake implementations.

The fake ("meta") implementations only describe the output: its shape and dtype come from the
arguments, its device from W. torch.compile runs them while tracing, so the operator shows up as one
node in the graph instead of a graph break.
"""
import os

import torch


def _load_extension():
    """nf4_torch._C: importing it registers torch.ops.nf4.* (its TORCH_LIBRARY block runs)."""
    try:
        from . import _build_info
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        raise ImportError(
            f"nf4_torch: the package at {here} has no compiled extension: this is the source tree. Install "
            "it (pip install ./bindings/torch) and import it from elsewhere than "
            "bindings/torch (Python puts the current directory first on sys.path).") from None
    built, running = _build_info.torch_version, torch.__version__
    # torch's C++ ABI is that of one release: refuse clearly rather than fail on a missing symbol.
    if built.split("+")[0].split(".")[:2] != running.split("+")[0].split(".")[:2]:
        raise ImportError(
            f"nf4_torch was built against torch {built}, but torch {running} is installed: rebuild it "
            "with this torch (pip install --force-reinstall ./bindings/torch)")
    from . import _C
    return _C, _build_info


_C, _build_info = _load_extension()


def nf4_version() -> str:
    """The version of the nf4 library compiled into the extension."""
    return torch.ops.nf4.version()


_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_fake_args(shape, dtype, quant_type):
    # The same argument errors as the real kernels, so a compiled program fails while tracing
    # rather than at its first run.
    if dtype not in _DTYPES:
        raise RuntimeError(
            f"nf4::dequantize: dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    if quant_type not in ("nf4", "fp4"):
        raise RuntimeError(f"nf4::dequantize: quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    if any(d < 0 for d in shape):
        raise RuntimeError(f"nf4::dequantize: shape must not have negative sizes, got {list(shape)}")


@torch.library.register_fake("nf4::dequantize")
def _dequantize_fake(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize,
                     nested_blocksize, shape, dtype, quant_type="nf4"):
    _check_fake_args(shape, dtype, quant_type)
    return W.new_empty(list(shape), dtype=dtype)


@torch.library.register_fake("nf4::dequantize.out")
def _dequantize_out_fake(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize,
                         nested_blocksize, shape, dtype, quant_type="nf4", *, out):
    _check_fake_args(shape, dtype, quant_type)
    if list(out.shape) != list(shape) or out.dtype != dtype:
        raise RuntimeError(
            f"nf4::dequantize: out must have shape {list(shape)} and dtype {dtype}, "
            f"got {list(out.shape)} and {out.dtype}")
    return out


GEMV_MAX_ROWS = 256  # NF4_GEMV_MAX_M in nf4.h
GEMV_MODES = ("exact", "fast")


def check_gemv_mode(mode, op="nf4::gemv"):
    """The operator's error for a mode it does not know, raised by the callers that check first."""
    if mode not in GEMV_MODES:
        raise RuntimeError(f"{op}: mode must be 'exact' or 'fast', got {mode!r}")


@torch.library.register_fake("nf4::gemv")
def _gemv_fake(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset, blocksize, nested_blocksize,
               shape, quant_type="nf4", out_dtype=None, *, mode="exact"):
    check_gemv_mode(mode)
    if len(shape) != 2:
        raise RuntimeError(f"nf4::gemv: shape must be the weight's [N, K], got {list(shape)}")
    if quant_type not in ("nf4", "fp4"):
        raise RuntimeError(f"nf4::gemv: quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    n, k = shape
    if x.dtype not in _DTYPES or (out_dtype is not None and out_dtype not in _DTYPES):
        raise RuntimeError("nf4::gemv: x and out_dtype must be torch.float16, torch.bfloat16 or torch.float32")
    if x.dim() < 1 or x.shape[-1] != k:
        raise RuntimeError(f"nf4::gemv: x must be [..., K] with K = {k}, got {list(x.shape)}")
    torch._check(k == 0 or x.numel() // k <= GEMV_MAX_ROWS,
                 lambda: f"nf4::gemv: at most {GEMV_MAX_ROWS} rows of x")
    return x.new_empty([*x.shape[:-1], n], dtype=out_dtype if out_dtype is not None else x.dtype)
