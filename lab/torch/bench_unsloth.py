# SPDX-License-Identifier: MIT
"""The Unsloth `test_dequantize` workload: nf4's operator vs plain PyTorch vs bitsandbytes' three launches.

Unsloth's harness (its dequantization challenge) times a dequantize function on the MLPs of three
configs (bsz, qlen, hd, m, dtype). Each MLP has gate and up weights [m, hd] and a down weight
[hd, m], NF4, blocksize 64, nested statistics with blocksize 256. After 2 warm-up rounds, it runs
1000 rounds; a round dequantizes the three weights (up, gate, down), each followed by
torch.cuda.synchronize(); the wall-clock time is summed over the configs. This script reproduces
that workload with bitsandbytes-format data made in torch (random packed codes and statistics;
bsz and qlen only shape the harness's input X, which the timed loop does not touch) and runs, in
the same process and on the same weights:

  nf4            nf4_torch.fast_dequantize (torch.ops.nf4.dequantize: one launch)
  nf4-op         torch.ops.nf4.dequantize called directly with pre-unpacked arguments
  torch          nf4_torch.reference_dequantize: docs/DESIGN.md section 2 in plain PyTorch ops
  bnb-unsloth    Unsloth's fast_dequantize path: bitsandbytes' C library through ctypes, three
                 launches (absmax dequantization, += offset, 4-bit dequantization)
  bnb-functional bitsandbytes.functional.dequantize_4bit (the same three launches via torch ops)
  floor          no dequantization, only the output's allocation: the harness's own overhead

The bnb rows need the bitsandbytes package (its CUDA library) to be importable; they are skipped
otherwise. Every method's output is checked bit for bit against nf4's in the warm-up rounds.

    python bench_unsloth.py [--rounds 1000] [--json results.json]
    python bench_unsloth.py --device cpu --small --rounds 2    # smoke test without a GPU
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch

import nf4_torch  # noqa: E402
from nf4_torch.testing import bits, make_weight, random_code2  # noqa: E402

CONFIGS = [  # (bsz, qlen, hd, m, dtype), as in Unsloth's test_dequantize
    (2, 3333, 2048, 8192, torch.float16),
    (5, 777, 1024, 4096, torch.bfloat16),
    (3, 2048, 4096, 14336, torch.bfloat16),
]
SMALL = [(1, 8, 128, 256, torch.float16), (1, 8, 64, 192, torch.bfloat16)]
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def bnb_code2():
    """bitsandbytes' own second-level table, from the golden file (random sorted floats otherwise)."""
    try:
        from safetensors.torch import load_file
        return load_file(os.path.join(REPO, "tests", "data", "golden.safetensors"))["c000.weight.nested_quant_map"]
    except Exception:  # noqa: BLE001 - any failure: the table's values do not change the timing
        return random_code2(generator=torch.Generator().manual_seed(0))


def method_nf4(W, qs):
    return nf4_torch.fast_dequantize(W, qs)


def method_nf4_op(W, qs):
    # The operator alone, its arguments unpacked once (on the warm-up call): the difference to
    # `nf4` is what fast_dequantize's Python (reading the quant state) costs per call.
    a = getattr(qs, "nf4_args", None)
    if a is None:
        a = qs.nf4_args = tuple(nf4_torch.unpack_quant_state(qs))
    return torch.ops.nf4.dequantize.default(W, *a)


def method_torch(W, qs):
    return nf4_torch.reference_dequantize(W, *nf4_torch.unpack_quant_state(qs))


def method_floor(W, qs):
    # No dequantization: only the output allocation, so `floor` rows show what the harness itself
    # (Python, allocator, three synchronizations per round) costs.
    return torch.empty(qs.shape, dtype=qs.dtype, device=W.device)


def load_bnb():
    """(bnb module, {name: fn}) or (None, reason)."""
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as F
        lib = F.lib
        # Importing bitsandbytes sets the ctypes signatures:
        # (code, A, absmax, out, blocksize, n, stream) for all three entry points used below.
        fns = (lib.cdequantize_blockwise_fp32, lib.cdequantize_blockwise_fp16_nf4, lib.cdequantize_blockwise_bf16_nf4)
    except Exception as e:  # noqa: BLE001 - not installed, or no library for this CUDA version
        return None, f"bitsandbytes not available: {type(e).__name__}: {e}"
    absmax_fp32, nf4_fp16, nf4_bf16 = fns

    def unsloth_path(W, qs):
        # What Unsloth's fast_dequantize does with bitsandbytes: decode the absmax codes into a
        # float32 buffer, add the offset with a torch op, then decode the 4-bit codes.
        s2 = qs.state2
        n_absmax = qs.absmax.numel()
        out = torch.empty(qs.shape, dtype=qs.dtype, device=W.device)
        out_absmax = torch.empty(n_absmax, dtype=torch.float32, device=W.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream(W.device).cuda_stream)
        absmax_fp32(ctypes.c_void_p(s2.code.data_ptr()), ctypes.c_void_p(qs.absmax.data_ptr()),
                    ctypes.c_void_p(s2.absmax.data_ptr()), ctypes.c_void_p(out_absmax.data_ptr()),
                    ctypes.c_int32(s2.blocksize), ctypes.c_int32(n_absmax), stream)
        out_absmax += qs.offset
        fx = nf4_fp16 if qs.dtype == torch.float16 else nf4_bf16
        fx(None, ctypes.c_void_p(W.data_ptr()), ctypes.c_void_p(out_absmax.data_ptr()),
           ctypes.c_void_p(out.data_ptr()), ctypes.c_int32(qs.blocksize), ctypes.c_int32(out.numel()), stream)
        return out.t() if W.shape[0] == 1 else out

    def functional_path(W, qs):
        # bitsandbytes' own QuantState, made on the first (warm-up) call and kept on our state
        # object, so the timed rounds only dequantize.
        st = getattr(qs, "bnb_state", None)
        if st is None:
            s2 = F.QuantState(absmax=qs.state2.absmax, code=qs.state2.code, blocksize=qs.state2.blocksize,
                              dtype=torch.float32)
            st = qs.bnb_state = F.QuantState(absmax=qs.absmax, shape=qs.shape, code=qs.code,
                                             blocksize=qs.blocksize, quant_type="nf4", dtype=qs.dtype,
                                             offset=qs.offset, state2=s2)
        return F.dequantize_4bit(W, st)

    return bnb, {"bnb-unsloth": unsloth_path, "bnb-functional": functional_path}


