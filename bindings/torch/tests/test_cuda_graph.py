# SPDX-License-Identifier: MIT
"""nf4::dequantize inside a captured CUDA graph: capture, replay, and replay after the inputs changed
in place (the nested offset included: the kernel reads it from device memory at run time, so
nothing about the data is baked into the graph)."""
import pytest
import torch

import nf4_torch
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import requires_cuda

pytestmark = requires_cuda


def assert_same(a, b, what):
    n = count_differing_bits(a, b)
    assert n == 0, f"{what}: {n} of {a.numel()} elements differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_capture_and_replay(dtype, nested):
    g = torch.Generator("cuda").manual_seed(21)
    W, qs = make_weight([1536, 1024], device="cuda", dtype=dtype, nested=nested, generator=g)
    a = nf4_torch.unpack_quant_state(qs)
    x = torch.randn(64, 1024, device="cuda", generator=g).to(dtype)
    out = torch.empty(1536, 1024, dtype=dtype, device="cuda")

    def step():
        w = torch.ops.nf4.dequantize(W, *a)            # functional: graph-private output
        torch.ops.nf4.dequantize.out(W, *a, out=out)   # out=: the caller's buffer
        return x @ w.t()

    # Warm up on a side stream, as torch recommends before capture (contexts, cuBLAS handles).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    out.zero_()
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    want_w = nf4_torch.reference_dequantize(W, *a)
    assert_same(out, want_w, "out= after replay")
    # (cuBLAS may pick another algorithm under capture: the matmul is compared with a tolerance,
    # the dequantized weight bit for bit.)
    torch.testing.assert_close(y, x @ want_w.t())

    # New data in the same buffers: the replay must see all of it, the offset included.
    W.copy_(torch.randint(0, 256, W.shape, dtype=torch.uint8, device="cuda", generator=g))
    if nested:
        a.offset.fill_(0.125)
        a.nested_absmax.mul_(1.5)
    else:
        a.absmax.mul_(0.75)
    graph.replay()
    torch.cuda.synchronize()
    want_w = nf4_torch.reference_dequantize(W, *a)
    assert_same(out, want_w, "out= after replay with new data")
    torch.testing.assert_close(y, x @ want_w.t())


def test_fast_dequantize_in_graph():
    g = torch.Generator("cuda").manual_seed(22)
    W, qs = make_weight([512, 768], device="cuda", dtype=torch.bfloat16, generator=g, transposed=True)
    nf4_torch.fast_dequantize(W, qs)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r = nf4_torch.fast_dequantize(W, qs)
    graph.replay()
    torch.cuda.synchronize()
    assert r.shape == (768, 512)  # transposed weight -> transposed result, as Unsloth
    assert_same(r, nf4_torch.reference_dequantize(W, *nf4_torch.unpack_quant_state(qs)).t(), "fast_dequantize")


def test_fast_gemv_with_its_workspace_in_graph():
    # A 4096-row weight at 64 rows of x: on sm_90 the fast product takes its split form, with a
    # workspace the operator gets from torch's allocator on the current stream (inside a capture:
    # from the graph's pool). Eager, alone per row, captured and replayed: the same bits.
    g = torch.Generator("cuda").manual_seed(23)
    W, qs = make_weight([4096, 4096], device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(64, 4096, device="cuda", generator=g).to(torch.bfloat16)
    want = nf4_torch.gemv(x, W, qs, mode="fast")
    for j in (0, 17, 63):
        assert_same(nf4_torch.gemv(x[j:j + 1], W, qs, mode="fast"), want[j:j + 1], f"row {j} alone")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nf4_torch.gemv(x, W, qs, mode="fast")
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_same(y, want, "replay")
    x.copy_(torch.randn(64, 4096, device="cuda", generator=g).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert_same(y, nf4_torch.gemv(x, W, qs, mode="fast"), "replay with new x")
