# SPDX-License-Identifier: MIT
"""Dense bf16 Y = X @ W^T through torch.matmul (cuBLAS), CUDA-graph timing: the reference the fused
product's targets name (docs/PERFORMANCE.md). usage: bench_dense.py NxK[,NxK...] m[,m...]"""
import sys

import torch


def time_us(fn, iters=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters // 20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters // 20 * 20)


def main():
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
    ms = [int(v) for v in sys.argv[2].split(",")]
    print(f"{'dense bf16 W [N x K]':22} {'m':>4} {'time us':>10}")
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            print(f"{n}x{k:<17} {m:>4} {time_us(lambda: torch.matmul(x, w.t(), out=y)):10.1f}")
    print(f"RESULT: {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