def make_mlp(hd, m, dtype, seed, code2, device):
    g = torch.Generator(device).manual_seed(seed)
    mk = lambda shape: make_weight(shape, blocksize=64, nested=True, nested_blocksize=256,  # noqa: E731
                                   dtype=dtype, device=device, generator=g, code2=code2)
    return {"gate": mk([m, hd]), "up": mk([m, hd]), "down": mk([hd, m])}


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def one_round(fx, mlp):
    # The harness's mlp_dequantize: up, gate, down, each result transposed, each followed by a sync.
    outs = []
    for name in ("up", "gate", "down"):
        W, qs = mlp[name]
        outs.append(fx(W, qs).t())
        synchronize()
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--device", default="cuda", help="cuda (the workload) or cpu (a smoke test)")
    ap.add_argument("--small", action="store_true", help="tiny configs instead of Unsloth's (smoke test)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_unsloth.py needs a CUDA device (or --device cpu --small for a smoke test)")
    configs = SMALL if args.small else CONFIGS

    methods = {"nf4": method_nf4, "nf4-op": method_nf4_op, "torch": method_torch}
    floor = {"floor": method_floor}
    bnb, extra = load_bnb() if args.device == "cuda" else (None, "no GPU")
    if bnb is None:
        print(f"# {extra}: bnb rows skipped")
    else:
        methods.update(extra)
    code2 = bnb_code2().to(args.device)

    env = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nf4": nf4_torch.nf4_version(),
        "bitsandbytes": getattr(bnb, "__version__", None),
        "rounds": args.rounds,
        "warmup": args.warmup,
    }
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items()))

    seconds = {name: [] for name in list(methods) + list(floor)}
    mismatches = {name: 0 for name in methods}
    for ci, (bsz, qlen, hd, m, dtype) in enumerate(configs):
        mlp = make_mlp(hd, m, dtype, 3407 + ci, code2, args.device)
        synchronize()
        want = one_round(method_nf4, mlp)
        for name, fx in {**methods, **floor}.items():
            for _ in range(args.warmup):  # warm-up, and the harness's check of every output
                got = one_round(fx, mlp)
                if name in floor:
                    continue
                for a, b in zip(got, want):
                    if a.shape != b.shape or a.dtype != b.dtype:
                        mismatches[name] += a.numel()
                    else:
                        mismatches[name] += int((bits(a.contiguous()) != bits(b.contiguous())).sum())
            synchronize()
            start = time.perf_counter()
            for _ in range(args.rounds):
                one_round(fx, mlp)
            synchronize()
            seconds[name].append(time.perf_counter() - start)
        cfg = f"({bsz}, {qlen}, {hd}, {m}, {str(dtype).replace('torch.', '')})"
        print(f"config {cfg}: " + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in seconds.items()))
        del mlp, want
        if args.device == "cuda":
            torch.cuda.empty_cache()

    totals = {n: sum(s) for n, s in seconds.items()}
    print()
    print("| method | " + " | ".join(f"({b}, {q}, {h}, {mm}, {str(d).replace('torch.', '')})"
                                    for b, q, h, mm, d in configs) + " | total (s) | vs nf4 | bits differing |")
    print("|---|" + "---|" * (len(configs) + 3))
    for n in seconds:
        per = " | ".join(f"{s:.3f}" for s in seconds[n])
        checked = mismatches.get(n, "-")
        print(f"| {n} | {per} | {totals[n]:.3f} | {totals[n] / totals['nf4']:.2f}x | {checked} |")
    per_round_us = {n: 1e6 * totals[n] / (args.rounds * len(configs)) for n in seconds}
    print()
    print("per round (three weights + three syncs), averaged over configs: " +
          ", ".join(f"{n} {us:.1f} us" for n, us in per_round_us.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "configs": [list(c[:4]) + [str(c[4])] for c in configs], "seconds": seconds,
                       "totals": totals, "bits_differing": mismatches}, f, indent=1)
    if any(mismatches.values()):
        print("ERROR: some method's output differs from nf4's:", mismatches)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
