# SPDX-License-Identifier: MIT
"""Builds nf4_torch._C, the PyTorch extension registering torch.ops.nf4.dequantize.

It links a static libnf4.a (the nf4 library with its CUDA backend, compiled with FMT_HEADER_ONLY so
it needs no fmt at run time): by default bindings/torch/.prebuilt/libnf4.a, made by
build_libnf4.sh; NF4_LIBRARY=/path/to/libnf4.a overrides. Only include/nf4/nf4.h (the C API) is
included, so nothing else of nf4's headers or dependencies is needed here.

    python setup.py build_ext --inplace      # or: pip install --no-build-isolation .
"""
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def main():
    # torch is imported here, not at module level, so `setup.py --help` works without it.
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    lib = os.environ.get("NF4_LIBRARY", os.path.join(HERE, ".prebuilt", "libnf4.a"))
    if not os.path.isfile(lib):
        sys.exit(f"nf4_torch: {lib} not found: run bindings/torch/build_libnf4.sh first "
                 "(or set NF4_LIBRARY to a libnf4.a built with FMT_HEADER_ONLY=1)")

    ext = CUDAExtension(
        name="nf4_torch._C",
        sources=[os.path.join("csrc", "nf4_torch.cpp")],
        include_dirs=[os.path.join(ROOT, "include")],
        extra_compile_args={"cxx": ["-O2", "-Wall"]},
        # The archive's symbols stay inside the extension (--exclude-libs): another copy of nf4
        # loaded in the same process cannot clash with this one. pthread: the cpu backend's workers.
        extra_objects=[lib],
        extra_link_args=["-Wl,--exclude-libs,ALL", "-pthread"],
    )
    setup(
        name="nf4_torch",
        version="0.1.0",
        description="bitsandbytes-compatible NF4/FP4 dequantization as a PyTorch operator (torch.ops.nf4)",
        packages=["nf4_torch"],
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExtension},
        python_requires=">=3.9",
    )


if __name__ == "__main__":
    main()
