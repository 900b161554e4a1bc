# SPDX-License-Identifier: MIT
"""The operator attacked as a user passing wrong things (docs/RELIABILITY.md, "The PyTorch
operator, attacked"): every argument of the wrong dtype, shape, device or layout; views with a
storage offset; a quant state from another weight; absmax too short; bad blocksizes; out too
small, on another device or sharing memory with an input; non-finite statistics; and the prepared
relaunch of nf4_torch.dequantize / fast_dequantize after the weight's storage was replaced
(`W.data = ...`), after the quant state changed in place and after a tensor's memory was freed.

Each case must end in a Python exception naming the argument, or in the oracle's bits: never a
device fault, a stale result or a crash. On the GPU machine the CUDA cases also run under
compute-sanitizer (lab/gpu_torch_bench.sh, step "hostile"), which must report 0 errors."""
import dataclasses
import re

import pytest
import torch

import nf4_torch
from nf4_torch.testing import NestedState, bits, make_weight

from conftest import DEVICES, HAS_CUDA, requires_cuda

SHAPE = [48, 64]  # 3072 elements: 48 blocks of 64, one nested block of 256


def weight(device, nested=True, dtype=torch.bfloat16, seed=0, shape=SHAPE, quant_type="nf4"):
    # Nested blocks of 16 absmax: several of them, so that every statistic has more than one
    # element (a one-element tensor is contiguous whatever its stride).
    W, qs = make_weight(list(shape), nested=nested, dtype=dtype, quant_type=quant_type, nested_blocksize=16,
                        generator=torch.Generator().manual_seed(seed))
    return W.to(device), qs.to(device)


def replace(qs, **changes):
    return dataclasses.replace(qs, **changes)


def on(device, qs):
    return qs.to(device)


def args(qs):
    return nf4_torch.unpack_quant_state(qs)._asdict()


def op(W, **a):
    return torch.ops.nf4.dequantize(W, *a.values())


def oracle(W, qs):
    """The CPU oracle's answer for W and qs wherever they are."""
    a = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in args(qs).items()}
    return op(W.cpu(), **a)


def same_bits(got, want, what):
    """Bit for bit, except that a NaN may be any NaN (docs/DESIGN.md section 2 promises a NaN, not
    its payload: the GPU's arithmetic gives the canonical one)."""
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
    g, w = got.detach().cpu(), want.detach().cpu()
    both_nan = torch.isnan(g.float()) & torch.isnan(w.float())
    differ = (bits(g) != bits(w)) & ~both_nan
    assert not bool(differ.any()), f"{what}: {int(differ.sum())} of {g.numel()} elements differ"


def raises(match, fn, *a, exc=RuntimeError, **kw):
    with pytest.raises(exc, match=match) as info:
        fn(*a, **kw)
    return str(info.value)


def other_device(device):
    return "cpu" if device != "cpu" else ("cuda" if HAS_CUDA else None)


