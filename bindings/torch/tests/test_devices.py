# SPDX-License-Identifier: MIT
"""Tensors on another GPU than the current one (cuda:1 with the current device cuda:0): every entry
point runs on the tensors' own GPU, through the nf4 context made on that GPU
(nf4_context_create_on_device), gives the CPU oracle's bits, allocates nothing on the current GPU
and leaves the current device as it was. Then both GPUs at once, each from its own thread.
Skipped where fewer than two CUDA devices exist."""
import threading

import pytest
import torch

import nf4_torch
from nf4_torch.testing import bits, make_weight

from conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA devices")

SHAPE = [512, 1024]


def weight(device, seed, dtype=torch.bfloat16):
    W, qs = make_weight(SHAPE, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return W.to(device), qs.to(device)


def same_bits(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
    differ = int((bits(got).cpu() != bits(want).cpu()).sum())
    assert differ == 0, f"{what}: {differ} elements differ from the oracle"


def args(qs):
    return tuple(nf4_torch.unpack_quant_state(qs))


def test_every_entry_point_on_the_second_gpu_while_the_first_is_current():
    W1, qs1 = weight("cuda:1", 1)
    Wc, qsc = W1.cpu(), qs1.to("cpu")
    x1 = torch.randn(4, SHAPE[1], generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to("cuda:1")
    want_dense = nf4_torch.dequantize(Wc, qsc)
    want_gemv = nf4_torch.gemv(x1.cpu(), Wc, qsc, mode="exact")
    with torch.cuda.device(0):
        torch.cuda.synchronize(0)
        before = torch.cuda.memory_allocated(0)
        got = {
            "the operator": torch.ops.nf4.dequantize(W1, *args(qs1)),
            "nf4_torch.dequantize (prepares)": nf4_torch.dequantize(W1, qs1),
            "nf4_torch.dequantize (prepared launch)": nf4_torch.dequantize(W1, qs1),
            "nf4_torch.fast_dequantize": nf4_torch.fast_dequantize(W1, qs1),
        }
        y = nf4_torch.gemv(x1, W1, qs1, mode="exact")
        mode = nf4_torch.gemv_mode_used(torch.device("cuda:1"), torch.bfloat16, "fast")
        y_fast = nf4_torch.gemv(x1, W1, qs1, mode="fast")
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0, "a call changed the current device"
        assert torch.cuda.memory_allocated(0) == before, "a call allocated on cuda:0"
    for what, t in got.items():
        assert t.device == torch.device("cuda:1"), what
        same_bits(t.reshape(want_dense.shape), want_dense, what)
    assert y.device == torch.device("cuda:1") and y_fast.device == torch.device("cuda:1")
    same_bits(y, want_gemv, "nf4_torch.gemv (exact)")
    # The fast contract's bits are fixed per GPU model: cuda:0 gives the same ones where both GPUs
    # are one model (the machines this runs on).
    if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):
        W0, qs0 = W1.to("cuda:0"), qs1.to("cuda:0")
        with torch.cuda.device(1):
            same_bits(y_fast, nf4_torch.gemv(x1.to("cuda:0"), W0, qs0, mode="fast").to("cuda:1"), f"gemv ({mode}) cuda:1 vs cuda:0")


def test_both_gpus_at_once_each_from_its_own_thread():
    cases = []
    for d in (0, 1):
        W, qs = weight(f"cuda:{d}", 10 + d)
        x = torch.randn(8, SHAPE[1], generator=torch.Generator().manual_seed(20 + d)).to(torch.bfloat16).to(f"cuda:{d}")
        cases.append((d, W, qs, x, nf4_torch.dequantize(W.cpu(), qs.to("cpu")), nf4_torch.gemv(x.cpu(), W.cpu(), qs.to("cpu"), mode="exact")))
    failures = []

    def work(d, W, qs, x, want_dense, want_gemv):
        try:
            # The other GPU is this thread's current device: every call must still run on d.
            with torch.cuda.device(1 - d):
                for _ in range(30):
                    dense = nf4_torch.dequantize(W, qs)
                    y = nf4_torch.gemv(x, W, qs, mode="exact")
                torch.cuda.synchronize(d)
                if torch.cuda.current_device() != 1 - d:
                    failures.append(f"cuda:{d}: the current device changed")
            if int((bits(dense).cpu() != bits(want_dense).cpu()).sum()) or int((bits(y).cpu() != bits(want_gemv).cpu()).sum()):
                failures.append(f"cuda:{d}: results differ from the oracle")
        except Exception as e:  # reported on the test's thread
            failures.append(f"cuda:{d}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
