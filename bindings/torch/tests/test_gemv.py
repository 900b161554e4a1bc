# SPDX-License-Identifier: MIT
"""torch.ops.nf4.gemv (docs/GEMV.md), both contracts. Exact: bit for bit against a plain PyTorch
evaluation of the contract on the CPU key, CUDA against the CPU key, rows past one 8-row launch.
Fast: against a float64 sum over the weights rounded to x's dtype within the stated bound (every
device), and on the CPU key bit for bit against the sequential sum it is documented to compute.
Batch invariance of both (a row alone vs in batches up to 256), the mode argument, argument
errors, torch.compile (fullgraph, the fake implementation), CUDA-graph capture, and the
Linear4bit drop-in with its choice of path."""
import dataclasses

import pytest
import torch

import nf4_torch
from nf4_torch.reference import reference_dequantize
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import DEVICES, HAS_CUDA, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
HALF_DTYPES = [torch.float16, torch.bfloat16]
MODES = ["exact", "fast"]
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


def canonical_nan(y):
    bits = y.view({2: torch.int16, 4: torch.int32}[y.element_size()])
    nan = torch.tensor(CANONICAL_NAN[y.dtype]).to(bits.dtype)
    return torch.where(torch.isnan(y), nan, bits).view(y.dtype)


def weight_in(dtype, W, qs):
    """W [N, K] as nf4_torch.dequantize writes it in `dtype` (the fast contract's weights), checked
    against the plain-PyTorch dequantization to fp32 rounded to `dtype` (the contract's definition)."""
    a = nf4_torch.unpack_quant_state(qs)
    w = nf4_torch.dequantize(W, dataclasses.replace(qs, dtype=dtype))
    w32 = reference_dequantize(W.cpu(), *[t.cpu() if isinstance(t, torch.Tensor) else t
                                          for t in a._replace(dtype=torch.float32)])
    assert count_differing_bits(w.cpu(), w32.to(dtype)) == 0
    return w


def fast_reference(x, W, qs):
    """The fast contract's float64 reference: (sum over k of w x, sum over k of |w x|) [M, N], w the
    weights rounded to x's dtype. Both in float64, on the CPU."""
    w = weight_in(x.dtype, W, qs).cpu().double()
    x64 = x.reshape(-1, x.shape[-1]).cpu().double()
    return x64 @ w.t(), x64.abs() @ w.abs().t()


def fast_bound(k, ref, abs_sum, out_dtype):
    """tests/support/gemv_fast.h: k * 2^-22 * sum |w x| for fp32 accumulation in any fixed order,
    plus half a unit in the last place of the output (relative 2^-8 bf16, 2^-11 fp16, 2^-24 fp32)."""
    acc = k * 2.0 ** -22 * abs_sum
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[out_dtype]
    return acc + (ref.abs() + acc) * 2.0 ** -bits + 1e-30


def assert_within_fast_bound(y, x, W, qs):
    k = x.shape[-1]
    ref, abs_sum = fast_reference(x, W, qs)
    err = (y.reshape(ref.shape).cpu().double() - ref).abs()
    bound = fast_bound(k, ref, abs_sum, y.dtype)
    outside = int((~(err <= bound)).sum())
    assert outside == 0, f"{outside} of {err.numel()} outputs outside the fast bound (worst {(err / bound).max():.3g}x)"
    return float((err / bound).max())


def sequential_fast(x, W, qs, out_dtype):
    """What the CPU backend computes for the fast contract: products of the weights rounded to x's
    dtype (exact in fp32), summed one after the other from k = 0 in fp32."""
    k = x.shape[-1]
    w = weight_in(x.dtype, W, qs).float()
    p = x.reshape(-1, 1, k).float() * w.unsqueeze(0)                 # [M, N, K], exact products
    acc = torch.zeros(p.shape[:2], dtype=torch.float32)
    for c in range(k):
        acc = acc + p[..., c]
    return canonical_nan(acc.to(out_dtype)).reshape(*x.shape[:-1], -1)


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
    # One launch (up to 8 rows), then rows that core slices into several launches.
    for m in [*range(1, 9), 9, 23, 256]:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        want = nf4_torch.gemv(x, W, qs)
        got = nf4_torch.gemv(x.cuda(), Wc, qsc)
        assert count_differing_bits(got.cpu(), want) == 0, f"m={m}"


