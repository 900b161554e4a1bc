# SPDX-License-Identifier: MIT
"""pytest setup: import nf4_torch from this checkout (built in place by setup.py build_ext)."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
GOLDEN = os.path.join(REPO, "tests", "data", "golden.safetensors")
GOLDEN_INDEX = os.path.join(REPO, "tests", "data", "golden_index.json")

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

# The devices every cross-check runs on: the CPU key (the oracle) everywhere, CUDA where present.
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
