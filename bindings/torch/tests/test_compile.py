# SPDX-License-Identifier: MIT
"""torch.compile(fullgraph=True) traces through nf4::dequantize (fake implementation, no graph break),
and a compiled dequantize + matmul gives the eager result bit for bit; also the out= overload,
the Unsloth-style helper, dynamic shapes and Inductor's CUDA graphs (mode="reduce-overhead");
and the fused product nf4::gemv in both modes, up to 256 rows, alone and inside linear_4bit."""
import pytest
import torch

import nf4_torch
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import HAS_CUDA, requires_cuda

# Where compiled programs are checked: CUDA where there is a GPU (the target; the CPU key's
# compile path is the same fake implementation), else the CPU, so a machine without a GPU still
# checks tracing, functionalization and Inductor's code.
COMPILE_DEVICES = ["cuda"] if HAS_CUDA else ["cpu"]

M, K = 384, 256  # weight [M, K] (out_features, in_features)


def setup_case(device, dtype, seed=0, nested=True):
    g = torch.Generator().manual_seed(seed)
    W, qs = make_weight([M, K], dtype=dtype, nested=nested, generator=g)
    a = nf4_torch.unpack_quant_state(qs)
    x = torch.randn(2, 17, K, generator=g).to(dtype)
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    tensors = (W.to(device), move(a.absmax), move(a.quant_map), move(a.nested_absmax), move(a.nested_quant_map),
               move(a.offset))
    return x.to(device), tensors, a


def dequant_matmul(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset):
    w = torch.ops.nf4.dequantize(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, 64, 256, [M, K],
                                 x.dtype)
    return w, x @ w.t()


def dequant_out_matmul(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset, out):
    torch.ops.nf4.dequantize.out(W, absmax, quant_map, nested_absmax, nested_quant_map, offset, 64, 256, [M, K],
                                 x.dtype, out=out)
    return x @ out.t()


def fresh_compile(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, **kw)


def assert_same(a, b, what):
    if isinstance(a, tuple):
        assert_same(a[0], b[0], what + " (dequantized weight)")
        assert_same(a[1], b[1], what + " (product)")
        return
    n = count_differing_bits(a, b)
    assert n == 0, f"{what}: {n} of {a.numel()} elements differ between compiled and eager"


def graph_has_op(explanation):
    return any("nf4.dequantize" in str(g.graph) for g in explanation.graphs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_dequantize_matmul(device, dtype):
    x, t, _ = setup_case(device, dtype)
    torch._dynamo.reset()
    e = torch._dynamo.explain(dequant_matmul)(x, *t)
    assert e.graph_break_count == 0 and e.graph_count == 1, str(e)
    assert graph_has_op(e)
    want = dequant_matmul(x, *t)
    assert_same(fresh_compile(dequant_matmul)(x, *t), want, "compiled dequantize + matmul")


@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_flat_absmax(device):
    x, t, _ = setup_case(device, torch.bfloat16, seed=3, nested=False)
    assert_same(fresh_compile(dequant_matmul)(x, *t), dequant_matmul(x, *t), "flat absmax")


@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_out_variant(device):
    x, t, _ = setup_case(device, torch.float16, seed=1)
    out = torch.empty(M, K, dtype=torch.float16, device=device)
    torch._dynamo.reset()
    e = torch._dynamo.explain(dequant_out_matmul)(x, *t, out)
    assert e.graph_break_count == 0, str(e)
    want = dequant_out_matmul(x, *t, torch.empty_like(out))
    out.zero_()
    got = fresh_compile(dequant_out_matmul)(x, *t, out)
    assert_same(got, want, "compiled out= + matmul")
    # The compiled program wrote the dequantized weight back into the caller's buffer.
    assert_same(out, torch.ops.nf4.dequantize(*t, 64, 256, [M, K], torch.float16),
                "out buffer after the compiled call")


@pytest.mark.parametrize("form", ["class", "list"])
@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_fast_dequantize(device, form):
    # Unsloth's call shape: fast_dequantize(W, quant_state) inside a compiled region.
    g = torch.Generator().manual_seed(5)
    W, qs = make_weight([M, K], dtype=torch.bfloat16, generator=g)
    W = W.to(device)
    qs = nf4_torch.testing.QuantState(
        absmax=qs.absmax.to(device), shape=qs.shape, code=qs.code.to(device), dtype=qs.dtype, blocksize=qs.blocksize,
        quant_type=qs.quant_type, offset=qs.offset.to(device),
        state2=nf4_torch.testing.NestedState(qs.state2.absmax.to(device), qs.state2.code.to(device), 256))
    state = qs if form == "class" else qs.as_list()
    x = torch.randn(3, K, generator=g).to(torch.bfloat16).to(device)

    def f(x, W, state):
        return x @ nf4_torch.fast_dequantize(W, state).t()

    torch._dynamo.reset()
    e = torch._dynamo.explain(f)(x, W, state)
    assert e.graph_break_count == 0, str(e)
    assert_same(fresh_compile(f)(x, W, state), f(x, W, state), f"fast_dequantize ({form} form)")


@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_dynamic_batch(device):
    x, t, _ = setup_case(device, torch.float16, seed=2)
    cf = fresh_compile(dequant_matmul, dynamic=True)
    for rows in (5, 9, 33):
        xi = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).to(torch.float16).to(device)
        assert_same(cf(xi, *t), dequant_matmul(xi, *t), f"dynamic batch {rows}")


