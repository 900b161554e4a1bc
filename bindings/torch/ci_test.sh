#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI for the PyTorch package, CPU only: in a fresh virtual environment (its pip upgraded first:
# a distribution's venv pip, such as Debian 12's 23.0, is too old for `pip wheel -C`), torch from
# PyPI, then
#   pip wheel ./bindings/torch   (pip's default build isolation; CPU-only build: NF4_TORCH_CUDA=OFF)
#   pip install the wheel, import it from outside the source tree, check it needs no libfmt
#   pytest bindings/torch/tests (CUDA tests skip), whose summary line ends the output
# and exits non-zero when any step or test fails. Called by tools/test.sh; runs alone as well.
#
# torch: PyPI's Linux wheel is a CUDA build whose dependencies (nvidia-* and cuda-* packages,
# triton) are several GB. It is installed with --no-deps, plus its small pure-Python
# dependencies, plus only the CUDA libraries that its shared libraries link and that the machine
# does not have, or has in a release older than torch's (symbols missing): with the CUDA toolkit
# in the library path (e.g. /usr/local/cuda) these are libcufile, libcusparseLt, libnvshmem and,
# for a torch newer than the toolkit, NCCL; on a machine without it, all of them.
# CPU operations and torch.compile's CPU backend then work as with a full install.
#
# Variables (defaults):
#   NF4_PYTHON=python3                      the Python to make the virtual environment with
#   NF4_CI_TORCH=newest                     the torch version: newest (the newest release on PyPI
#                                           for this Python, as `pip install torch` gives it),
#                                           oldest (2.11.0, the oldest the package supports,
#                                           also the release of docs/PERFORMANCE.md) or X.Y.Z
#   NF4_CI_DIR=<repo>/build-torch-ci        work folder (venv, wheel), removed and made anew
#   NF4_CI_WHEELS=~/.cache/nf4/ci-wheels    the torch wheel, downloaded once and kept here
#   NF4_JOBS=2                              parallel compile jobs
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=${NF4_PYTHON:-python3}
TORCH_OLDEST=2.11.0  # README.md's supported range starts here
TORCH_VERSION=${NF4_CI_TORCH:-newest}
work=${NF4_CI_DIR:-$root/build-torch-ci}
wheels=${NF4_CI_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/nf4/ci-wheels}
jobs=${NF4_JOBS:-2}
step() { echo "== torch package: $* ($(date +%T))"; }
export PIP_DISABLE_PIP_VERSION_CHECK=1
source "$root/tools/build-env.sh"  # ccache for the extension's and nf4's compiles

step "fresh virtual environment in $work ($("$PY" --version 2>&1))"
rm -rf "$work"
mkdir -p "$work" "$wheels"
"$PY" -m venv "$work/venv"
vpy=$work/venv/bin/python
"$vpy" -m pip install -q -U pip
"$vpy" -m pip --version

case "$TORCH_VERSION" in
  oldest) TORCH_VERSION=$TORCH_OLDEST ;;
  newest)
    # What `pip install torch` would install, resolved without downloading the wheel.
    "$vpy" -m pip install -q --dry-run --no-deps --only-binary=:all: --ignore-installed \
      --report "$work/torch-newest.json" torch
    TORCH_VERSION=$("$vpy" -c 'import json, sys; print(json.load(open(sys.argv[1]))["install"][0]["metadata"]["version"])' \
      "$work/torch-newest.json")
    echo "the newest torch on PyPI for this Python: $TORCH_VERSION" ;;
  [0-9]*) ;;
  *) echo "NF4_CI_TORCH: newest, oldest or a version (got '$TORCH_VERSION')" >&2; exit 2 ;;
esac

step "torch $TORCH_VERSION from PyPI, without its CUDA dependencies"
"$vpy" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "torch==$TORCH_VERSION"
"$vpy" -m pip install -q --no-deps --no-index --find-links "$wheels" "torch==$TORCH_VERSION"
# torch's own requirements, split: pure-Python ones installed now, the CUDA ones only where a
# shared library of torch needs one that is not found (ldd).
"$vpy" - "$work/requirements-cpu.txt" "$work/requirements-cuda.txt" <<'EOF'
import glob, os, re, subprocess, sys
from importlib import metadata
import sysconfig

cpu, cuda = [], []
for req in metadata.requires("torch") or []:
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    name = re.split(r"[\[<>=!~ ]", spec.strip(), maxsplit=1)[0].lower()
    (cuda if name.startswith(("nvidia-", "cuda-", "triton")) else cpu).append(spec.strip())

# Which of the CUDA requirements provide a library that `import torch` loads (torch._C and what it
# links, and libtorch_global_deps) and that the loader cannot find. (Libraries torch opens only
# on demand, such as the NVRTC wrapper that needs the driver's libcuda, are not loaded here.)
torch_dir = os.path.join(sysconfig.get_paths()["purelib"], "torch")
# A library the machine has but in an older release than torch's (a CUDA toolkit's NCCL or cuDNN
# in the loader's cache) counts as missing too: ldd -r names the symbols it lacks, and the
# package's copy, on torch's RPATH, is then loaded before it.
symbol_sonames = [("nccl", "libnccl.so"), ("cudnn", "libcudnn.so"),
                  ("cublasLt", "libcublasLt.so"), ("cublas", "libcublas.so"), ("cusparseLt", "libcusparseLt.so"),
                  ("cusparse", "libcusparse.so"), ("cufft", "libcufft.so"), ("curand", "libcurand.so"),
                  ("cusolver", "libcusolver.so"), ("nvshmem", "libnvshmem.so"), ("cuFile", "libcufile.so"),
                  ("nvrtc", "libnvrtc.so"), ("nvJitLink", "libnvJitLink.so"), ("cupti", "libcupti.so")]
