# SPDX-License-Identifier: MIT
"""torch.ops.nf4.dequantize: bit-exact against the oracle (CPU key), a plain PyTorch implementation of
docs/DESIGN.md section 2, and bitsandbytes' own outputs (tests/data/golden.safetensors); the out= overload;
argument errors; the current stream."""
import json
import zlib

import pytest
import torch

import nf4_torch
from nf4_torch.reference import reference_dequantize
from nf4_torch.testing import count_differing_bits, make_weight, random_code2

from conftest import DEVICES, GOLDEN, GOLDEN_INDEX, HAS_CUDA, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Sizes near zero and block edges, odd element counts, and a few larger ones.
SHAPES = [[1, 1], [3, 7], [1, 1001], [64, 200], [33, 65], [256, 4096]]


def op(W, qs, device=None, **kw):
    a = nf4_torch.unpack_quant_state(qs)
    return torch.ops.nf4.dequantize(W, *a, **kw)


def to(device, W, qs):
    """W and every tensor of the quant state on `device`."""
    moved = nf4_torch.testing.QuantState(
        absmax=qs.absmax.to(device), shape=qs.shape, code=qs.code.to(device), dtype=qs.dtype,
        blocksize=qs.blocksize, quant_type=qs.quant_type,
        offset=None if qs.offset is None else qs.offset.to(device),
        state2=None if qs.state2 is None else nf4_torch.testing.NestedState(
            qs.state2.absmax.to(device), qs.state2.code.to(device), qs.state2.blocksize))
    return W.to(device), moved


def assert_bit_exact(got, want, what=""):
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
    n = count_differing_bits(got, want)
    if n:
        g, w = got.reshape(-1).cpu(), want.reshape(-1).cpu()
        i = int(torch.nonzero(nf4_torch.testing.bits(g) != nf4_torch.testing.bits(w))[0])
        pytest.fail(f"{what}: {n} of {got.numel()} elements differ; first at flat index {i}: {g[i].item()!r} vs {w[i].item()!r}")


def ref(W, qs):
    return reference_dequantize(W, *nf4_torch.unpack_quant_state(qs))


# ---- random data: reference vs oracle vs CUDA ---------------------------------------------------

CASES = [
    # (quant_type, nested, blocksize, nested_blocksize)
    ("nf4", True, 64, 256),
    ("nf4", True, 32, 2),
    ("nf4", True, 4096, 1),
    ("nf4", False, 64, 0),
    ("nf4", False, 128, 0),
    ("fp4", True, 64, 256),
    ("fp4", False, 256, 0),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'nested' if c[1] else 'flat'}-B{c[2]}-B2{c[3]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_oracle_and_cuda_match_reference(shape, case, dtype):
    quant_type, nested, blocksize, nested_blocksize = case
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, case)).encode()))
    W, qs = make_weight(shape, blocksize=blocksize, nested=nested, nested_blocksize=nested_blocksize or 256,
                        quant_type=quant_type, dtype=dtype, generator=g)
    want = ref(W, qs)
    assert_bit_exact(op(W, qs), want, "cpu oracle vs reference")
    if HAS_CUDA:
        Wd, qd = to("cuda", W, qs)
        got = op(Wd, qd)
        assert got.device.type == "cuda"
        assert_bit_exact(got, want, "cuda vs reference")
        assert_bit_exact(ref(Wd, qd), want, "reference on cuda vs reference on cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wide_absmax_overflow_and_subnormals(dtype):
    # Flat absmax over 2^-30 .. 2^30: fp16 overflows to inf and rounds into subnormals.
    g = torch.Generator().manual_seed(7)
    W, qs = make_weight([512, 640], blocksize=32, nested=False, dtype=dtype, generator=g, wide_absmax=True)
    want = ref(W, qs)
    if dtype == torch.float16:
        assert torch.isinf(want).any() and (want.abs() < 6.1e-5).logical_and(want != 0).any()
    assert_bit_exact(op(W, qs), want, "cpu")
    if HAS_CUDA:
        assert_bit_exact(op(*to("cuda", W, qs)), want, "cuda")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [[4096, 4096], [14336, 4096], [4097, 3]], ids=lambda s: "x".join(map(str, s)))