@requires_cuda
def test_compiled_reduce_overhead_cuda_graphs():
    # Inductor's CUDA graphs: the operator is captured and replayed inside torch's graph trees.
    x, t, _ = setup_case("cuda", torch.bfloat16, seed=4)
    cf = fresh_compile(dequant_matmul, mode="reduce-overhead")
    want = dequant_matmul(x, *t)
    for _ in range(4):  # warm-up, record, replays
        got = tuple(r.clone() for r in cf(x, *t))
        assert_same(got, want, "reduce-overhead")


# ---- the fused product: nf4::gemv (its fake implementation) and linear_4bit -----------------------------

def gemv_fast(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset):
    return torch.ops.nf4.gemv(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset, 64, 256, [M, K],
                              "nf4", None, mode="fast").relu()


def graph_has_gemv(explanation):
    return any("nf4.gemv" in str(g.graph) for g in explanation.graphs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_gemv_fast(device, dtype):
    x, t, _ = setup_case(device, dtype, seed=6)
    x = x.reshape(-1, K)[:9]
    torch._dynamo.reset()
    e = torch._dynamo.explain(gemv_fast)(x, *t)
    assert e.graph_break_count == 0 and e.graph_count == 1, str(e)
    assert graph_has_gemv(e)
    assert_same(fresh_compile(gemv_fast)(x, *t), gemv_fast(x, *t), "compiled gemv, mode='fast'")


@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_gemv_fast_dynamic_rows(device):
    _, t, _ = setup_case(device, torch.bfloat16, seed=7)
    cf = fresh_compile(gemv_fast, dynamic=True)
    for rows in (3, 9, 256):
        xi = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16).to(device)
        assert_same(cf(xi, *t), gemv_fast(xi, *t), f"dynamic rows {rows}")


@pytest.mark.parametrize("mode", [None, "exact"])
@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_linear_4bit(device, mode):
    # The path choice (gemv_mode_used: a constant of the traced program) and both paths trace.
    g = torch.Generator().manual_seed(8)
    W, qs = make_weight([M, K], dtype=torch.bfloat16, generator=g)
    W = W.to(device)
    qs = nf4_torch.testing.QuantState(
        absmax=qs.absmax.to(device), shape=qs.shape, code=qs.code.to(device), dtype=qs.dtype, blocksize=qs.blocksize,
        quant_type=qs.quant_type, offset=qs.offset.to(device),
        state2=nf4_torch.testing.NestedState(qs.state2.absmax.to(device), qs.state2.code.to(device), 256))
    # No bias: Inductor may split a matmul with bias into a matmul and an addition, each rounded,
    # where eager F.linear rounds once; the bias's path is checked eagerly in test_gemv.py.

    def f(x, W):
        return nf4_torch.linear_4bit(x, W, qs, mode=mode)

    for rows in (3, 20, 300):
        x = torch.randn(rows, K, generator=g).to(torch.bfloat16).to(device)
        torch._dynamo.reset()
        e = torch._dynamo.explain(f)(x, W)
        assert e.graph_break_count == 0, str(e)
        fused = nf4_torch.linear_4bit_path(x, mode, qs.shape) is not None
        assert graph_has_gemv(e) == fused, (rows, mode)
        assert_same(fresh_compile(f)(x, W), f(x, W), f"linear_4bit, {rows} rows, mode={mode}")


@pytest.mark.parametrize("device", COMPILE_DEVICES)
def test_compiled_gemv_refuses_a_bad_mode_while_tracing(device):
    # The fake implementation checks the mode as the operator does, so the error comes at compile time.
    x, t, _ = setup_case(device, torch.bfloat16, seed=9)

    def f(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset):
        return torch.ops.nf4.gemv(x.reshape(-1, K)[:2], W, absmax, quant_map, nested_absmax, nested_quant_map, offset,
                                  64, 256, [M, K], "nf4", None, mode="slow")

    with pytest.raises(Exception, match="nf4::gemv: mode must be 'exact' or 'fast', got 'slow'"):
        fresh_compile(f)(x, *t)