@pytest.mark.parametrize("n,k,quant_type,nested,blocksize", [CASES[2], CASES[4], CASES[5]])
def test_exact_rows_past_one_launch(n, k, quant_type, nested, blocksize):
    # m > 8: core slices x into 8-row launches; every row is still the contract's, which is the
    # exact mode's result for that row alone.
    W, qs = weight(n, k, 3 * n + k, quant_type=quant_type, nested=nested, blocksize=blocksize)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(n)).to(torch.float16)
    got = nf4_torch.gemv(x, W, qs, out_dtype=torch.float32, mode="exact")
    assert count_differing_bits(got, contract(x, W, qs, torch.float32)) == 0
    for j in range(37):
        alone = nf4_torch.gemv(x[j:j + 1], W, qs, out_dtype=torch.float32, mode="exact")
        assert count_differing_bits(alone, got[j:j + 1]) == 0, f"row {j}"


@pytest.mark.parametrize("n,k,quant_type,nested,blocksize", CASES)
@pytest.mark.parametrize("x_dtype", HALF_DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_fast_within_the_bound(device, n, k, quant_type, nested, blocksize, x_dtype):
    # The fast contract on every device: the weights rounded to x's dtype, fp32 accumulation in a
    # fixed order, within k * 2^-22 * sum |w x| (+ half an ulp of the output) of a float64 sum.
    W, qs = to(device, *weight(n, k, n * 1000 + k, quant_type=quant_type, nested=nested, blocksize=blocksize))
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(k)).to(x_dtype).to(device)
    for out_dtype in DTYPES:
        y = nf4_torch.gemv(x, W, qs, out_dtype=out_dtype, mode="fast")
        assert y.dtype == out_dtype and y.shape == (11, n)
        assert_within_fast_bound(y, x, W, qs)
        # Repeatable bit for bit.
        assert count_differing_bits(nf4_torch.gemv(x, W, qs, out_dtype=out_dtype, mode="fast"), y) == 0


def test_fast_bound_check_catches_an_error():
    # The bound check above fails for a result off by a little more than the bound allows.
    W, qs = weight(33, 4096, 2)
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    y = nf4_torch.gemv(x, W, qs, out_dtype=torch.float32, mode="fast")
    ref, abs_sum = fast_reference(x, W, qs)
    bound = fast_bound(4096, ref, abs_sum, torch.float32)
    bad = y.double().clone()
    bad[1, 5] = ref[1, 5] + 1.01 * bound[1, 5]
    with pytest.raises(AssertionError, match="1 of 66 outputs outside"):
        assert_within_fast_bound(bad.float(), x, W, qs)


@pytest.mark.parametrize("n,k,quant_type,nested,blocksize", CASES)
@pytest.mark.parametrize("x_dtype", HALF_DTYPES)
def test_cpu_fast_is_the_sequential_sum(n, k, quant_type, nested, blocksize, x_dtype):
    W, qs = weight(n, k, n * 1000 + k, quant_type=quant_type, nested=nested, blocksize=blocksize)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k)).to(x_dtype)
    for out_dtype in DTYPES:
        got = nf4_torch.gemv(x, W, qs, out_dtype=out_dtype, mode="fast")
        assert count_differing_bits(got, sequential_fast(x, W, qs, out_dtype)) == 0


def test_fast_is_another_contract_than_exact():
    # fp16/bf16 x: the weights are rounded to x's dtype and summed in another order, so an fp32
    # output shows the difference; fp32 x has no fast path: the exact contract runs.
    W, qs = weight(33, 4096, 4)
    x = torch.randn(4, 4096, generator=torch.Generator().manual_seed(9))
    for x_dtype in HALF_DTYPES:
        xd = x.to(x_dtype)
        fast = nf4_torch.gemv(xd, W, qs, out_dtype=torch.float32, mode="fast")
        exact = nf4_torch.gemv(xd, W, qs, out_dtype=torch.float32, mode="exact")
        assert count_differing_bits(fast, exact) > 0
        assert nf4_torch.gemv_mode_used("cpu", x_dtype, "fast") == "fast"
    assert count_differing_bits(nf4_torch.gemv(x, W, qs, mode="fast"), nf4_torch.gemv(x, W, qs)) == 0
    assert nf4_torch.gemv_mode_used("cpu", torch.float32, "fast") == "exact"
    for x_dtype in DTYPES:
        assert nf4_torch.gemv_mode_used(torch.device("cpu"), x_dtype, "exact") == "exact"