def test_cuda_large_matches_reference(shape, dtype):
    g = torch.Generator("cuda").manual_seed(11)
    W, qs = make_weight(shape, device="cuda", dtype=dtype, generator=g)
    assert_bit_exact(op(W, qs), ref(W, qs), "cuda vs reference (on cuda)")


@requires_cuda
def test_cuda_matches_oracle_with_bnb_code2():
    # The second-level table as bitsandbytes makes it (read from the golden file).
    from safetensors.torch import load_file
    code2 = load_file(GOLDEN)["c000.weight.nested_quant_map"]
    g = torch.Generator().manual_seed(3)
    W, qs = make_weight([1000, 1000], dtype=torch.bfloat16, code2=code2, generator=g)
    assert_bit_exact(op(*to("cuda", W, qs)), op(W, qs), "cuda vs cpu oracle")


# ---- bitsandbytes' own outputs ------------------------------------------------------------------

def _golden_cases():
    with open(GOLDEN_INDEX) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def golden():
    from safetensors.torch import load_file
    return load_file(GOLDEN)


@pytest.mark.parametrize("device", DEVICES)
def test_golden_bitsandbytes_outputs(golden, device):
    checked = 0
    for case in _golden_cases():
        name = case["name"]
        p = f"{name}.weight"
        qt = case["quant_type"]
        meta = json.loads(bytes(golden[f"{p}.quant_state.bitsandbytes__{qt}"].tolist()).decode())
        nested = f"{p}.nested_absmax" in golden
        t = lambda k: golden[k].to(device)  # noqa: E731
        offset = torch.tensor(meta["nested_offset"], dtype=torch.float32).to(device) if nested else None
        for dtype_name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
            want = golden[f"{name}.expected.{dtype_name}"]
            got = torch.ops.nf4.dequantize(
                t(p), t(f"{p}.absmax"), t(f"{p}.quant_map"),
                t(f"{p}.nested_absmax") if nested else None, t(f"{p}.nested_quant_map") if nested else None,
                offset, meta["blocksize"], meta.get("nested_blocksize", 0), meta["shape"], dtype, qt)
            assert_bit_exact(got, want, f"{name} ({qt}, {'nested' if nested else 'flat'}, B={meta['blocksize']}, "
                                        f"{meta['shape']}) -> {dtype_name} on {device}")
            checked += 1
    assert checked == 3 * len(_golden_cases()) > 300


