# SPDX-License-Identifier: MIT
"""torch.ops.nf4.gemv (docs/GEMV.md): bit for bit against a plain PyTorch evaluation of the contract
on the CPU key, CUDA against the CPU key, batch invariance, argument errors, torch.compile
(fullgraph, the fake implementation), CUDA-graph capture, and the Linear4bit drop-in."""
import pytest
import torch

import nf4_torch
from nf4_torch.reference import reference_dequantize
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import DEVICES, HAS_CUDA, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def contract(x, W, qs, out_dtype):
    """The contract with tensor ops: fp32 weight, fp32 products, the complete pairwise tree over
    bit_ceil(K) leaves padded with +0, RNE to out_dtype, NaN as the positive quiet NaN."""
    a = nf4_torch.unpack_quant_state(qs)
    n, k = a.shape
    w = reference_dequantize(W, *a._replace(dtype=torch.float32))  # [N, K], fl32(value * absmax)
    p = x.reshape(-1, 1, k).to(torch.float32) * w.unsqueeze(0)      # [M, N, K], one rounding each
    leaves = 1 << (k - 1).bit_length()
    p = torch.nn.functional.pad(p, (0, leaves - k))                  # +0.0 leaves
    while p.shape[-1] > 1:
        p = p[..., 0::2] + p[..., 1::2]                              # one level, one rounding per add
    y = p[..., 0].to(out_dtype)
    bits = y.view({2: torch.int16, 4: torch.int32}[y.element_size()])
    nan = torch.tensor(CANONICAL_NAN[out_dtype]).to(bits.dtype)
    y = torch.where(torch.isnan(y), nan, bits).view(out_dtype)
    return y.reshape(*x.shape[:-1], n)


def weight(n, k, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    return make_weight([n, k], generator=g, **kw)


def to(device, W, qs):
    moved = nf4_torch.testing.QuantState(
        absmax=qs.absmax.to(device), shape=qs.shape, code=qs.code.to(device), dtype=qs.dtype, blocksize=qs.blocksize,
        quant_type=qs.quant_type, offset=None if qs.offset is None else qs.offset.to(device),
        state2=None if qs.state2 is None else nf4_torch.testing.NestedState(
            qs.state2.absmax.to(device), qs.state2.code.to(device), qs.state2.blocksize))
    return W.to(device), moved


CASES = [  # (n, k, quant_type, nested, blocksize)
    (1, 1, "nf4", True, 64), (3, 7, "fp4", False, 32), (5, 100, "nf4", True, 64), (17, 1024, "nf4", False, 128),
    (9, 1056, "fp4", True, 32), (33, 4096, "nf4", True, 64), (4, 3000, "nf4", True, 4096),
]


@pytest.mark.parametrize("n,k,quant_type,nested,blocksize", CASES)
@pytest.mark.parametrize("x_dtype", DTYPES)
def test_cpu_key_matches_the_contract(n, k, quant_type, nested, blocksize, x_dtype):
    W, qs = weight(n, k, n * 1000 + k, quant_type=quant_type, nested=nested, blocksize=blocksize)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k)).to(x_dtype)
    for out_dtype in DTYPES:
        got = nf4_torch.gemv(x, W, qs, out_dtype=out_dtype)
        assert count_differing_bits(got, contract(x, W, qs, out_dtype)) == 0


@requires_cuda
@pytest.mark.parametrize("n,k,quant_type,nested,blocksize", CASES)
def test_cuda_matches_the_cpu_key(n, k, quant_type, nested, blocksize):
    W, qs = weight(n, k, n + 7 * k, quant_type=quant_type, nested=nested, blocksize=blocksize)
    Wc, qsc = to("cuda", W, qs)
    for m in range(1, 9):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        want = nf4_torch.gemv(x, W, qs)
        got = nf4_torch.gemv(x.cuda(), Wc, qsc)
        assert count_differing_bits(got.cpu(), want) == 0, f"m={m}"


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_alone_equals_the_row_in_a_batch(device):
    W, qs = to(device, *weight(64, 4096, 3))
    x = torch.randn(2, 4, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(device)
    batch = nf4_torch.gemv(x, W, qs)
    assert batch.shape == (2, 4, 64)
    flat = x.reshape(8, 4096)
    for j in range(8):
        assert count_differing_bits(nf4_torch.gemv(flat[j:j + 1], W, qs), batch.reshape(8, 64)[j:j + 1]) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_argument_errors(device):
    W, qs = to(device, *weight(8, 64, 5))
    with pytest.raises(RuntimeError, match="at most 8 rows"):
        nf4_torch.gemv(torch.zeros(9, 64, device=device), W, qs)
    with pytest.raises(RuntimeError, match=r"x must be \[\.\.\., K\]"):
        nf4_torch.gemv(torch.zeros(1, 63, device=device), W, qs)
    with pytest.raises(RuntimeError, match="dtype"):
        nf4_torch.gemv(torch.zeros(1, 64, dtype=torch.float64, device=device), W, qs)


@pytest.mark.parametrize("device", ["cuda"] if HAS_CUDA else ["cpu"])
def test_compiles_without_graph_breaks(device):
    W, qs = to(device, *weight(96, 512, 9))
    a = nf4_torch.unpack_quant_state(qs)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(device)

    def f(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset):
        return torch.ops.nf4.gemv(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset, a.blocksize,
                                  a.nested_blocksize, a.shape, a.quant_type, None) * 2

    args = (x, W, a.absmax, a.quant_map, a.nested_absmax, a.nested_quant_map, a.offset)
    compiled = torch.compile(f, fullgraph=True)
    assert count_differing_bits(compiled(*args), f(*args)) == 0


@requires_cuda
def test_cuda_graph_capture_replays_the_same_bits():
    W, qs = to("cuda", *weight(256, 2048, 11))
    x = torch.randn(1, 2048, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()
    eager = nf4_torch.gemv(x, W, qs)  # warm-up: creates the context outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nf4_torch.gemv(x, W, qs)
    graph.replay()
    torch.cuda.synchronize()
    assert count_differing_bits(y, eager) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_linear_4bit_drop_in(device):
    W, qs = to(device, *weight(48, 256, 13, dtype=torch.bfloat16))
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(device)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(device)
    # Decode: the fused product, plus the bias.
    y = nf4_torch.linear_4bit(x, W, qs, bias)
    assert count_differing_bits(y, nf4_torch.gemv(x, W, qs) + bias) == 0
    # More than LINEAR_FUSED_MAX_ROWS rows (5 of them, and a prefill of 20): dequantize + matmul,
    # as bitsandbytes' own forward.
    assert nf4_torch.helper.LINEAR_FUSED_MAX_ROWS == 4
    for rows in (5, 20):
        xp = torch.randn(rows, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(device)
        want = torch.nn.functional.linear(xp, nf4_torch.dequantize(W, qs), bias)
        assert count_differing_bits(nf4_torch.linear_4bit(xp, W, qs, bias), want) == 0
    # Both paths agree with a float64 product to bf16 precision.
    dense = nf4_torch.dequantize(W, qs).to(torch.float64)
    ref = x.to(torch.float64) @ dense.t() + bias.to(torch.float64)
    assert torch.allclose(y.to(torch.float64), ref, rtol=2 ** -7, atol=1e-2)