# ---- every argument of the operator, wrong --------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_every_argument_wrong(device):
    W, qs = weight(device)
    a = args(qs)
    cases = [
        # (argument changes, the words the message must hold)
        (dict(absmax=a["absmax"].float()), r"absmax must be Byte"),
        (dict(absmax=a["absmax"][:-1]), r"absmax_count must be .*\(argument absmax\)"),
        (dict(absmax=torch.cat([a["absmax"], a["absmax"][:1]])), r"\(argument absmax\)"),
        (dict(absmax=a["absmax"].to(torch.int8)), r"absmax must be Byte"),
        (dict(quant_map=a["quant_map"].double()), r"quant_map must be Float"),
        (dict(quant_map=a["quant_map"].half()), r"quant_map must be Float"),
        (dict(quant_map=a["quant_map"][:15]), r"quant_map_count must be 16.*\(argument quant_map\)"),
        (dict(quant_map=torch.cat([a["quant_map"], a["quant_map"]])), r"\(argument quant_map\)"),
        (dict(nested_absmax=a["nested_absmax"].double()), r"nested_absmax must be Float"),
        (dict(nested_absmax=a["nested_absmax"][:0]), r"nested_absmax is empty, but shape \[48, 64\] has 3072"),
        (dict(nested_absmax=a["nested_absmax"][:-1]), r"\(argument nested_absmax\)"),
        (dict(absmax=a["absmax"][:0]), r"absmax is empty"),
        (dict(quant_map=a["quant_map"][:0]), r"quant_map is empty"),
        (dict(nested_absmax=torch.cat([a["nested_absmax"]] * 2)), r"\(argument nested_absmax\)"),
        (dict(nested_quant_map=a["nested_quant_map"][:255]), r"nested_code_count must be 256.*\(argument nested_quant_map\)"),
        (dict(nested_quant_map=a["nested_quant_map"].to(torch.bfloat16)), r"nested_quant_map must be Float"),
        (dict(nested_quant_map=None), r"both or neither"),
        (dict(nested_absmax=None), r"both or neither"),
        (dict(offset=torch.zeros(2, device=device)), r"offset must hold one value"),
        (dict(offset=torch.zeros((), dtype=torch.float64, device=device)), r"offset must be torch.float32"),
        (dict(blocksize=0), r"blocksize must be a power of two in \[32, 4096\], got 0.*\(argument blocksize\)"),
        (dict(blocksize=48), r"blocksize must be a power of two.*\(argument blocksize\)"),
        (dict(blocksize=-64), r"blocksize must be a power of two.*\(argument blocksize\)"),
        (dict(blocksize=16), r"\(argument blocksize\)"),
        (dict(blocksize=8192), r"\(argument blocksize\)"),
        (dict(blocksize=1 << 40), r"blocksize must fit in 32 bits"),
        (dict(nested_blocksize=0), r"nested_blocksize must be a power of two.*\(argument nested_blocksize\)"),
        (dict(nested_blocksize=255), r"\(argument nested_blocksize\)"),
        (dict(nested_blocksize=-(1 << 40)), r"nested_blocksize must fit in 32 bits"),
        (dict(shape=[48, -64]), r"shape must not have negative sizes"),
        (dict(shape=[1 << 30, 1 << 30]), r"more than 2\^56"),
        (dict(shape=[48, 65]), r"packed_bytes must be .*\(argument W\)"),
        (dict(shape=[64, 64]), r"\(argument W\)"),
        (dict(dtype=torch.float64), r"dtype must be torch.float16, torch.bfloat16 or torch.float32"),
        (dict(dtype=torch.int8), r"dtype must be"),
        (dict(quant_type="NF4"), r"quant_type must be 'nf4' or 'fp4'"),
        (dict(quant_type=""), r"quant_type must be 'nf4' or 'fp4'"),
        (dict(W=W[:-1]), r"packed_bytes must be .*\(argument W\)"),
        (dict(W=torch.cat([W, W])), r"\(argument W\)"),
        (dict(W=W.view(torch.int8).to(torch.complex64)), r"W must not be complex"),
    ]
    for changes, match in cases:
        Wx = changes.pop("W", W)
        raises(match, op, Wx, **dict(a, **changes))
    flat = dict(a, nested_absmax=None, nested_quant_map=None)
    raises(r"offset is only meaningful", op, W, **flat)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_arguments_are_refused(device):
    W, qs = weight(device)
    a = args(qs)
    wide = lambda t: torch.stack([t, t], dim=-1)[..., 0]  # noqa: E731  same values, stride 2
    for name in ("absmax", "quant_map", "nested_absmax", "nested_quant_map"):
        assert not wide(a[name]).is_contiguous()
        raises(rf"{name} must be contiguous", op, W, **dict(a, **{name: wide(a[name])}))
    raises(r"W must be contiguous", op, wide(W.view(-1)), **a)
    out = torch.empty(64, 48, dtype=a["dtype"], device=device).t()
    raises(r"out must be contiguous", torch.ops.nf4.dequantize.out, W, *a.values(), out=out)
    # The eager helpers give the operator's errors too.
    raises(r"W must be contiguous", nf4_torch.dequantize, wide(W.view(-1)), qs)