# ---- out= ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_out_variant(device):
    W, qs = to(device, *make_weight([300, 128], dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5)))
    a = nf4_torch.unpack_quant_state(qs)
    out = torch.full([300, 128], float("nan"), dtype=torch.bfloat16, device=device)
    r = torch.ops.nf4.dequantize.out(W, *a, out=out)
    assert r is out or r.data_ptr() == out.data_ptr()
    assert_bit_exact(out, op(W, qs), "out= vs functional")
    for bad, match in ((torch.empty([300, 127], dtype=torch.bfloat16, device=device), "shape"),
                       (torch.empty([300, 128], dtype=torch.float16, device=device), "must be"),
                       (torch.empty([128, 300], dtype=torch.bfloat16, device=device).t(), "contiguous")):
        with pytest.raises(RuntimeError, match=match):
            torch.ops.nf4.dequantize.out(W, *a, out=bad)
    with pytest.raises(ValueError, match="shape"):
        nf4_torch.dequantize(W, qs, out=torch.empty([1, 2], dtype=torch.bfloat16, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_shape(device):
    W, qs = to(device, *make_weight([4, 64], generator=torch.Generator().manual_seed(1)))
    e = torch.empty(0, dtype=torch.uint8, device=device)
    f = torch.empty(0, dtype=torch.float32, device=device)
    got = torch.ops.nf4.dequantize(e.view(0, 1), f, qs.code, None, None, None, 64, 0, [0, 64], torch.float16)
    assert got.shape == (0, 64) and got.dtype == torch.float16 and got.device.type == device


# ---- errors: clear messages, nothing run -------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_argument_errors(device):
    W, qs = to(device, *make_weight([64, 64], generator=torch.Generator().manual_seed(2)))
    a = nf4_torch.unpack_quant_state(qs)._asdict()

    def call(**changes):
        args = dict(a, **changes)
        Wx = args.pop("W", W)
        return torch.ops.nf4.dequantize(Wx, *args.values())

    cases = [
        (dict(blocksize=48), "blocksize must be a power of two"),            # nf4's own message
        (dict(blocksize=1 << 40), "blocksize must fit in 32 bits"),
        (dict(absmax=a["absmax"][:-1]), "absmax_count must be"),               # nf4's size check
        (dict(W=W[:-1]), "packed_bytes must be"),
        (dict(absmax=a["absmax"].float()), "absmax must be Byte"),
        (dict(nested_quant_map=None), "both or neither"),
        (dict(nested_quant_map=a["nested_quant_map"][:255]), "nested_code_count must be 256"),
        (dict(quant_map=a["quant_map"][:15]), "quant_map_count must be 16"),
        (dict(quant_type="int4"), "quant_type must be 'nf4' or 'fp4'"),
        (dict(dtype=torch.float64), "dtype must be"),
        (dict(shape=[64, -64]), "negative"),
        (dict(nested_blocksize=3), "nested_blocksize must be a power of two"),
        (dict(offset=torch.zeros(2, device=device)), "one value"),
        (dict(offset=torch.zeros((), dtype=torch.float64, device=device)), "float32"),
        (dict(absmax=a["absmax"].view(2, -1).t()), "contiguous"),
    ]
    if HAS_CUDA:
        other = "cpu" if device == "cuda" else "cuda"
        cases.append((dict(quant_map=a["quant_map"].to(other)), "must be on"))
    for changes, match in cases:
        with pytest.raises(RuntimeError, match=match):
            call(**changes)
    flat = dict(a, nested_absmax=None, nested_quant_map=None)
    with pytest.raises(RuntimeError, match="offset is only meaningful"):
        torch.ops.nf4.dequantize(W, *flat.values())


# ---- CUDA specifics ------------------------------------------------------------------------------

@requires_cuda
def test_runs_on_current_stream():
    # The weight is copied in on a side stream right behind a long sleep; if the operator ran on
    # any other stream it would read the bytes before the copy landed.
    W, qs = make_weight([2048, 2048], device="cuda", dtype=torch.float16, generator=torch.Generator("cuda").manual_seed(4))
    want = op(W, qs)
    Wc = torch.zeros_like(W)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        Wc.copy_(W)
        got = op(Wc, qs)
    s.synchronize()
    assert_bit_exact(got, want, "on a side stream")


@requires_cuda
def test_offset_on_host_with_device_data():
    # A quant state loaded from JSON may keep the offset as a host scalar: read on the host.
    W, qs = make_weight([128, 256], device="cuda", generator=torch.Generator("cuda").manual_seed(8))
    want = op(W, qs)
    qs.offset = qs.offset.cpu()
    assert_bit_exact(op(W, qs), want, "host offset")
    qs.offset = float(qs.offset)
    assert_bit_exact(nf4_torch.dequantize(W, qs), want, "python float offset")


@requires_cuda
def test_quant_storage_other_dtype():
    # bitsandbytes can store the packed bytes in another dtype (quant_storage): same bytes, same result.
    W, qs = make_weight([64, 512], device="cuda", generator=torch.Generator("cuda").manual_seed(9))
    stored = W.view(-1).view(torch.bfloat16).view(-1, 1)  # [N/4, 1] bf16, as bnb stores it
    assert_bit_exact(op(stored, qs), op(W, qs), "bf16 storage")


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device():
    W, qs = make_weight([512, 512], generator=torch.Generator().manual_seed(10))
    got = op(*to("cuda:1", W, qs))
    assert got.device == torch.device("cuda:1")
    assert_bit_exact(got, op(W, qs), "cuda:1 vs oracle")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    # torch's own consistency checks of the registration: schema, fake vs real, aot dispatch.
    W, qs = to(device, *make_weight([96, 64], dtype=torch.float16, generator=torch.Generator().manual_seed(12)))
    a = tuple(nf4_torch.unpack_quant_state(qs))
    torch.library.opcheck(torch.ops.nf4.dequantize.default, (W, *a))
    out = torch.empty(a[7], dtype=a[8], device=device)
    torch.library.opcheck(torch.ops.nf4.dequantize.out, (W, *a), {"out": out})


def test_random_code2_is_sorted():
    c = random_code2(generator=torch.Generator().manual_seed(0))
    assert c.shape == (256,) and bool((c[1:] >= c[:-1]).all()) and c.min() >= -1 and c.max() == 1
