# SPDX-License-Identifier: MIT
"""pytest setup. nf4_torch is the installed package (pip install --no-build-isolation ./bindings/torch):
run pytest from any directory but bindings/torch, whose nf4_torch/ is the source tree without the
compiled extension."""
import os

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
GOLDEN = os.path.join(REPO, "tests", "data", "golden.safetensors")
GOLDEN_INDEX = os.path.join(REPO, "tests", "data", "golden_index.json")

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

# The devices every cross-check runs on: the CPU key (the oracle) everywhere, CUDA where present.
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
