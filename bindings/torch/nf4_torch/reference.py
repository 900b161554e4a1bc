# SPDX-License-Identifier: MIT
"""A plain PyTorch dequantization: docs/DESIGN.md section 2 written with ordinary tensor operations.

Used by the tests as an independent check of the operator (and of the oracle), and by the Unsloth
benchmark as the "plain PyTorch" baseline. Run it eagerly: each tensor operation rounds its float32
result once, which is exactly the contract (two roundings for the nested absmax, never an FMA).
Under torch.compile, Inductor may fuse ``a * b + c`` into an FMA, so it is not bit-exact there.
"""
import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

# bitsandbytes' NF4 table (get_4bit_type("nf4")), as float32.
NF4_TABLE = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982251167297, 0.5626170039176941, 0.7229568362236023, 1.0,
]

# Magnitudes of bitsandbytes' device FP4 table, codes 0..7; bit 3 of a code is the sign.
# (float32 bit patterns 0, 0x3baaaaab, 0x3f2aaaab, 0x3f800000, 0x3eaaaaab, 0x3f000000,
# 0x3e2aaaab, 0x3e800000: the same numbers as core/format.h.)
FP4_MAGNITUDES = [0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25]


def fp4_table(device=None) -> torch.Tensor:
    """The 16 FP4 values as bitsandbytes' kernel computes them (code 8 is -0.0)."""
    m = torch.tensor(FP4_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([m, -m])


def _scale_blocks(values: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """values[i] * scales[i // block] as float32, one rounding per element."""
    n = values.numel()
    pad = (-n) % block
    if pad:
        values = F.pad(values, (0, pad))
    return (values.view(-1, block) * scales.view(-1, 1)).view(-1)[:n]


def reference_dequantize(W: torch.Tensor, absmax: torch.Tensor, quant_map: torch.Tensor,
                         nested_absmax: Optional[torch.Tensor], nested_quant_map: Optional[torch.Tensor],
                         offset, blocksize: int, nested_blocksize: int, shape: Sequence[int],
                         dtype: torch.dtype, quant_type: str = "nf4") -> torch.Tensor:
    """Same arguments and result as torch.ops.nf4.dequantize, computed with plain tensor ops."""
    n = math.prod(shape)
    device = W.device
    packed = W.contiguous().view(-1).view(torch.uint8)
    # Element 2j is the high nibble of byte j, element 2j+1 the low one.
    codes = torch.stack((packed >> 4, packed & 15), dim=-1).view(-1)[:n].to(torch.int32)

    if nested_absmax is not None:
        scaled = _scale_blocks(nested_quant_map.index_select(0, absmax.view(-1).to(torch.int32)),
                               nested_absmax, nested_blocksize)  # fl32(code2[q] * absmax2[b / B2])
        if offset is None:
            offset = 0.0
        if isinstance(offset, torch.Tensor):
            offset = offset.to(device=device, dtype=torch.float32).view(())
        else:
            offset = torch.tensor(float(offset), dtype=torch.float32, device=device)
        scales = scaled + offset  # a second, separate fl32 rounding
    else:
        scales = absmax.view(-1)

    table = quant_map.view(-1) if quant_type == "nf4" else fp4_table(device)
    values = table.index_select(0, codes)
    out = _scale_blocks(values, scales, blocksize)  # fl32(value(q) * absmax[i / B])
    return out.to(dtype).view(list(shape))  # round to nearest even
