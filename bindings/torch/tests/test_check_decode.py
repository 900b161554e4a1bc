# SPDX-License-Identifier: MIT
"""lab/torch/check_decode.py without a GPU: its error measures and its judgement on made-up logits, and,
where transformers 5.x and bitsandbytes import, a whole run of the small model on the CPU that must
pass, and one with a planted defect in nf4's product (partial sums accumulated in bf16) that must fail."""
import importlib.util
import math
import os

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "lab", "torch", "check_decode.py")


def load():
    spec = importlib.util.spec_from_file_location("check_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cd = load()


def test_arguments():
    p = cd.make_parser()
    a = p.parse_args([])
    assert a.batches == "1,4,8,16" and a.ratio == cd.DEFAULT_RATIO and a.ref_dtype == "float64"
    assert cd.parse_sizes("16,1,4,4", "--batches") == [1, 4, 16]
    assert cd.parse_sizes("", "--prefill", allow_empty=True) == []
    for bad in ("", "0", "a", "1,-2"):
        with pytest.raises(SystemExit):
            cd.parse_sizes(bad, "--batches")
    assert cd.main(["--ratio", "0.9"]) == 2 and cd.main(["--new-tokens", "1"]) == 2


def test_step_metrics():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 50, generator=g, dtype=torch.float64)
    same = cd.step_metrics(torch, ref, ref.clone())
    assert same["max_abs"] == 0 and same["row_mean_abs"] == [0, 0, 0] and same["row_kl"] == [0, 0, 0]
    assert same["row_top1"] == [True, True, True]
    # A constant shift changes every logit by c and no probability.
    shifted = cd.step_metrics(torch, ref, ref + 0.25)
    assert shifted["max_abs"] == pytest.approx(0.25) and shifted["row_mean_abs"] == pytest.approx([0.25] * 3)
    assert shifted["row_kl"] == pytest.approx([0, 0, 0], abs=1e-15) and all(shifted["row_top1"])
    # Row 1's top token moved elsewhere; KL against a hand computation.
    out = ref.clone()
    top = int(ref[1].argmax())
    other = (top + 1) % 50
    out[1, other] = ref[1, top] + 1.0
    m = cd.step_metrics(torch, ref, out)
    assert m["row_top1"] == [True, False, True]
    p = torch.softmax(ref[1], -1)
    q = torch.softmax(out[1], -1)
    assert m["row_kl"][1] == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-12)
    assert m["row_kl"][0] == 0 and m["row_kl"][1] > 0
    assert m["max_abs"] == pytest.approx(float(ref[1, top] + 1.0 - ref[1, other]))
    # bf16 logits are compared as float64.
    assert cd.step_metrics(torch, ref, ref.to(torch.bfloat16))["max_abs"] > 0


def test_summaries_and_quantiles():
    assert cd.quantile([3.0, 1.0, 2.0], 0.5) == 2.0 and cd.quantile([1.0, 2.0], 0.25) == 1.25
    assert cd.quantile([5.0], 0.9) == 5.0
    steps = [{"max_abs": 1.0, "row_mean_abs": [0.1, 0.3], "row_kl": [1e-4, 3e-4], "row_top1": [True, False]},
             {"max_abs": 2.0, "row_mean_abs": [0.2, 0.2], "row_kl": [2e-4, 2e-4], "row_top1": [True, True]}]
    s = cd.summarize_path(steps)
    assert s["mean_abs"] == pytest.approx(0.2) and s["max_abs"] == 2.0 and s["mean_kl"] == pytest.approx(2e-4)
    assert s["max_kl"] == 3e-4 and s["top1"] == 3 and s["rows"] == 4
    assert s["mean_abs_p10_p50_p90"][1] == pytest.approx(0.2)


def summary(mean_abs, mean_kl):
    return {"mean_abs": mean_abs, "mean_kl": mean_kl}


def test_judge():
    r = cd.DEFAULT_RATIO
    base = {cd.PATH_BNB: summary(0.01, 1e-4)}
    ok = dict(base, **{n: summary(0.01 * r, 1e-4 * r) for n in cd.JUDGED})
    assert cd.judge(ok, r) == []
    better = dict(base, **{n: summary(0.005, 5e-5) for n in cd.JUDGED})
    assert cd.judge(better, r) == []
    for name in cd.JUDGED:
        worse_abs = dict(ok, **{name: summary(0.01 * r * 1.001, 1e-4)})
        (p,) = cd.judge(worse_abs, r)
        assert name in p and "mean |logit error|" in p
        worse_kl = dict(ok, **{name: summary(0.01, 1e-4 * r * 1.001)})
        (p,) = cd.judge(worse_kl, r)
        assert name in p and "mean KL" in p
        nan = dict(ok, **{name: summary(math.nan, 1e-4)})
        assert len(cd.judge(nan, r)) == 1
        missing = {k: v for k, v in ok.items() if k != name}
        assert cd.judge(missing, r) == [f"{name}: not run"]
    assert cd.judge({n: summary(0.01, 1e-4) for n in cd.JUDGED}, r)  # no bitsandbytes run to judge against


def have_model_stack():
    try:
        import bitsandbytes  # noqa: F401
        from transformers.cache_utils import StaticLayer
        return isinstance(StaticLayer(max_cache_len=1).cumulative_length, torch.Tensor)
    except Exception:  # noqa: BLE001 - any reason it cannot run is a reason to skip
        return False


SMALL = ["--device", "cpu", "--batches", "1,4", "--new-tokens", "12", "--graph-breaks", ""]


@pytest.mark.skipif(not have_model_stack(), reason="needs transformers 5.x and bitsandbytes")
def test_small_model_on_cpu(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert cd.main(SMALL + ["--json", str(out)]) == 0
    assert "RESULT: ok" in capsys.readouterr().out
    import json
    res = json.loads(out.read_text())
    for batch in ("1", "4"):
        paths = res["accuracy"][batch]["paths"]
        assert set(paths) == set(cd.PATHS)
        for name in cd.JUDGED:
            assert paths[name]["calls"] and paths[name]["summary"]["mean_abs"] > 0


@pytest.mark.skipif(not have_model_stack(), reason="needs transformers 5.x and bitsandbytes")
def test_planted_defect_fails(monkeypatch, capsys):
    import nf4_torch

    def bf16_partials(x, W, quant_state=None, bias=None, mode=None):
        # The product with its partial sums of 64 products rounded to bf16 and added in bf16.
        w = nf4_torch.dequantize(W, quant_state).float()
        xf = x.float()
        y = None
        for k in range(0, xf.shape[-1], 64):
            part = (xf[..., k:k + 64] @ w[:, k:k + 64].t()).to(torch.bfloat16)
            y = part if y is None else y + part
        return y.to(x.dtype) if bias is None else (y + bias).to(x.dtype)

    monkeypatch.setattr(nf4_torch, "linear_4bit", bf16_partials)
    assert cd.main(SMALL) == 1
    text = capsys.readouterr().out
    assert "PROBLEM: batch 1: nf4 linear_4bit" in text and "PROBLEM: batch 4: nf4 linear_4bit" in text