@pytest.mark.parametrize("device", DEVICES)
def test_views_with_a_storage_offset_give_the_oracles_bits(device):
    # Slices that start inside a larger allocation are contiguous: nf4 must read from their first
    # element, not from the start of the storage.
    W, qs = weight(device, seed=1)
    want = oracle(W, qs)
    a = args(qs)

    def inside(t, before=5, after=3):
        big = torch.zeros(before + t.numel() + after, dtype=t.dtype, device=t.device)
        big[before:before + t.numel()] = t.reshape(-1)
        return big[before:before + t.numel()].view(t.shape)

    moved = {k: inside(v) for k, v in a.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    moved["offset"] = inside(a["offset"].reshape(1)).reshape(())
    Wv = inside(W)
    assert Wv.storage_offset() > 0 and moved["absmax"].storage_offset() > 0
    same_bits(op(Wv, **dict(a, **moved)), want, "offset views")
    out_big = torch.zeros(7 + want.numel() + 16, dtype=a["dtype"], device=device)
    out = out_big[7:7 + want.numel()].view(want.shape)
    torch.ops.nf4.dequantize.out(Wv, *dict(a, **moved).values(), out=out)
    same_bits(out, want, "out= as an offset view")
    assert bool((out_big[:7] == 0).all()) and bool((out_big[7 + want.numel():] == 0).all()), "wrote outside out"


@pytest.mark.parametrize("device", DEVICES)
def test_arguments_on_another_device(device):
    other = other_device(device)
    if other is None:
        pytest.skip("needs a CUDA device")
    W, qs = weight(device)
    a = args(qs)
    for name in ("absmax", "quant_map", "nested_absmax", "nested_quant_map"):
        raises(rf"{name} must be on {device}", op, W, **dict(a, **{name: a[name].to(other)}))
    if device == "cpu":
        # A device offset for host data cannot be read without a copy: refused.
        raises(r"offset must be on cpu or the CPU", op, W, **dict(a, offset=a["offset"].to(other)))
    else:
        # A host offset with device data is a documented form (read on the host): same bits.
        same_bits(op(W, **dict(a, offset=a["offset"].cpu())), oracle(W, qs), "host offset")
    out = torch.empty(SHAPE, dtype=a["dtype"], device=other)
    raises(rf"out must be on {device}", torch.ops.nf4.dequantize.out, W, *a.values(), out=out)
    raises(r"must be on", nf4_torch.dequantize, W.to(other), qs)
    raises(r"must be on", nf4_torch.fast_dequantize, W, replace(qs, absmax=qs.absmax.to(other)))


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_arguments_on_the_second_gpu_while_the_first_is_current():
    W, qs = weight("cuda:1")
    a = args(qs)
    with torch.cuda.device(0):
        same_bits(op(W, **a), oracle(W, qs), "all on cuda:1")
        raises(r"absmax must be on cuda:1", op, W, **dict(a, absmax=a["absmax"].to("cuda:0")))
        x = torch.randn(2, SHAPE[1], dtype=torch.bfloat16, device="cuda:0")
        raises(r"nf4::gemv: x must be on cuda:1", nf4_torch.gemv, x, W, qs)


@pytest.mark.parametrize("device", DEVICES)
def test_a_quant_state_from_another_weight(device):
    W, qs = weight(device, seed=2)
    _, other = weight(device, seed=3, shape=[96, 64])   # twice the blocks: absmax too long
    _, small = weight(device, seed=4, shape=[24, 64])   # half: too short
    for q in (other, small):
        raises(r"\(argument W\)", nf4_torch.dequantize, W, q)
        raises(r"\(argument W\)", nf4_torch.fast_dequantize, W, q)
        raises(r"\(argument absmax\)", op, W, **dict(args(qs), absmax=q.absmax))
    # Another weight's state of the same size is a valid description of other statistics: nf4
    # cannot tell, and gives that description's bits (as bitsandbytes would).
    _, same_size = weight(device, seed=5)
    same_bits(nf4_torch.dequantize(W, same_size), oracle(W, same_size), "same-size state")


@pytest.mark.parametrize("device", DEVICES)
def test_out_too_small_or_sharing_memory_with_an_input(device):
    W, qs = weight(device)
    a = args(qs)
    dt = a["dtype"]
    for bad in (torch.empty([48, 63], dtype=dt, device=device), torch.empty([3071], dtype=dt, device=device),
                torch.empty([0], dtype=dt, device=device)):
        raises(r"out must have shape", torch.ops.nf4.dequantize.out, W, *a.values(), out=bad)
        raises(r"out must have shape", nf4_torch.dequantize, W, qs, out=bad, exc=ValueError)
    # out built on top of each input: refused naming the input, nothing written.
    for name in ("W", "absmax", "quant_map", "nested_absmax", "nested_quant_map", "offset"):
        t = W if name == "W" else a[name]
        store = torch.zeros(t.numel() * t.element_size() + 2 * SHAPE[0] * SHAPE[1] + 64, dtype=torch.uint8,
                            device=device)
        start = 32
        held = store[start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        held.copy_(t)
        before = store.clone()
        out = store[start - 2:start - 2 + 2 * SHAPE[0] * SHAPE[1]].view(dt).view(SHAPE)  # starts 2 bytes before
        changed = dict(a, **({} if name == "W" else {name: held}))
        raises(rf"out overlaps {name}", torch.ops.nf4.dequantize.out, held if name == "W" else W, *changed.values(),
               out=out)
        assert torch.equal(store, before), f"{name}: a refused call wrote"
    # The prepared path: out overlapping W is refused the same way (the plan exists first).
    W2, qs2 = weight(device, seed=6)
    store = torch.zeros(W2.numel() + 2 * SHAPE[0] * SHAPE[1], dtype=torch.uint8, device=device)
    store[:W2.numel()] = W2.view(-1)
    W2 = store[:W2.numel()].view(W2.shape)
    nf4_torch.dequantize(W2, qs2)
    assert isinstance(qs2.__dict__.get("_nf4_prepared"), nf4_torch._C.Prepared)
    out = store[W2.numel() - 2:W2.numel() - 2 + 2 * SHAPE[0] * SHAPE[1]].view(dt).view(SHAPE)
    raises(r"out overlaps W", nf4_torch.dequantize, W2, qs2, out=out)
    raises(r"out overlaps W", nf4_torch.fast_dequantize, W2, qs2, out=out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_non_finite_statistics_give_the_oracles_bits(device, nested):
    # NaN and Inf in absmax, the second-level absmax, the offset or a table are data, not argument
    # errors: checking them would read device memory (a synchronization per call), and
    # bitsandbytes gives NaN / Inf for them too. What is promised: no fault, the oracle's values.
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        W, qs = weight(device, nested=nested, dtype=dtype, seed=7)
        if nested:
            qs.state2.absmax[0] = float("nan")
            qs.state2.code[5] = float("inf")
            qs.state2.code[6] = float("-inf")
            qs.code[3] = float("nan")
        else:
            qs.absmax[1] = float("nan")
            qs.absmax[2] = float("inf")
            qs.absmax[3] = -float("inf")
            qs.absmax[4] = 3.0e38  # times a code near 1: overflows fp16 and bf16
        got = nf4_torch.dequantize(W, qs)
        want = oracle(W, qs)
        assert bool(torch.isnan(want.float()).any()), "the case makes no NaN"
        same_bits(got, want, f"{dtype}, non-finite statistics")
        same_bits(nf4_torch.dequantize(W, qs), want, "relaunch")
    if nested:
        W, qs = weight(device, seed=8)
        qs.offset = torch.tensor(float("inf"), device=device)
        same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "infinite offset")


@pytest.mark.parametrize("device", DEVICES)
def test_gemv_arguments_wrong(device):
    W, qs = weight(device, dtype=torch.bfloat16)
    n, k = SHAPE
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(device)
    raises(r"nf4::gemv: x must be torch.float16, torch.bfloat16 or torch.float32, got Double",
           nf4_torch.gemv, x.double(), W, qs)
    raises(r"nf4::gemv: x must be torch.float16", nf4_torch.gemv, x.to(torch.int32), W, qs)
    raises(r"nf4::gemv: x must be \[\.\.\., K\] with K = 64", nf4_torch.gemv, x[:, :63].contiguous(), W, qs)
    raises(r"nf4::gemv: x must be \[\.\.\., K\]", nf4_torch.gemv, x.reshape(-1)[0].clone(), W, qs)
    raises(r"nf4::gemv: x must be contiguous", nf4_torch.gemv, torch.cat([x, x], 1)[:, ::2], W, qs)
    raises(r"nf4::gemv: at most 256 rows", nf4_torch.gemv, x.new_zeros(257, k), W, qs)
    raises(r"out_dtype must be", nf4_torch.gemv, x, W, qs, out_dtype=torch.int8)
    raises(r"mode must be 'exact' or 'fast'", nf4_torch.gemv, x, W, qs, mode="fastest")
    raises(r"\(argument W\)", nf4_torch.gemv, x, W[:-1], qs)
    raises(r"\(argument absmax\)", nf4_torch.gemv, x, W, replace(qs, absmax=qs.absmax[:-1]))
    raises(r"\(argument blocksize\)", nf4_torch.gemv, x, W, replace(qs, blocksize=0))
    other = other_device(device)
    if other is not None:
        raises(rf"nf4::gemv: x must be on {device}", nf4_torch.gemv, x.to(other), W, qs)
    # x as a view with a storage offset, and x holding NaN and Inf: the oracle's bits (exact).
    big = torch.zeros(5 + x.numel(), dtype=x.dtype, device=device)
    big[5:] = x.reshape(-1)
    xv = big[5:].view(x.shape)
    xv[0, 0] = float("nan")
    xv[1, 3] = float("inf")
    want = nf4_torch.gemv(xv.cpu(), W.cpu(), on("cpu", qs), mode="exact")
    same_bits(nf4_torch.gemv(xv, W, qs, mode="exact"), want, "gemv: offset view, NaN and Inf in x")
    if device != "cpu":
        raises(r"does not exist", torch.ops.nf4.gemv_mode_used, torch.device("cuda", 63), torch.bfloat16, "fast")


def test_quant_state_fields_of_the_wrong_type():
    W, qs = weight("cpu")
    for field, value, match in (("blocksize", None, r"quant_state.blocksize must be an integer, got None"),
                                ("blocksize", 2.5, r"quant_state.blocksize must be an integer"),
                                ("blocksize", "64", r"quant_state.blocksize must be an integer"),
                                ("shape", None, r"quant_state.shape must be a sequence of integers"),
                                ("shape", [48, None], r"quant_state.shape must be an integer")):
        bad = replace(qs, **{field: value})
        raises(match, nf4_torch.dequantize, W, bad, exc=TypeError)
        raises(match, nf4_torch.fast_dequantize, W, bad, exc=TypeError)
    raises(r"absmax is None, expected a tensor", nf4_torch.dequantize, W, replace(qs, absmax=None))
    raises(r"quant_map is None, expected a tensor", op, W, **dict(args(qs), quant_map=None))
    raises(r"W is None, expected a tensor", op, None, **args(qs))
    raises(r"nf4::gemv: x is None, expected a tensor", torch.ops.nf4.gemv, None, W, *list(args(qs).values())[:8])
    raises(r"dtype", nf4_torch.dequantize, W, replace(qs, dtype="bfloat16"), exc=(RuntimeError, TypeError))


# ---- the prepared relaunch after the world changed under it -----------------------------------------

def plan(qs):
    return qs.__dict__.get("_nf4_prepared")


def prepared(device, **kw):
    W, qs = weight(device, **kw)
    first = nf4_torch.dequantize(W, qs)
    assert isinstance(plan(qs), nf4_torch._C.Prepared)
    same_bits(first, oracle(W, qs), "first call")
    return W, qs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ["dequantize", "fast_dequantize"])
def test_relaunch_after_the_weights_storage_was_replaced(device, entry):
    fn = getattr(nf4_torch, entry)
    W, qs = prepared(device)
    # Same size, other bytes, other memory: the new bytes, not the old.
    W.data = torch.randint(0, 256, W.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(9)).to(device)
    same_bits(fn(W, qs), oracle(W, qs), "W.data replaced")
    # In place: read at launch.
    W.data[:5] ^= 0xFF
    same_bits(fn(W, qs), oracle(W, qs), "W changed in place")
    # Shorter, longer, another dtype of the same bytes, a non-contiguous view.
    keep = W.data
    W.data = keep[:-1]
    raises(r"packed_bytes must be .*\(argument W\)", fn, W, qs)
    W.data = torch.cat([keep, keep])
    raises(r"\(argument W\)", fn, W, qs)
    W.data = keep.view(-1).view(torch.int16).view(-1, 1)  # the same bytes as int16: quant_storage
    same_bits(fn(W, qs), oracle(keep, qs), "W as int16 storage")
    W.data = keep.clone()
    same_bits(fn(W, qs), oracle(keep, qs), "W as a copy")
    W.data = torch.stack([keep.view(-1), keep.view(-1)], 1)[:, :1]  # stride 2: not contiguous
    raises(r"W must be contiguous", fn, W, qs)
    W.data = keep
    same_bits(fn(W, qs), oracle(keep, qs), "W back")


@pytest.mark.parametrize("device", DEVICES)
def test_relaunch_after_the_quant_state_changed_in_place(device):
    W, qs = prepared(device, seed=10)
    qs.absmax[:7] = 3
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "absmax changed in place")
    qs.state2.absmax.mul_(0.5)
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "nested absmax changed in place")
    qs.code.copy_(qs.code.flip(0))
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "quant_map changed in place")
    qs.offset.fill_(0.5)
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "offset changed in place")
    # .data = a shorter view, or the same bytes as another dtype: the same object, the same
    # address and the same version, but no longer a valid argument. Before this was watched the
    # plan ran on with the old count and dtype.
    keep = qs.absmax.data
    qs.absmax.data = keep[:-1]
    raises(r"absmax_count must be .*\(argument absmax\)", nf4_torch.dequantize, W, qs)
    raises(r"\(argument absmax\)", nf4_torch.fast_dequantize, W, qs)
    qs.absmax.data = keep.view(torch.int8)
    raises(r"absmax must be Byte", nf4_torch.dequantize, W, qs)
    qs.absmax.data = keep
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "absmax restored")
    keep2 = qs.state2.absmax.data
    qs.state2.absmax.data = keep2[:-1]
    raises(r"\(argument nested_absmax\)", nf4_torch.dequantize, W, qs)
    qs.state2.absmax.data = keep2
    code = qs.code.data
    qs.code.data = code[:8]
    raises(r"quant_map_count must be 16", nf4_torch.dequantize, W, qs)
    qs.code.data = code
    # Plain fields replaced, and a shape held in a list changed in place.
    qs.blocksize = 0
    raises(r"\(argument blocksize\)", nf4_torch.dequantize, W, qs)
    qs.blocksize = 64
    qs.shape = [48, 64]
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "list shape")
    qs.shape[0], qs.shape[1] = 64, 48
    r = nf4_torch.dequantize(W, qs)
    assert r.shape == (64, 48), "a list shape changed in place was not seen"
    same_bits(r, oracle(W, qs), "list shape changed in place")
    qs.shape[0] = 47
    raises(r"\(argument W\)", nf4_torch.dequantize, W, qs)


