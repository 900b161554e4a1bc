# SPDX-License-Identifier: MIT
"""Eager fast_dequantize / dequantize relaunch an nf4 prepared launch kept on the quant state
(`_nf4_prepared`): made on the first call, reused while the quant state holds the same objects with
the same data pointers and versions, made anew when anything it was made from changes; the global
buffer; the operator wherever the prepared launch may not run (list form, dispatch modes, CUDA graph
capture); and the same bits as the operator in every case."""
import copy
import pickle
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nf4_torch
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import DEVICES, requires_cuda


def assert_same(a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    n = count_differing_bits(a, b)
    assert n == 0, f"{what}: {n} of {a.numel()} elements differ"


def weight(device, shape=(192, 320), seed=0, **kw):
    W, qs = make_weight(list(shape), generator=torch.Generator().manual_seed(seed), **kw)
    return W.to(device), qs.to(device)


def want(W, qs):
    return torch.ops.nf4.dequantize(W, *nf4_torch.unpack_quant_state(qs))


def plan(qs):
    return qs.__dict__.get("_nf4_prepared")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["nf4-nested", "nf4-flat", "fp4-nested"])
def test_prepared_once_then_reused(device, kind):
    quant_type, layout = kind.split("-")
    W, qs = weight(device, quant_type=quant_type, nested=layout == "nested", dtype=torch.bfloat16)
    first = nf4_torch.fast_dequantize(W, qs)
    p = plan(qs)
    assert isinstance(p, nf4_torch._C.Prepared), p
    assert_same(first, want(W, qs), "first call")
    for _ in range(3):
        again = nf4_torch.fast_dequantize(W, qs)
        assert again.data_ptr() != first.data_ptr() or again is not first  # a new output each call
        assert_same(again, first, "relaunch")
    assert plan(qs) is p, "the plan was made again although nothing changed"
    assert_same(nf4_torch.dequantize(W, qs), first, "dequantize()")


@pytest.mark.parametrize("device", DEVICES)
def test_changes_make_a_new_plan(device):
    W, qs = weight(device, seed=1, dtype=torch.float16)
    nf4_torch.fast_dequantize(W, qs)
    p = plan(qs)

    # A new absmax tensor (another object, other values).
    qs.absmax = torch.randint(0, 256, qs.absmax.shape, dtype=torch.uint8, device=device,
                              generator=torch.Generator(device).manual_seed(2))
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "new absmax")
    assert plan(qs) is not p
    p = plan(qs)

    # The same object changed in place: its version moved.
    qs.state2.absmax.mul_(1.5)
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "absmax2 changed in place")
    assert plan(qs) is not p
    p = plan(qs)

    # The same object given other storage (.data =): its data pointer moved.
    qs.code.data = qs.code.clone() * 0.5
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "code with new storage")
    assert plan(qs) is not p
    p = plan(qs)

    # The offset (a 0-d tensor) replaced, and then a plain number.
    qs.offset = torch.tensor(0.125, device=device)
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "new offset")
    qs.offset = 0.0625
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "number offset")

    # Another output dtype and a reshaped output.
    qs.dtype = torch.float32
    r = nf4_torch.fast_dequantize(W, qs)
    assert r.dtype == torch.float32
    assert_same(r, want(W, qs), "dtype changed")
    qs.shape = torch.Size([320, 192])
    r = nf4_torch.fast_dequantize(W, qs)
    assert r.shape == (320, 192)
    assert_same(r, want(W, qs), "shape changed")

    # Another W (a copy elsewhere in memory) with the same quant state.
    W2 = W.clone()
    W2[:7] ^= 0x5A
    assert_same(nf4_torch.fast_dequantize(W2, qs), want(W2, qs), "another W")
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "the first W again")


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_offset_change_on_the_host(device):
    # A CPU offset with data on the device is read on the host when prepared: an in-place change
    # must still be seen (its version moves, the plan is made again).
    W, qs = weight(device, seed=3, dtype=torch.bfloat16)
    qs.offset = qs.offset.cpu()
    nf4_torch.fast_dequantize(W, qs)
    qs.offset.fill_(0.25)
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "offset changed in place")


@pytest.mark.parametrize("device", DEVICES)
def test_global_buffer(device):
    W, qs = weight(device, seed=4, dtype=torch.bfloat16)
    a = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert_same(a, want(W, qs), "global buffer")
    v = a._version
    b = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert b is a, "the buffer is kept and returned again"
    assert a._version > v, "each write bumps the buffer's version"
    # The buffer is the plan's: a new absmax makes a new plan, and the next call another buffer.
    qs.absmax = qs.absmax.clone()
    qs.absmax[:5] = 7
    c = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert_same(c, want(W, qs), "global buffer after a change")
    # Without the flag, a new tensor each time; with out=, the caller's tensor.
    d = nf4_torch.fast_dequantize(W, qs)
    assert d.data_ptr() != c.data_ptr()
    out = torch.empty_like(d)
    assert nf4_torch.fast_dequantize(W, qs, out=out, use_global_buffer=True) is out
    assert_same(out, d, "out= wins over the global buffer")


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_weight_and_global_buffer(device):
    W, qs = weight(device, shape=(96, 256), seed=5, dtype=torch.float16, transposed=True)
    ref = want(W, qs).t()
    r = nf4_torch.fast_dequantize(W, qs)
    assert r.shape == (256, 96)
    assert_same(r, ref, "transposed")
    g1 = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    g2 = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert g1 is g2 and g1.shape == (256, 96)
    assert_same(g1, ref, "transposed, global buffer")
    # dequantize() has no transpose rule.
    assert nf4_torch.dequantize(W, qs).shape == (96, 256)