@requires_cuda
def test_cuda_mode_used():
    # The fast path needs tensor cores: mma.sync bf16/fp16 from sm_80, fp16 (m16n8k8) on sm_75.
    cc = torch.cuda.get_device_capability()
    for x_dtype, need in ((torch.bfloat16, (8, 0)), (torch.float16, (7, 5)), (torch.float32, None)):
        want = "fast" if need is not None and cc >= need else "exact"
        assert nf4_torch.gemv_mode_used("cuda", x_dtype, "fast") == want, x_dtype
        assert nf4_torch.gemv_mode_used("cuda", x_dtype, "exact") == "exact"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_row_alone_equals_the_row_in_a_batch(device, mode):
    W, qs = to(device, *weight(64, 4096, 3))
    x = torch.randn(2, 128, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(device)
    batch = nf4_torch.gemv(x, W, qs, mode=mode)
    assert batch.shape == (2, 128, 64)
    flat, rows = x.reshape(256, 4096), batch.reshape(256, 64)
    # Batches of 9 (one full 8-row slice and one row) and of 100 give the same rows too.
    nine = nf4_torch.gemv(flat[:9], W, qs, mode=mode)
    hundred = nf4_torch.gemv(flat[100:200], W, qs, mode=mode)
    assert count_differing_bits(nine, rows[:9]) == 0 and count_differing_bits(hundred, rows[100:200]) == 0
    for j in range(256):
        assert count_differing_bits(nf4_torch.gemv(flat[j:j + 1], W, qs, mode=mode), rows[j:j + 1]) == 0, f"row {j}"


@pytest.mark.parametrize("device", DEVICES)
def test_argument_errors(device):
    W, qs = to(device, *weight(8, 64, 5))
    assert nf4_torch.gemv(torch.zeros(256, 64, device=device), W, qs).shape == (256, 8)
    for mode in MODES:
        with pytest.raises(RuntimeError, match="at most 256 rows"):
            nf4_torch.gemv(torch.zeros(257, 64, device=device), W, qs, mode=mode)
    with pytest.raises(RuntimeError, match=r"x must be \[\.\.\., K\]"):
        nf4_torch.gemv(torch.zeros(1, 63, device=device), W, qs)
    with pytest.raises(RuntimeError, match=r"nf4::gemv: x must be torch.float16, torch.bfloat16 or torch.float32, "
                                           r"got Double"):
        nf4_torch.gemv(torch.zeros(1, 64, dtype=torch.float64, device=device), W, qs)
    # The weight's and x's checks name the operator that was called, not the dequantization's.
    with pytest.raises(RuntimeError, match=r"nf4::gemv: x must be contiguous"):
        nf4_torch.gemv(torch.zeros(64, 2, device=device).t(), W, qs)
    a = nf4_torch.unpack_quant_state(qs)
    with pytest.raises(RuntimeError, match=r"nf4::gemv: absmax must be"):
        torch.ops.nf4.gemv(torch.zeros(1, 64, device=device), W, a.absmax.to(torch.float64), a.quant_map,
                           a.nested_absmax, a.nested_quant_map, a.offset, a.blocksize, a.nested_blocksize, a.shape,
                           a.quant_type, None, mode="exact")


@pytest.mark.parametrize("device", DEVICES)
def test_the_mode_argument(device):
    W, qs = to(device, *weight(8, 64, 5))
    a = nf4_torch.unpack_quant_state(qs)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(device)
    args = (x, W, a.absmax, a.quant_map, a.nested_absmax, a.nested_quant_map, a.offset, a.blocksize,
            a.nested_blocksize, a.shape, a.quant_type, None)
    # Positional callers of the schema before the mode get the exact contract, as before.
    assert count_differing_bits(torch.ops.nf4.gemv(*args), torch.ops.nf4.gemv(*args, mode="exact")) == 0
    assert count_differing_bits(torch.ops.nf4.gemv(*args[:10]), nf4_torch.gemv(x, W, qs, mode="exact")) == 0
    assert count_differing_bits(torch.ops.nf4.gemv(*args, mode="fast"), nf4_torch.gemv(x, W, qs, mode="fast")) == 0
    for bad in ("Fast", "", "tensor"):
        with pytest.raises(RuntimeError, match=f"nf4::gemv: mode must be 'exact' or 'fast', got '{bad}'"):
            torch.ops.nf4.gemv(*args, mode=bad)
        with pytest.raises(RuntimeError, match="mode must be 'exact' or 'fast'"):
            nf4_torch.gemv(x, W, qs, mode=bad)
        with pytest.raises(RuntimeError, match="nf4::gemv_mode_used: mode must be"):
            torch.ops.nf4.gemv_mode_used(torch.device(device), torch.bfloat16, bad)
        with pytest.raises(RuntimeError, match="nf4_torch.gemv_mode_used: mode must be"):
            nf4_torch.gemv_mode_used(device, torch.bfloat16, bad)
    # The mode is a keyword: a 13th positional argument is refused.
    with pytest.raises(RuntimeError):
        torch.ops.nf4.gemv(*args, "fast")
    # A bad mode is refused before anything else, on an empty x too.
    with pytest.raises(RuntimeError, match="mode must be"):
        nf4_torch.gemv(x[:0], W, qs, mode="slow")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", ["cuda"] if HAS_CUDA else ["cpu"])
def test_compiles_without_graph_breaks(device, mode):
    W, qs = to(device, *weight(96, 512, 9))
    a = nf4_torch.unpack_quant_state(qs)

    def f(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset):
        return torch.ops.nf4.gemv(x, W, absmax, quant_map, nested_absmax, nested_quant_map, offset, a.blocksize,
                                  a.nested_blocksize, a.shape, a.quant_type, None, mode=mode) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for rows in (4, 256):  # the fake implementation takes every row count the operator does
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(device)
        args = (x, W, a.absmax, a.quant_map, a.nested_absmax, a.nested_quant_map, a.offset)
        assert count_differing_bits(compiled(*args), f(*args)) == 0, f"{rows} rows"


@pytest.mark.parametrize("mode", MODES)
@requires_cuda
def test_cuda_graph_capture_replays_the_same_bits(mode):
    W, qs = to("cuda", *weight(256, 2048, 11))
    x = torch.randn(16, 2048, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()
    eager = nf4_torch.gemv(x, W, qs, mode=mode)  # warm-up: creates the context outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nf4_torch.gemv(x, W, qs, mode=mode)
    graph.replay()
    torch.cuda.synchronize()
    assert count_differing_bits(y, eager) == 0


def dense_linear(x, W, qs, bias):
    return torch.nn.functional.linear(x, nf4_torch.dequantize(W, qs).to(x.dtype), bias)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_4bit_drop_in(device):
    W, qs = to(device, *weight(48, 256, 13, dtype=torch.bfloat16))
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(device)
    helper = nf4_torch.helper
    assert helper.LINEAR_FUSED_MAX_ROWS == 256 and helper.LINEAR_EXACT_FUSED_MAX_ROWS == 4
    assert helper.LINEAR_DEFAULT_FAST_MAX_ROWS == 32 and helper.LINEAR_DEFAULT_FAST_LARGE_MAX_ROWS == 128
    assert helper.LINEAR_DEFAULT_LARGE_WEIGHT == 1 << 24
    assert helper.LINEAR_DEFAULT_FAST_HUGE_MAX_ROWS == 256 and helper.LINEAR_DEFAULT_HUGE_WEIGHT == 1 << 25
    assert helper.LINEAR_DEFAULT_HUGE_MIN_K == 4096
    fast_here = nf4_torch.gemv_mode_used(device, torch.bfloat16) == "fast"
    # (rows, mode) -> the path. Where the device runs the fast contract: by default the exact
    # product for one row, the fast one for 2-32 rows (this weight is small), dequantize + matmul
    # above; asked for fast, the fast product up to 256 rows. The exact product up to 4 rows when
    # asked for (or where the fast contract does not run), else dequantize + matmul.
    for rows, mode in [(1, None), (2, None), (3, None), (5, None), (16, None), (17, None), (32, None), (33, None), (64, None), (65, None), (128, None),
                       (129, None), (256, None),
                       (1, "fast"), (300, "fast"), (20, "fast"), (256, "fast"), (3, "exact"), (4, "exact"), (5, "exact"),
                       (20, "exact")]:
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16).to(device)
        if mode == "fast" and fast_here:
            want_path = "fast" if rows <= 256 else None
        elif mode is None and fast_here:
            want_path = "exact" if rows == 1 else "fast" if rows <= 32 else None
        else:
            want_path = "exact" if rows <= 4 else None
        assert nf4_torch.linear_4bit_path(x, mode, qs.shape) == want_path, (rows, mode)
        # A weight of 2^24 elements or more takes the fast product by default up to 128 rows, one
        # of 2^25 or more, or of 2^24 or more with K >= 4096, up to 256.
        for shape, most in (([4096, 4096], 256), ([2048, 8192], 256), ([8191, 4096], 256), ([6144, 4096], 256), ([8192, 2048], 128),
                            ([16384, 1024], 128), ([8192, 4095], 128), ([16384, 2048], 256), ([8192, 4096], 256), ([14336, 4096], 256)):
            big = want_path if mode is not None or not fast_here or rows <= 32 else "fast" if rows <= most else None
            assert nf4_torch.linear_4bit_path(x, mode, shape) == big, (rows, mode, shape)
        assert nf4_torch.linear_4bit_path(x, mode, [4095, 4096]) == want_path, (rows, mode)
        y = nf4_torch.linear_4bit(x, W, qs, bias, mode=mode)
        if want_path is None:
            want = dense_linear(x, W, qs, bias)
        else:
            want = nf4_torch.gemv(x, W, qs, mode=want_path) + bias
        assert count_differing_bits(y, want) == 0, (rows, mode)
        # Every path agrees with a float64 product to bf16 precision.
        ref = x.double() @ nf4_torch.dequantize(W, qs).double().t() + bias.double()
        assert torch.allclose(y.double(), ref, rtol=2 ** -7, atol=1e-2), (rows, mode)
    # Leading dimensions count as rows; fp32 x takes the exact product (no fast path for it).
    x3 = torch.randn(2, 2, 256, generator=torch.Generator().manual_seed(7)).to(device)
    assert nf4_torch.linear_4bit_path(x3) == "exact" and nf4_torch.linear_4bit_path(x3, "fast") == "exact"
    assert count_differing_bits(nf4_torch.linear_4bit(x3, W, qs), nf4_torch.gemv(x3, W, qs)) == 0
    assert nf4_torch.linear_4bit_path(torch.zeros(5, 256, device=device)) is None
    with pytest.raises(ValueError, match="mode must be None, 'exact' or 'fast', got 'quick'"):
        nf4_torch.linear_4bit(x3, W, qs, mode="quick")


def test_linear_4bit_without_the_fast_path(monkeypatch):
    # Where the device runs the exact contract for a fast request (bf16 below sm_80), the fused
    # product is only worth it up to 4 rows: linear_4bit takes the exact rule.
    W, qs = weight(48, 256, 13, dtype=torch.bfloat16)
    asked = []

    def exact_only(device, x_dtype, mode="fast"):
        asked.append((torch.device(device), x_dtype, mode))
        return "exact"
    monkeypatch.setattr(nf4_torch.helper, "gemv_mode_used", exact_only)
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert nf4_torch.linear_4bit_path(x) is None and nf4_torch.linear_4bit_path(x[:4]) == "exact"
    assert asked and asked[0] == (torch.device("cpu"), torch.bfloat16, "fast")
    assert count_differing_bits(nf4_torch.linear_4bit(x, W, qs), dense_linear(x, W, qs, None)) == 0
    assert count_differing_bits(nf4_torch.linear_4bit(x[:4], W, qs), nf4_torch.gemv(x[:4], W, qs)) == 0