missing = set()
for so in glob.glob(os.path.join(torch_dir, "_C*.so")) + glob.glob(os.path.join(torch_dir, "lib", "libtorch_global_deps.so")):
    out = subprocess.run(["ldd", "-r", so], capture_output=True, text=True)
    for line in (out.stdout + out.stderr).splitlines():
        if "not found" in line and "=>" in line:
            missing.add(line.split()[0])
        elif line.startswith("undefined symbol: "):
            symbol = line.split()[2]
            for prefix, soname in symbol_sonames:
                if symbol.startswith(prefix):
                    missing.add(soname)
                    break
# soname prefix -> (requirement name prefix, extra of cuda-toolkit or None)
providers = [
    ("libcufile", "cuda-toolkit", "cufile"), ("libcudart", "cuda-toolkit", "cudart"),
    ("libcublasLt", "cuda-toolkit", "cublas"), ("libcublas", "cuda-toolkit", "cublas"), ("libcufft", "cuda-toolkit", "cufft"),
    ("libcurand", "cuda-toolkit", "curand"), ("libcusolver", "cuda-toolkit", "cusolver"),
    ("libcusparseLt", "nvidia-cusparselt", None), ("libcusparse", "cuda-toolkit", "cusparse"),
    ("libnvJitLink", "cuda-toolkit", "nvjitlink"), ("libnvrtc", "cuda-toolkit", "nvrtc"),
    ("libcupti", "cuda-toolkit", "cupti"), ("libnvToolsExt", "cuda-toolkit", "nvtx"),
    ("libnvtx", "cuda-toolkit", "nvtx"), ("libcudnn", "nvidia-cudnn", None), ("libnccl", "nvidia-nccl", None),
    ("libnvshmem", "nvidia-nvshmem", None),
]
wanted = []
for soname in sorted(missing):
    for prefix, req_name, extra in providers:
        if re.match(re.escape(prefix) + r"[._-]", soname):
            for spec in cuda:
                if spec.lower().startswith(req_name):
                    if extra:  # cuda-toolkit[a,b,c]==V -> cuda-toolkit[extra]==V
                        spec = re.sub(r"\[[^\]]*\]", f"[{extra}]", spec)
                    wanted.append(spec)
                    break
            else:
                sys.exit(f"torch links {soname}, which none of its requirements provides: {cuda}")
            break
    else:
        sys.exit(f"torch links {soname}, which is not found and not known here: install torch with its dependencies")
print("missing CUDA libraries:", " ".join(sorted(missing)) or "none")
open(sys.argv[1], "w").write("\n".join(cpu) + "\n")
open(sys.argv[2], "w").write("\n".join(dict.fromkeys(wanted)) + "\n")
EOF
# pip notes that torch's CUDA requirements are not installed: left out on purpose, not shown.
pip_quiet() {
  "$vpy" -m pip install -q "$@" 2>&1 | { grep -v -E "dependency resolver does not currently|^torch .* requires .*which is not installed" || true; }
}
pip_quiet -r "$work/requirements-cpu.txt" numpy  # numpy: torch warns at import without it
if grep -q . "$work/requirements-cuda.txt"; then
  echo "installing: $(tr '\n' ' ' <"$work/requirements-cuda.txt")"
  pip_quiet -r "$work/requirements-cuda.txt"
fi
(cd "$work" && "$vpy" -c 'import torch; x = torch.arange(12.0).view(3, 4); assert float((x @ x.t()).sum()) == 1134.0; print("torch", torch.__version__, "imports and runs CPU ops")')

step "test dependencies"
pip_quiet pytest safetensors

step "pip wheel ./bindings/torch (CPU only)"
# Isolated, as users build it: pip fetches scikit-build-core into a temporary environment, and the
# build still finds this environment's torch.
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$vpy" -m pip wheel -q --no-deps \
  -C cmake.define.NF4_TORCH_CUDA=OFF -C build-dir="$work/build" -w "$work/dist" "$root/bindings/torch"
ls "$work"/dist/
pip_quiet --no-deps "$work"/dist/nf4_torch-*.whl
ext=$(ls "$work"/venv/lib/python*/site-packages/nf4_torch/_C*.so)
if readelf -d "$ext" | grep -q 'NEEDED.*libfmt'; then
  echo "FAIL: $ext needs libfmt at run time (fmt must be compiled in header-only)"
  exit 1
fi
(cd "$work" && "$vpy" -c 'import nf4_torch, torch; assert not nf4_torch._C.have_cuda(); print("nf4_torch", nf4_torch.__version__, "nf4", nf4_torch.nf4_version(), "CPU-only build")')

step "pytest bindings/torch/tests"
# From the work folder: bindings/torch/nf4_torch is the source tree, the installed package is tested.
# A test still running after 300 s prints every thread's Python stack; the run stops after
# ${NF4_PYTEST_TIMEOUT_S:-1800} s, so a hang fails the job instead of stalling it.
cd "$work"
exec timeout -k 30 "${NF4_PYTEST_TIMEOUT_S:-1800}" "$vpy" -m pytest -p no:cacheprovider -q -rs \
  -o faulthandler_timeout=300 "$root/bindings/torch/tests"