@pytest.mark.parametrize("device", DEVICES)
def test_inference_mode(device):
    W, qs = weight(device, seed=6, dtype=torch.bfloat16)
    with torch.inference_mode():
        r = nf4_torch.fast_dequantize(W, qs)
        g = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert r.is_inference()
    assert not g.is_inference(), "the kept buffer is an ordinary tensor, usable outside inference mode"
    assert_same(nf4_torch.fast_dequantize(W, qs, use_global_buffer=True), want(W, qs), "buffer after inference mode")
    assert_same(r, want(W, qs), "inference mode")


@pytest.mark.parametrize("device", DEVICES)
def test_list_form_and_copies_use_no_stale_plan(device):
    W, qs = weight(device, seed=7, dtype=torch.float16)
    lst = qs.as_list()
    assert_same(nf4_torch.fast_dequantize(W, lst), want(W, qs), "list form")
    nf4_torch.fast_dequantize(W, qs)
    assert plan(qs) is not None
    for name, c in (("deepcopy", copy.deepcopy(qs)), ("pickle", pickle.loads(pickle.dumps(qs)))):
        assert plan(c) is None, f"{name}: a copied quant state must not carry the plan"
        Wc = W.clone()
        assert_same(nf4_torch.fast_dequantize(Wc, c), want(Wc, c), name)
    # A shallow copy shares the plan with its tensors; the copy's own changes make it its own.
    c = copy.copy(qs)
    assert_same(nf4_torch.fast_dequantize(W, c), want(W, qs), "shallow copy")
    c.absmax = c.absmax.flip(0)
    assert_same(nf4_torch.fast_dequantize(W, c), want(W, c), "shallow copy, changed")
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "the original after the copy changed")


@pytest.mark.parametrize("device", DEVICES)
def test_errors_are_the_operators(device):
    W, qs = weight(device, seed=8, dtype=torch.bfloat16)
    qs.blocksize = 48
    with pytest.raises(RuntimeError, match="blocksize must be a power of two"):
        nf4_torch.fast_dequantize(W, qs)
    assert plan(qs) is None, "a failed preparation leaves no plan behind"
    qs.blocksize = 64
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "after fixing the quant state")
    with pytest.raises(ValueError, match="dtype"):
        nf4_torch.fast_dequantize(W, qs, out=torch.empty(192, 320, dtype=torch.float16, device=device))
    with pytest.raises(RuntimeError, match="W must be contiguous"):
        nf4_torch.fast_dequantize(torch.empty(W.numel() * 2, dtype=torch.uint8, device=device)[::2], qs)


def test_incomplete_quant_state_uses_the_operator():
    W, qs = weight("cpu", seed=9)
    qs.code = None  # unpack_quant_state fills in the standard table
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "no code table")
    assert plan(qs) is False, "marked: the prepared path does not read this form"
    assert_same(nf4_torch.fast_dequantize(W, qs), want(W, qs), "no code table, again")


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_modes_see_the_operator(device):
    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    W, qs = weight(device, seed=10, dtype=torch.bfloat16)
    nf4_torch.fast_dequantize(W, qs)  # a plan exists
    with Record() as mode:
        r = nf4_torch.fast_dequantize(W, qs)
    assert any("nf4.dequantize" in op for op in mode.ops), mode.ops
    assert_same(r, want(W, qs), "under a dispatch mode")


def test_threads_share_one_plan():
    W, qs = weight("cpu", shape=(256, 512), seed=11, dtype=torch.bfloat16)
    ref = want(W, qs)
    errors = []

    def work():
        try:
            for _ in range(20):
                assert_same(nf4_torch.fast_dequantize(W, qs), ref, "thread")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@requires_cuda
def test_current_stream_and_other_device_current():
    W, qs = weight("cuda", shape=(1024, 1536), seed=12, dtype=torch.bfloat16)
    ref = want(W, qs)
    nf4_torch.fast_dequantize(W, qs)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        r = nf4_torch.fast_dequantize(W, qs)
        g = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    torch.cuda.synchronize()
    assert_same(r, ref, "on a side stream")
    assert_same(g, ref, "global buffer on a side stream")


@requires_cuda
def test_graph_capture_records_the_operator():
    W, qs = weight("cuda", shape=(512, 768), seed=13, dtype=torch.float16)
    nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)  # plan and buffer made eagerly
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    buffer = nf4_torch.fast_dequantize(W, qs, use_global_buffer=True)
    assert r.data_ptr() != buffer.data_ptr(), "a captured call writes the graph's own output"
    W.copy_(torch.randint(0, 256, W.shape, dtype=torch.uint8, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_same(r, want(W, qs), "replayed")


@pytest.mark.parametrize("device", DEVICES)
def test_compile_after_eager_calls(device):
    # A quant state that already carries a prepared launch traces like any other: the compiled
    # program calls the operator (no graph break) and gives the same bits.
    W, qs = weight(device, seed=14, dtype=torch.bfloat16)
    x = torch.randn(3, 320).to(torch.bfloat16).to(device)

    def f(x, W, qs):
        return x @ nf4_torch.fast_dequantize(W, qs).t()

    eager = f(x, W, qs)
    assert isinstance(plan(qs), nf4_torch._C.Prepared)
    torch._dynamo.reset()
    e = torch._dynamo.explain(f)(x, W, qs)
    assert e.graph_break_count == 0 and e.graph_count == 1, str(e)
    assert any("nf4.dequantize" in str(g.graph) for g in e.graphs)
    torch._dynamo.reset()
    assert_same(torch.compile(f, fullgraph=True, backend="eager")(x, W, qs), eager, "compiled after eager calls")
