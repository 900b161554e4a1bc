# SPDX-License-Identifier: MIT
"""nf4_torch.fast_dequantize behaves like Unsloth's fast_dequantize on bitsandbytes weights: quant state
in class or list form, no quant state -> W itself, [1, N/2] weights -> the transpose, out=; and, where
the bitsandbytes package is importable on a GPU, the very same bits as bitsandbytes.dequantize_4bit."""
import pytest
import torch

import nf4_torch
from nf4_torch.testing import count_differing_bits, make_weight

from conftest import DEVICES, HAS_CUDA, requires_cuda


def assert_same(a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    n = count_differing_bits(a, b)
    assert n == 0, f"{what}: {n} of {a.numel()} elements differ"


def reference(W, qs):
    return nf4_torch.reference_dequantize(W, *nf4_torch.unpack_quant_state(qs))


def on(device, W, qs):
    return W.to(device), qs.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_class_and_list_forms(device, dtype):
    W, qs = on(device, *make_weight([320, 448], dtype=dtype, generator=torch.Generator().manual_seed(1)))
    want = reference(W, qs)
    assert_same(nf4_torch.fast_dequantize(W, qs), want, "class form")
    assert_same(nf4_torch.fast_dequantize(W, qs.as_list()), want, "list form")
    W.quant_state = qs  # a bitsandbytes Params4bit carries its state
    assert_same(nf4_torch.fast_dequantize(W), want, "W.quant_state")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["nf4-flat", "fp4-nested", "fp4-flat"])
def test_other_quant_states(device, kind):
    quant_type, layout = kind.split("-")
    W, qs = on(device, *make_weight([96, 160], quant_type=quant_type, nested=layout == "nested",
                                    dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2)))
    assert_same(nf4_torch.fast_dequantize(W, qs), reference(W, qs), kind)
    assert_same(nf4_torch.fast_dequantize(W, qs.as_list()), reference(W, qs), kind + " (list form)")


def test_no_quant_state_returns_W():
    W = torch.randn(4, 4)
    assert nf4_torch.fast_dequantize(W) is W
    assert nf4_torch.fast_dequantize(W, None) is W


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_weight_gives_transpose(device):
    # Unsloth: `is_transposed = W.shape[0] == 1; return out.t() if is_transposed else out`.
    W, qs = on(device, *make_weight([256, 96], dtype=torch.float16, generator=torch.Generator().manual_seed(3),
                                    transposed=True))
    assert W.shape == (1, 256 * 96 // 2)
    got = nf4_torch.fast_dequantize(W, qs)
    assert got.shape == (96, 256)
    assert_same(got, reference(W, qs).t(), "transposed")
    out = torch.empty(256, 96, dtype=torch.float16, device=device)
    r = nf4_torch.fast_dequantize(W, qs, out=out)
    assert r.shape == (96, 256) and r.data_ptr() == out.data_ptr()
    assert_same(out, reference(W, qs), "transposed, out=")


@pytest.mark.parametrize("device", DEVICES)
def test_out_argument(device):
    W, qs = on(device, *make_weight([128, 64], dtype=torch.bfloat16, generator=torch.Generator().manual_seed(4)))
    out = torch.empty(128, 64, dtype=torch.bfloat16, device=device)
    r = nf4_torch.fast_dequantize(W, qs, out=out, use_global_buffer=True)
    assert r.data_ptr() == out.data_ptr()
    assert_same(out, reference(W, qs), "out=")
    with pytest.raises(ValueError, match="dtype"):
        nf4_torch.fast_dequantize(W, qs, out=torch.empty(128, 64, dtype=torch.float16, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_python_number_offset(device):
    W, qs = on(device, *make_weight([64, 64], generator=torch.Generator().manual_seed(5)))
    want = reference(W, qs)
    qs.offset = float(qs.offset)
    assert_same(nf4_torch.fast_dequantize(W, qs), want, "float offset")


# ---- against bitsandbytes itself -----------------------------------------------------------------

def _bnb():
    try:
        import bitsandbytes
        import bitsandbytes.functional as F
        return bitsandbytes, F
    except Exception as e:  # not installed, or no library for this CUDA
        pytest.skip(f"bitsandbytes not importable: {e}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["nf4-nested", "nf4-flat", "fp4-nested"])
def test_same_bits_as_bitsandbytes(dtype, kind):
    _, F = _bnb()
    quant_type, layout = kind.split("-")
    W, qs = make_weight([1024, 1536], device="cuda", quant_type=quant_type, nested=layout == "nested", dtype=dtype,
                        generator=torch.Generator("cuda").manual_seed(6))
    state2 = None
    if qs.state2 is not None:
        state2 = F.QuantState(absmax=qs.state2.absmax, code=qs.state2.code, blocksize=qs.state2.blocksize,
                              dtype=torch.float32)
    bnb_state = F.QuantState(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                             quant_type=quant_type, dtype=dtype, offset=qs.offset, state2=state2)
    want = F.dequantize_4bit(W, bnb_state)
    assert_same(nf4_torch.fast_dequantize(W, bnb_state), want, f"vs bitsandbytes ({kind})")
    # bitsandbytes' own quantizer output, too.
    x = torch.randn(512, 640, device="cuda", generator=torch.Generator("cuda").manual_seed(7)).to(dtype)
    Wq, st = F.quantize_4bit(x, blocksize=64, quant_type=quant_type, compress_statistics=layout == "nested")
    assert_same(nf4_torch.fast_dequantize(Wq, st), F.dequantize_4bit(Wq, st), f"bnb-quantized ({kind})")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_params4bit_layer():
    # A real bitsandbytes Linear4bit layer, as Unsloth sees it: W = layer.weight, W.quant_state.
    bnb, F = _bnb()
    layer = bnb.nn.Linear4bit(640, 384, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    W = layer.weight
    assert_same(nf4_torch.fast_dequantize(W, W.quant_state), F.dequantize_4bit(W, W.quant_state), "Linear4bit")
    assert_same(nf4_torch.fast_dequantize(W.data.t(), W.quant_state), F.dequantize_4bit(W, W.quant_state).t(),
                "Linear4bit, transposed view")
