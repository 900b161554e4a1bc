# SPDX-License-Identifier: MIT
"""bitsandbytes-compatible NF4/FP4 dequantization as a PyTorch operator.

Importing this package registers ``torch.ops.nf4.dequantize`` (and its ``.out`` overload):

    torch.ops.nf4.dequantize(W, absmax, quant_map, nested_absmax, nested_quant_map, offset,
                             blocksize, nested_blocksize, shape, dtype, quant_type="nf4")

CUDA tensors run nf4's CUDA backend on torch's current stream (one launch, no host sync, CUDA-graph
safe: the nested offset is read by the kernel from its 0-d device tensor); CPU tensors run nf4's
CPU oracle. A fake implementation lets ``torch.compile(fullgraph=True)`` trace through the call.

``torch.ops.nf4.gemv`` (``gemv(x, W, quant_state, mode=...)``, ``linear_4bit(x, W, quant_state, bias)``)
is the fused product ``x @ W^T`` for up to 256 rows of x under the exact contract (the same bits
on every backend) or the fast one (tensor cores), both batch-invariant (docs/GEMV.md).

``fast_dequantize(W, quant_state)`` takes a bitsandbytes weight the way Unsloth's
``unsloth.kernels.utils.fast_dequantize`` does and returns the same tensor, bit for bit.
"""
from . import _ops  # noqa: F401  (loads the extension, registers the fake implementations)
from ._ops import _build_info, nf4_version
from .helper import (QuantArgs, dequantize, fast_dequantize, gemv, gemv_mode_used, linear_4bit, linear_4bit_path,
                     unpack_quant_state)
from .reference import reference_dequantize

__version__ = _build_info.version

__all__ = [
    "QuantArgs",
    "dequantize",
    "fast_dequantize",
    "gemv",
    "gemv_mode_used",
    "linear_4bit",
    "linear_4bit_path",
    "nf4_version",
    "reference_dequantize",
    "unpack_quant_state",
]
