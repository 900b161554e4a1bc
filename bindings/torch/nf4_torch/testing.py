# SPDX-License-Identifier: MIT
"""bitsandbytes-format 4-bit weights made in plain PyTorch, for tests and benchmarks.

The data is random but well-formed exactly as bitsandbytes stores it: packed uint8 codes, per-block
absmax (float32, or uint8 codes + float32 second-level absmax + a 0-d float32 offset), the 16-entry
table and the 256-entry second-level table. Any such data has one right answer (docs/DESIGN.md
section 2), so random data tests the arithmetic as well as real weights do; real weights quantized
by bitsandbytes itself are in tests/data/golden.safetensors.
"""
import math
from dataclasses import dataclass
from typing import List, Optional

import torch

from .reference import NF4_TABLE, fp4_table


@dataclass
class NestedState:
    """The second-level statistics (bitsandbytes' ``quant_state.state2``)."""
    absmax: torch.Tensor  # float32 [ceil(nA / blocksize)]
    code: torch.Tensor    # float32 [256]
    blocksize: int
    dtype: torch.dtype = torch.float32


@dataclass
class QuantState:
    """Duck-types ``bitsandbytes.functional.QuantState`` (the fields fast_dequantize reads)."""
    absmax: torch.Tensor  # uint8 [nA] (nested) or float32 [nA]
    shape: torch.Size
    code: torch.Tensor    # float32 [16]
    dtype: torch.dtype
    blocksize: int
    quant_type: str = "nf4"
    offset: Optional[torch.Tensor] = None  # 0-d float32 (nested only)
    state2: Optional[NestedState] = None

    @property
    def nested(self) -> bool:
        return self.state2 is not None

    def to(self, device) -> "QuantState":
        """The same state with every tensor on `device` (bitsandbytes' QuantState.to, returning a copy)."""
        s2 = self.state2
        return QuantState(
            absmax=self.absmax.to(device), shape=self.shape, code=self.code.to(device), dtype=self.dtype,
            blocksize=self.blocksize, quant_type=self.quant_type,
            offset=None if self.offset is None else self.offset.to(device),
            state2=None if s2 is None else NestedState(s2.absmax.to(device), s2.code.to(device), s2.blocksize, s2.dtype))

    def as_list(self) -> list:
        """The old list form: [absmax, shape, dtype, blocksize, compressed_stats, quant_type, code]."""
        compressed = None
        if self.state2 is not None:
            s2 = self.state2
            compressed = [self.offset, [s2.absmax, s2.code, s2.blocksize, None, s2.dtype, None, None]]
        return [self.absmax, self.shape, self.dtype, self.blocksize, compressed, self.quant_type, self.code]


def random_code2(device=None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """256 sorted float32 values in [-1, 1] (0 and 1 included), shaped like bnb's dynamic map."""
    body = torch.rand(254, generator=generator, device=device) * 2 - 1
    return torch.sort(torch.cat([body, torch.tensor([0.0, 1.0], device=device)])).values.to(torch.float32)


def make_weight(shape: List[int], *, blocksize: int = 64, nested: bool = True, nested_blocksize: int = 256,
                quant_type: str = "nf4", dtype: torch.dtype = torch.float16, device="cpu",
                generator: Optional[torch.Generator] = None, code2: Optional[torch.Tensor] = None,
                wide_absmax: bool = False, transposed: bool = False):
    """A random bitsandbytes 4-bit weight: (W, QuantState).

    W is ``[ceil(N/2), 1]`` uint8 as bitsandbytes saves it, or ``[1, ceil(N/2)]`` with
    ``transposed=True`` (the layout for which Unsloth returns the transpose). ``wide_absmax``
    spreads the flat absmax over 2^-30 .. 2^30 so fp16 overflow and subnormal rounding are hit.
    """
    device = torch.device(device)
    g = generator
    n = math.prod(shape)
    n_bytes = (n + 1) // 2
    n_blocks = -(-n // blocksize)
    packed = torch.randint(0, 256, (n_bytes,), dtype=torch.uint8, device=device, generator=g)
    W = packed.view(1, n_bytes) if transposed else packed.view(n_bytes, 1)
    table = NF4_TABLE if quant_type == "nf4" else fp4_table().tolist()
    code = torch.tensor(table, dtype=torch.float32, device=device)
    if nested:
        absmax = torch.randint(0, 256, (n_blocks,), dtype=torch.uint8, device=device, generator=g)
        n2 = -(-n_blocks // nested_blocksize)
        absmax2 = (torch.rand(n2, device=device, generator=g) * 0.2 + 0.01).to(torch.float32)
        if code2 is None:
            code2 = random_code2(device=device, generator=g)
        offset = (torch.rand((), device=device, generator=g) * 0.05 + 0.02).to(torch.float32)
        state2 = NestedState(absmax2, code2.to(device), nested_blocksize)
    else:
        if wide_absmax:
            e = torch.rand(n_blocks, device=device, generator=g) * 60 - 30
            absmax = torch.exp2(e).to(torch.float32)
        else:
            absmax = (torch.rand(n_blocks, device=device, generator=g) * 2 + 1e-3).to(torch.float32)
        offset, state2 = None, None
    qs = QuantState(absmax=absmax, shape=torch.Size(shape), code=code, dtype=dtype, blocksize=blocksize,
                    quant_type=quant_type, offset=offset, state2=state2)
    return W, qs


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers (so -0.0 != +0.0 and NaN == NaN compare as bits)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def count_differing_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of elements whose bit patterns differ (shapes and dtypes must match)."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    return int((bits(a).cpu() != bits(b).cpu()).sum())
