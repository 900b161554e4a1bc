#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# lab/fetch_peers.sh: fetches the released implementations nf4 is measured against (the "peers")
# into one folder, on a machine with network access to PyPI:
#
#   bitsandbytes 0.50.2   its manylinux x86_64 wheel for CPython 3.12, of which only the package's
#                         Python files and its CUDA 13.0 library (libbitsandbytes_cuda130.so) are kept
#   unsloth 2026.10.9     of its wheel, only the three files of its NF4 kernels: unsloth/kernels/nf4.py,
#                         nf4_gemv.py and triton_launch.py, kept as a package of their own
#
#   lab/fetch_peers.sh [DIR]      (DIR defaults to .peers, which .gitignore ignores)
#
# Never commit what it writes: these are other projects' released files, fetched for measurement.
#
# The folder it writes (DIR is emptied of these three names first):
#   DIR/bitsandbytes/        the bitsandbytes package: its .py files, libbitsandbytes_cuda130.so
#   DIR/unsloth_kernels/     __init__.py (empty), nf4.py, nf4_gemv.py, triton_launch.py
#   DIR/unsloth_zoo/         __init__.py (empty) and utils.py, a stand-in holding the one name the
#                            kernels import from Unsloth's companion package:
#                            `from packaging.version import Version`
#
# How the folder is used:
#   - lab/torch/bench_peers.py and bench_gemv_peers.py (--peers DIR) put DIR first on sys.path,
#     then `import bitsandbytes` and `from unsloth_kernels import nf4` (nf4_gemv for the product);
#     a peer that does not import is left out, with the reason printed.
#   - lab/gpu_torch_bench.sh (NF4_PEERS, default .peers) passes the folder to those benchmarks
#     and puts it on PYTHONPATH for the tests and the decode check.
#   - lab/gpu_check.sh (NF4_PEERS, default .peers) takes libbitsandbytes_cuda*.so from it for
#     `nf4_lab bench --peer-bnb`, and the Python package for its torch section.
# bitsandbytes picks its library from torch's CUDA version; with a torch built for another CUDA,
# set BNB_CUDA_VERSION=130 (the library needs the CUDA 13 runtime and cuBLAS on the machine).
# The GPU machine itself needs no network: copy the folder there with the checkout.
#
# Needs: bash, a python3 with pip (any version: the wheels are chosen for CPython 3.12 with pip's
# --python-version, so nothing is installed or built). Variables (defaults):
#   NF4_PYTHON=python3        the Python whose pip downloads the wheels
#   PIP_INDEX_URL             (left to the environment) another package index
set -euo pipefail

BNB_VERSION=0.50.2
UNSLOTH_VERSION=2026.10.9
BNB_LIBRARY=libbitsandbytes_cuda130.so
UNSLOTH_FILES="nf4.py nf4_gemv.py triton_launch.py"

dir="${1:-.peers}"
py="${NF4_PYTHON:-python3}"
if [[ $# -gt 1 || "$dir" == -* ]]; then
  echo "usage: lab/fetch_peers.sh [DIR]   (default .peers)" >&2
  exit 2
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT

echo "downloading bitsandbytes==$BNB_VERSION and unsloth==$UNSLOTH_VERSION (wheels only, no dependencies)"
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$wheels" "bitsandbytes==$BNB_VERSION" "unsloth==$UNSLOTH_VERSION"

rm -rf "$dir/bitsandbytes" "$dir/unsloth_kernels" "$dir/unsloth_zoo"

# Unpacks only the wanted members of each wheel (python's zipfile: no unzip needed).
"$py" - "$wheels" "$dir" "$BNB_LIBRARY" "$UNSLOTH_FILES" <<'EOF'
import glob, os, sys, zipfile

wheels, out, bnb_library, unsloth_files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()

def one(pattern):
    found = glob.glob(os.path.join(wheels, pattern))
    if len(found) != 1:
        sys.exit(f"fetch_peers: expected one wheel {pattern}, found {found}")
    return found[0]

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)

with zipfile.ZipFile(one("bitsandbytes-*.whl")) as z:
    names = [n for n in z.namelist()
             if n.startswith("bitsandbytes/") and (n.endswith(".py") or n == "bitsandbytes/" + bnb_library)]
    if "bitsandbytes/" + bnb_library not in names:
        sys.exit(f"fetch_peers: the bitsandbytes wheel has no {bnb_library}")
    for n in names:
        write(os.path.join(out, n), z.read(n))
    print(f"bitsandbytes: {len(names) - 1} Python files and {bnb_library}")

with zipfile.ZipFile(one("unsloth-*.whl")) as z:
    for f in unsloth_files:
        write(os.path.join(out, "unsloth_kernels", f), z.read("unsloth/kernels/" + f))
    write(os.path.join(out, "unsloth_kernels", "__init__.py"), b"")
    print("unsloth_kernels: " + ", ".join(unsloth_files) + " (from unsloth/kernels/)")

write(os.path.join(out, "unsloth_zoo", "__init__.py"), b"")
write(os.path.join(out, "unsloth_zoo", "utils.py"), b"from packaging.version import Version\n")
print("unsloth_zoo: a stand-in utils.py (Version from packaging)")
EOF

echo "peers in $dir (never commit them)"
