# SPDX-License-Identifier: MIT
"""Writes what bindings/torch/CMakeLists.txt needs to know about the torch of the building Python.

    python torch_info.py OUT.cmake

torch's own CMake package (find_package(Torch)) is not used: for a CUDA build of torch it stops
the configure when no CUDA toolkit is found, which is exactly the CPU-only case, and it looks for
cuDNN, MKL and NVTX that an extension calling nf4 never uses. Like torch.utils.cpp_extension,
this takes the include directories, the library directory and the C++ ABI from the torch that the
extension will be imported into.
"""
import os
import re
import sys


def cmake_string(value):
    return '"' + str(value).replace("\\", "/").replace('"', '\\"') + '"'


def cxx_standard(include_dir):
    """The C++ dialect torch's headers require: ATen/ATen.h stops the build below it (C++17 up to
    torch 2.14, C++20 from 2.15 on, the same torch.utils.cpp_extension passes as -std=)."""
    try:
        with open(os.path.join(include_dir, "ATen", "ATen.h"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return 17
    years = [int(y) for y in re.findall(r"__cplusplus\s*<\s*(\d{6})L", text)]
    return {201703: 17, 202002: 20, 202302: 23}.get(max(years), 20) if years else 17


def main():
    out = sys.argv[1]
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
        sys.exit(
            f"nf4_torch: cannot import torch with {sys.executable}: {type(e).__name__}: {e}\n"
            "Install torch for this Python first, then build this package with it: python -m pip install ./bindings/torch")
    root = os.path.dirname(os.path.abspath(torch.__file__))
    lib = os.path.join(root, "lib")
    values = {
        "NF4_TORCH_VERSION": torch.__version__,
        "NF4_TORCH_ROOT": root,
        "NF4_TORCH_INCLUDE_DIRS": ";".join([os.path.join(root, "include"),
                                            os.path.join(root, "include", "torch", "csrc", "api", "include")]),
        "NF4_TORCH_LIBRARY_DIR": lib,
        "NF4_TORCH_CXX_STANDARD": cxx_standard(os.path.join(root, "include")),
        "NF4_TORCH_CXX11_ABI": int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))),
        # The CUDA version torch was built with ("" for a CPU-only torch), and whether its CUDA
        # libraries are there to link against.
        "NF4_TORCH_CUDA_VERSION": torch.version.cuda or "",
        "NF4_TORCH_HAS_C10_CUDA": int(os.path.exists(os.path.join(lib, "libc10_cuda.so"))),
    }
    with open(out, "w") as f:
        for k, v in values.items():
            f.write(f"set({k} {cmake_string(v)})\n")


if __name__ == "__main__":
    main()