@pytest.mark.parametrize("device", DEVICES)
def test_relaunch_after_memory_was_freed(device):
    # untyped_storage().resize_(0) frees a tensor's memory and keeps the tensor (FSDP does it
    # between uses): every argument's freed memory is refused naming it, the plan never runs.
    for name in ("W", "absmax", "quant_map", "nested_absmax", "offset"):
        W, qs = prepared(device, seed=11)
        t = {"W": W, "absmax": qs.absmax, "quant_map": qs.code, "nested_absmax": qs.state2.absmax,
             "offset": qs.offset}[name]
        t.untyped_storage().resize_(0)
        raises(rf"{name} has no memory behind it", nf4_torch.dequantize, W, qs)
        raises(rf"{name} has no memory behind it", nf4_torch.fast_dequantize, W, qs)
        raises(rf"{name} has no memory behind it", op, W, **args(qs))
    # Shrunk, not freed: still too small for the tensor.
    W, qs = prepared(device, seed=12)
    qs.absmax.untyped_storage().resize_(qs.absmax.numel() // 2)
    raises(r"absmax has no memory behind it", nf4_torch.dequantize, W, qs)
    # The output's memory freed.
    W, qs = weight(device, seed=13)
    out = torch.empty(SHAPE, dtype=qs.dtype, device=device)
    out.untyped_storage().resize_(0)
    raises(r"out has no memory behind it", torch.ops.nf4.dequantize.out, W, *args(qs).values(), out=out)
    raises(r"out has no memory behind it", nf4_torch.dequantize, W, qs, out=out)
    # x of the product.
    x = torch.randn(2, SHAPE[1]).to(torch.bfloat16).to(device)
    x.untyped_storage().resize_(0)
    raises(r"x has no memory behind it", nf4_torch.gemv, x, W, qs)


@pytest.mark.parametrize("device", DEVICES)
def test_relaunch_after_the_tensor_objects_are_gone(device):
    # The plan keeps what it reads alive: the caller dropping its references (del, replacing the
    # attribute) leaves no dangling pointer; a replaced attribute is a new plan.
    W, qs = prepared(device, seed=14)
    want = oracle(W, qs)
    absmax = qs.absmax.clone()
    qs.absmax = absmax
    del absmax
    same_bits(nf4_torch.dequantize(W, qs), want, "absmax replaced by a copy, the copy's name dropped")
    state2 = qs.state2
    qs.state2 = NestedState(state2.absmax.clone(), state2.code.clone(), state2.blocksize)
    del state2
    if device != "cpu":
        torch.cuda.empty_cache()
    same_bits(nf4_torch.dequantize(W, qs), want, "state2 replaced")
    qs.absmax = None
    raises(r"absmax is None, expected a tensor", nf4_torch.dequantize, W, qs)


@requires_cuda
def test_no_device_fault_afterwards():
    # After all of the above in this process, the device is healthy: a fault would make every
    # later CUDA call fail (compute-sanitizer reports it too).
    W, qs = weight("cuda", seed=15)
    same_bits(nf4_torch.dequantize(W, qs), oracle(W, qs), "after the attacks")
    torch.cuda.synchronize()


def test_messages_name_one_argument():
    # The argument named is the operator's, not nf4_tensor's field (packed is W, nested_code is
    # nested_quant_map).
    W, qs = weight("cpu")
    a = args(qs)
    msg = raises(r"\(argument nested_quant_map\)", op, W, **dict(a, nested_quant_map=a["nested_quant_map"][:3]))
    assert re.search(r"nested_code_count must be 256", msg), msg
