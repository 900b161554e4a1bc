# SPDX-License-Identifier: MIT
"""bench_gemv_peers.py without a GPU: its arguments, sizes and error measures, and a whole run on the
CPU against stand-in peers with the released peers' call signatures (so the harness's calls, its
error and batch-invariance checks, its tables and its JSON are checked here; the timings only mean
something on a GPU)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import SCRIPTS, load_script, run_script, write_packages

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(SCRIPTS, "bench_gemv_peers.py")

bench = load_script("bench_gemv_peers")


def test_arguments():
    p = bench.make_parser()
    a = p.parse_args(["--shapes", "14336x4096,8x16", "--m", "8,1,256,4,1", "--iters", "3", "--repeats", "2"])
    assert a.shapes == [(14336, 4096), (8, 16)] and a.m == [1, 4, 8, 256] and a.iters == 3 and a.repeats == 2
    d = p.parse_args([])
    assert d.m == [1, 2, 4, 8, 16, 32, 64, 128, 256] and d.shapes is None and d.device == "cuda"
    assert d.mm_size == 8192
    for bad in (["--shapes", "1024"], ["--shapes", "0x5"], ["--m", "0"], ["--m", "257"], ["--m", "a"],
                ["--iters", "0"], ["--mm-size", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_sizes_and_bounds():
    # 4096 x 4096: 8 MiB of codes, 262144 uint8 absmax, 1024 fp32 nested absmax, tables.
    assert bench.weight_bytes(4096, 4096) == 8388608 + 262144 + 4096 + 4 * 273
    assert bench.floor_bytes(4096, 4096, 8) == bench.weight_bytes(4096, 4096) + 2 * 8 * 8192
    # The floor in docs/PERFORMANCE_LOG.md at 4096 x 4096: 2.9 us for an H100 copy ceiling of 2.99 TB/s.
    assert abs(bench.floor_bytes(4096, 4096, 1) / 2.99e12 * 1e6 - 2.9) < 0.05
    # d = log2(bit_ceil(K)): K = 4096 -> 12 levels, K = 4097 -> 13.
    assert bench.gemv_error_bound_factor(4096) == pytest.approx(13 * 2.0 ** -24, rel=1e-6)
    assert bench.gemv_error_bound_factor(4097) == pytest.approx(14 * 2.0 ** -24, rel=1e-6)
    assert bench.gemv_error_bound_factor(1) == pytest.approx(2.0 ** -24, rel=1e-6)
    ref = torch.tensor([[4.0, -2.0]], dtype=torch.float64)
    assert bench.rel_max_error(torch.tensor([[4.0, -1.5]]), ref) == pytest.approx(0.125)
    assert bench.rel_max_error(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.float64)) == 0
    # The fast contract's bound (tests/support/gemv_fast.h): k 2^-22 sum|w x| + half an ulp.
    acc = 4096 * 2.0 ** -22 * 10.0
    assert bench.fast_bound(4096, -3.0, 10.0, 8) == pytest.approx(acc + (3.0 + acc) * 2.0 ** -8)
    assert bench.fast_bound(4096, 3.0, 10.0, 24) < bench.fast_bound(4096, 3.0, 10.0, 8)
    # The floor: memory-bound at one row, compute-bound at 256 rows of a 14336x4096 weight on an
    # H100 (3 TB/s copies, 800 TFLOP/s bf16 matmul).
    res = {"copy_ceiling_Bps": 3e12, "matmul_ceiling_flops": 800e12}
    assert bench.floor_us(14336, 4096, 1, res) == pytest.approx(bench.floor_bytes(14336, 4096, 1) / 3e12 * 1e6)
    assert bench.floor_us(14336, 4096, 256, res) == pytest.approx(2 * 256 * 14336 * 4096 / 800e12 * 1e6)


def test_missing_peers_are_notes():
    assert bench.load_peers(None)["bnb"] is None
    p = bench.load_peers("/nonexistent/peers")
    assert p["bnb"] is None and p["unsloth"] is None and "not a folder" in p["notes"]["peers"]


# Stand-ins with the released call signatures: unsloth_kernels.nf4_gemv.gemv_nf4(X, W_u8, absmax, code2,
# absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=None) -> [1, 1, N] and
# gemv_nf4_rows(X [M, 1, K], same up to shape, out [M, 1, N]); bitsandbytes.functional.gemv_4bit(A, B,
# out=None, transposed_A=False, transposed_B=False, state=None) (one row) and
# bitsandbytes.matmul_4bit(A, B, quant_state, out=None, bias=None). They compute in fp32 from nf4_torch's
# plain-PyTorch dequantization and check the argument kinds, so a call with arguments in the wrong
# places fails. FAKE_PEERS_FAIL=1 makes Unsloth's raise.
FAKE_COMMON = '''
import os
import torch
from nf4_torch import reference_dequantize

def product(X, W, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape, invariant=True):
    # invariant=False: a batch of rows is multiplied with the weights rounded to bf16, a row alone
    # with the fp32 weights, as a library whose algorithm changes with the batch.
    if os.environ.get("FAKE_PEERS_FAIL"):
        raise RuntimeError("stand-in told to fail")
    w = reference_dequantize(W, absmax, code, absmax2, code2, offset, blocksize, blocksize2, list(shape),
                             torch.float32)
    rows = X.reshape(-1, X.shape[-1]).float()
    if not invariant and rows.shape[0] > 1:
        return (rows @ w.to(torch.bfloat16).float().t()).to(X.dtype)
    return torch.cat([r[None] @ w.t() for r in rows]).to(X.dtype)
'''
FAKE_UNSLOTH = FAKE_COMMON + '''
GEMV_MAX_ROWS = 4

def _check(X, W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape):
    assert X.dim() == 3 and X.shape[1] == 1 and X.shape[2] == shape[1] and X.is_contiguous()
    assert W.dtype == torch.uint8 and absmax.dtype == torch.uint8
    assert code2.numel() == 256 and absmax2.dtype == torch.float32 and offset.dim() == 0 and code.numel() == 16
    assert isinstance(blocksize, int) and isinstance(blocksize2, int)

def gemv_nf4(X, W_u8, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=None):
    _check(X, W_u8, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape)
    assert X.shape[0] == 1 and dtype == X.dtype
    r = product(X, W_u8, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape).view(1, 1, -1)
    if out is None:
        return r
    out.copy_(r)
    return out

def gemv_nf4_rows(X, W_u8, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, out):
    _check(X, W_u8, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape)
    assert out.shape == (X.shape[0], 1, shape[0])
    out.copy_(product(X, W_u8, absmax, code, absmax2, code2, offset, blocksize, blocksize2, shape).view(out.shape))
    return out
'''
FAKE_BNB_FUNCTIONAL = FAKE_COMMON + '''
class QuantState:
    def __init__(self, absmax, shape=None, code=None, blocksize=None, quant_type=None, dtype=None, offset=None,
                 state2=None):
        self.absmax, self.shape, self.code, self.blocksize = absmax, shape, code, blocksize
        self.quant_type, self.dtype, self.offset, self.state2 = quant_type, dtype, offset, state2
        self.nested = state2 is not None

def _product(A, B, q, invariant=True):
    s2 = q.state2
    assert B.dtype == torch.uint8 and q.absmax.dtype == torch.uint8 and s2.code.numel() == 256
    assert A.shape[-1] == q.shape[1]
    return product(A, B, q.absmax, q.code, s2.absmax, s2.code, q.offset, q.blocksize, s2.blocksize, q.shape,
                   invariant)

def gemv_4bit(A, B, out=None, transposed_A=False, transposed_B=False, state=None):
    assert A.numel() == A.shape[-1], "gemv_4bit takes one row"
    r = _product(A, B, state).view(*A.shape[:-1], -1)
    if out is None:
        return r
    out.copy_(r)
    return out
'''
FAKE_BNB_INIT = '''
__version__ = "stand-in"
from . import functional

def matmul_4bit(A, B, quant_state, out=None, bias=None):
    r = functional._product(A, B, quant_state, invariant=False).view(*A.shape[:-1], -1)
    return r if bias is None else r + bias
'''
# unsloth_kernels.nf4.dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape,
# dtype, out=None): the dequantize half of Unsloth's dispatch.
FAKE_UNSLOTH_NF4 = '''
import torch
from nf4_torch import reference_dequantize

def dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=None):
    assert W.dtype == torch.uint8 and code2.numel() == 256 and code.numel() == 16 and offset.dim() == 0
    w = reference_dequantize(W, absmax, code, absmax2, code2, offset, blocksize, blocksize2, list(shape), dtype)
    if out is None:
        return w
    out.copy_(w)
    return out
'''


def fake_peers(root):
    return write_packages(root, {"bitsandbytes": {"__init__.py": FAKE_BNB_INIT, "functional.py": FAKE_BNB_FUNCTIONAL},
                                "unsloth_kernels": {"__init__.py": "", "nf4_gemv.py": FAKE_UNSLOTH,
                                                    "nf4.py": FAKE_UNSLOTH_NF4}})


def run_bench(tmp_path, *extra, env=None):
    out = tmp_path / "gemv.json"
    cmd = [BENCH, "--device", "cpu", "--small", "--peers", str(fake_peers(tmp_path / "peers")),
           "--json", str(out), "--repeats", "2", "--iters", "2", *extra]
    p = run_script(cmd, tmp_path, env)
    return p, out


def test_cpu_run_against_stand_in_peers(tmp_path):
    p, out = run_bench(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert not r["failures"]
    assert set(r["runs"]) == {f"{s} m={m}" for s in ("64x256", "96x512") for m in bench.MS}
    assert r["matmul_ceiling_flops"] > 0 and r["matmul"]["size"] == 256
    for key, run in r["runs"].items():
        m = run["m"]
        timed = set(run["times_us"])
        if m == 1:
            assert timed == set(bench.METHODS), key
        else:
            assert timed == set(bench.METHODS) - {"bnb gemv_4bit"}, key
            assert run["unavailable"]["bnb gemv_4bit"] == "m = 1 only"
        # nf4's two modes and the row-by-row stand-ins give every row as alone; the stand-in of
        # matmul_4bit rounds the weights for a batch, and so does Unsloth's dispatch above its 4
        # kernel rows (bf16 dequantize + matmul): both show in row 0 already.
        inv, row0 = run["rows_differing_from_alone"], run["row0_batch_invariant"]
        for name in ("nf4 exact", "nf4 fast", "unsloth gemv_nf4"):
            assert inv[name] == 0 and row0[name] is True, (key, name)
        for name, invariant_to in (("bnb matmul_4bit", 1), ("unsloth dispatch", 4)):
            assert row0[name] is (m <= invariant_to), (key, name)
            assert (inv[name] > 0) is (m > invariant_to), (key, name)
        assert all(s["n"] == 2 and s["pct_of_floor"] > 0 for s in run["times_us"].values())
        assert run["floor_us"] >= run["floor_bytes"] / r["copy_ceiling_Bps"] * 1e6 * (1 - 1e-9)
        errs = run["rel_error_bf16"]
        assert errs["nf4 exact"] <= bench.BF16_REL_BOUND
        # The fp32 output: nf4 exact's summation error, far below the bf16 rounding; nf4 fast's,
        # about that of rounding the weights to bf16.
        assert run["rel_error_fp32"]["nf4 exact"] < 1e-5
        assert 1e-5 < run["rel_error_fp32"]["nf4 fast"] < 2.0 ** -7
        assert "dense bf16" not in run["rel_error_fp32"]
    for title in ("### m = 1: CPU wall clock", "### m = 8", "### m = 256", "fast vs dense bf16",
                  "relative max error against float64, bf16 output", "fp32 output",
                  "batch invariance: row 0 of the m-row call equals row 0 computed alone",
                  "batch invariance, every row", "elements whose bits differ"):
        assert title in p.stdout, title


def test_a_failing_peer_is_a_note_and_nf4_goes_on(tmp_path):
    p, out = run_bench(tmp_path, "--m", "1", env={"FAKE_PEERS_FAIL": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    for run in r["runs"].values():
        assert {"nf4 exact", "nf4 fast"} <= set(run["times_us"])
        assert run["unavailable"]["unsloth gemv_nf4"] == run["unavailable"]["unsloth dispatch"] == "failed"
    assert any("stand-in told to fail" in v for v in r["notes"].values())


def test_without_peers(tmp_path):
    p = subprocess.run([sys.executable, BENCH, "--device", "cpu", "--shapes", "8x64", "--m", "1,2",
                        "--repeats", "1", "--iters", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| 8x64 m=2 |" in p.stdout and "| not loaded |" in p.stdout and "peers left out" in p.stdout


def test_help_and_no_gpu():
    p = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True, cwd=HERE)
    assert p.returncode == 0 and "--peers" in p.stdout
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, BENCH], capture_output=True, text=True, cwd=HERE)
        assert p.returncode == 2 and "no CUDA device" in p.stderr
