# SPDX-License-Identifier: MIT
"""pytest setup. nf4_torch is the installed package (pip install --no-build-isolation ./bindings/torch):
run pytest from any directory but bindings/torch, whose nf4_torch/ is the source tree without the
compiled extension."""
import importlib.util
import os
import subprocess
import sys
import textwrap

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


# ---- the lab's PyTorch scripts (lab/torch: bench_peers.py, bench_gemv_peers.py, check_decode.py) ----

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "lab", "torch")


def load_script(name):
    """lab/torch/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_packages(root, packages):
    """Writes {package: {file name: text}} under root (each text dedented): stand-in peers."""
    for pkg, files in packages.items():
        os.makedirs(os.path.join(root, pkg))
        for name, text in files.items():
            with open(os.path.join(root, pkg, name), "w") as f:
                f.write(textwrap.dedent(text))
    return root


def run_script(cmd, cwd, env=None):
    """Runs [sys.executable, *cmd] in cwd, which must not be bindings/torch, so that the installed
    nf4_torch is imported and not the source tree."""
    return subprocess.run([sys.executable, *cmd], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
