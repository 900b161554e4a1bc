# SPDX-License-Identifier: MIT
"""bench_peers.py without a GPU: its arguments, statistics and tables, and a whole run on the CPU
against stand-in peers that have the released peers' call signatures (so the harness's calls, its
bit-for-bit comparison and its JSON are checked here; the timings only mean something on a GPU)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import SCRIPTS, load_script, run_script, write_packages

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(SCRIPTS, "bench_peers.py")

bench = load_script("bench_peers")


def test_arguments():
    p = bench.make_parser()
    a = p.parse_args(["--shapes", "1024x4096,8x16", "--dtypes", "fp16", "--modes", "a,workload"])
    assert a.shapes == [(1024, 4096), (8, 16)] and a.dtypes == ["fp16"] and a.modes == ["a", "workload"]
    assert p.parse_args([]).modes == list(bench.MODES)
    for bad in (["--shapes", "1024"], ["--shapes", "0x5"], ["--dtypes", "fp8"], ["--modes", "z"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_statistics_and_tables():
    s = bench.summarize([3.0, 1.0, 2.0, 10.0])
    assert s == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert bench.summarize([]) is None
    assert bench.fmt_cell(s) == "2.5 (1.0-10.0)" and bench.fmt_cell(None) == "-"
    assert bench.fmt_cell(bench.summarize([4.0])) == "4.0"
    t = bench.format_table("T", ["r1", "r2"], ["x", "y"], lambda r, c: f"{r}{c}")
    assert t.splitlines() == ["### T", "", "| | x | y |", "|---|---|---|", "| r1 | r1x | r1y |", "| r2 | r2x | r2y |"]
    # docs/DESIGN.md section 4: ~2.52 bytes per element for fp16 output at blocksize 64 / 256.
    assert abs(bench.bytes_per_element(torch.float16) - 2.5158) < 1e-3
    assert bench.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_missing_peers_are_notes():
    assert bench.load_peers(None)["bnb"] is None
    p = bench.load_peers("/nonexistent/peers")
    assert p["bnb"] is None and p["unsloth"] is None and "not a folder" in p["notes"]["peers"]


# Stand-ins with the released call signatures: bitsandbytes.functional.dequantize_4bit(A, quant_state,
# absmax=None, out=None, ...) and QuantState(absmax, shape, code, blocksize, quant_type, dtype, offset,
# state2); unsloth_kernels.nf4.dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize,
# blocksize2, shape, dtype, out=None) and dequantize_nf4_planned(same up to blocksize2, out) -> rerun.
# They compute with nf4_torch's plain-PyTorch reference and check the argument kinds, so a call with
# arguments in the wrong places fails. FAKE_PEERS_CORRUPT=1 makes them flip one output bit.
FAKE_BNB = '''
import os
import torch
from nf4_torch import reference_dequantize

class QuantState:
    def __init__(self, absmax, shape=None, code=None, blocksize=None, quant_type=None, dtype=None, offset=None,
                 state2=None):
        self.absmax, self.shape, self.code, self.blocksize = absmax, shape, code, blocksize
        self.quant_type, self.dtype, self.offset, self.state2 = quant_type, dtype, offset, state2
        self.nested = state2 is not None

def dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
    q, s2 = quant_state, quant_state.state2
    assert A.dtype == torch.uint8 and q.absmax.dtype == torch.uint8 and s2.code.numel() == 256
    r = reference_dequantize(A, q.absmax, q.code, s2.absmax, s2.code, q.offset, q.blocksize, s2.blocksize,
                             list(q.shape), q.dtype, q.quant_type)
    if os.environ.get("FAKE_PEERS_CORRUPT"):
        r.view(-1)[0] = -r.view(-1)[0] if r.view(-1)[0] != 0 else 1
    if out is not None:
        out.copy_(r)
        return out
    return r
'''
FAKE_UNSLOTH = '''
import math
import torch
from nf4_torch import reference_dequantize

def _check(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2):
    assert W.dtype == torch.uint8 and absmax.dtype == torch.uint8
    assert code2.numel() == 256 and absmax2.dtype == torch.float32 and offset.dim() == 0 and code.numel() == 16
    assert isinstance(blocksize, int) and isinstance(blocksize2, int)

def dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=None):
    _check(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2)
    r = reference_dequantize(W, absmax, code, absmax2, code2, offset, blocksize, blocksize2, list(shape), dtype)
    if out is None:
        return r
    assert out.dtype == dtype and out.numel() == math.prod(shape)
    out.copy_(r)
    return out

def dequantize_nf4_planned(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, out):
    dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, list(out.shape), out.dtype, out)

    def rerun(o):
        dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, list(o.shape), o.dtype, o)
        return True
    return rerun
'''


def fake_peers(root):
    return write_packages(root, {"bitsandbytes": {"__init__.py": "__version__ = 'stand-in'\n", "functional.py": FAKE_BNB},
                                "unsloth_kernels": {"__init__.py": "", "nf4.py": FAKE_UNSLOTH}})


def run_bench(tmp_path, *extra, env=None):
    out = tmp_path / "peers.json"
    cmd = [BENCH, "--device", "cpu", "--small", "--peers", str(fake_peers(tmp_path / "peers")),
           "--json", str(out), "--modes", "check,a,cpu,workload,b", "--repeats", "2", "--iters", "2", "--rounds", "2",
           "--batch", "3", *extra]
    p = run_script(cmd, tmp_path, env)
    return p, out


def test_cpu_run_against_stand_in_peers(tmp_path):
    p, out = run_bench(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    methods = {"nf4 op", "nf4 fast", "nf4 fast global", "bnb", "unsloth default", "unsloth planned"}
    assert len(r["bits_differing"]) == 5  # two shapes x two dtypes, and the workload
    for key, bits in r["bits_differing"].items():
        if key != "workload":
            assert set(bits) == methods, (key, bits)
        assert not any(bits.values()), (key, bits)
    assert set(r["workload"]["seconds"]) == {"nf4", "nf4 global", "unsloth default", "unsloth planned", "bitsandbytes"}
    for key, cells in r["a"].items():
        assert set(cells) == methods and all(c["n"] == 2 for c in cells.values())
    assert r["cpu"] and not r["b"] and "needs a CUDA device" in r["notes"]["mode b"]
    assert "### (a) per call" in p.stdout and "Unsloth test_dequantize workload" in p.stdout


def test_hint_rows_and_workload_ratios(tmp_path):
    # On the CPU the forced configuration changes nothing; the rows, their bits and the per-repeat
    # ratios of the workload are what is checked. Mode e needs a GPU: a note.
    p, out = run_bench(tmp_path, "--modes", "check,workload,e", "--nf4-hints", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert all("nf4 fast h5" in bits and not any(bits.values()) for k, bits in r["bits_differing"].items() if k != "workload")
    assert "nf4 h5" in r["workload"]["seconds"] and "needs a CUDA device" in r["notes"]["mode e"]
    ratios = r["workload"]["unsloth_planned_over_row_per_repeat"]
    assert set(ratios) == {"nf4", "nf4 global", "nf4 h5"} and all(len(v) == 2 for v in ratios.values())
    assert "unsloth planned / nf4, repeat by repeat" in p.stdout
    # --rounds 2 cut into at most 2 slices (the default asks for 10): both ran, row after row.
    assert r["workload"]["slices"] == 2 and "in 2 slices a repeat" in p.stdout


def test_a_differing_peer_fails_the_run(tmp_path):
    p, out = run_bench(tmp_path, "--modes", "check", env={"FAKE_PEERS_CORRUPT": "1"})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "outputs differ" in p.stderr
    r = json.loads(out.read_text())
    assert all(v["bnb"] > 0 for v in r["bits_differing"].values())


def test_help_and_no_gpu():
    p = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True, cwd=HERE)
    assert p.returncode == 0 and "--peers" in p.stdout
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, BENCH, "--modes", "a"], capture_output=True, text=True, cwd=HERE)
        assert p.returncode == 2 and "no CUDA device" in p.stderr
