#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The evidence behind check_decode.py's ratio: how far from bitsandbytes' error a path lands at the
model level when it is exactly as accurate, and when it has a defect.

On the CPU (torch, transformers 5.x, bitsandbytes, nf4_torch; no GPU): for each seed, check_decode.py's
model and references are built and every path below decodes batches 1 and 4 teacher-forced on the
reference's tokens; printed per path: the ratio of its mean |logit error| and of its mean KL to
bitsandbytes', over all seeds and batches (min, median, max). The stand-ins replace every Linear4bit's
forward, computing from bitsandbytes' bf16 dequantization of the weight:
  reordered      the fp32 sum taken in four chunks of K added in reverse order, rounded once to bf16:
                 as accurate as bitsandbytes by construction, so its spread is the noise of the measure;
  truncate       the fp32 sum truncated to bf16 instead of rounded to nearest (a rounding defect);
  bf16 partials  partial sums of 64 products rounded to bf16 and added in bf16 (an accumulation defect);
and nf4_torch.linear_4bit in its three modes.

    python3 lab/torch/check_decode_calibrate.py [--seeds 10] [--hidden 256 --intermediate 704 --layers 2]
"""
import argparse
import importlib.util
import os
import statistics
import sys
import types

STAND_INS = ("reordered", "truncate", "bf16 partials")


def load_check_decode():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_decode.py")
    spec = importlib.util.spec_from_file_location("check_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in(torch, nf4_torch, kind):
    def forward(module, x):
        w = nf4_torch.dequantize(module.weight, module.weight.quant_state).float()  # the bf16 weight
        xf = x.to(torch.bfloat16).float()
        k = xf.shape[-1]
        if kind == "reordered":
            step = k // 4
            parts = [xf[..., i:i + step] @ w[:, i:i + step].t() for i in range(0, k, step)]
            y = parts[-1]
            for p in reversed(parts[:-1]):
                y = y + p
            y = y.to(torch.bfloat16)
        elif kind == "truncate":
            bits = (xf @ w.t()).contiguous().view(torch.int32) & ~0xFFFF
            y = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low half is zero
        else:
            y = None
            for i in range(0, k, 64):
                p = (xf[..., i:i + 64] @ w[:, i:i + 64].t()).to(torch.bfloat16)
                y = p if y is None else y + p
        return y.to(x.dtype)
    return forward


class Replace:
    def __init__(self, model, bnb, forward):
        self.modules = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        self.fwd = forward

    def __enter__(self):
        for m in self.modules:
            m.forward = types.MethodType(self.fwd, m)
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            del m.forward
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    if args.hidden % 64 or args.intermediate % 64:
        print("check_decode_calibrate.py: --hidden and --intermediate must be multiples of 64", file=sys.stderr)
        return 2
    import torch
    import bitsandbytes as bnb
    import nf4_torch
    cd = load_check_decode()
    judged = {"nf4 default": cd.PATH_NF4[None], "nf4 exact": cd.PATH_NF4["exact"], "nf4 fast": cd.PATH_NF4["fast"]}
    ratios = {k: [] for k in STAND_INS + tuple(judged)}
    for seed in range(args.seeds):
        cargs = cd.make_parser().parse_args(
            ["--device", "cpu", "--hidden", str(args.hidden), "--intermediate", str(args.intermediate),
             "--layers", str(args.layers), "--heads", str(max(4, args.hidden // 64)), "--kv-heads", "2",
             "--new-tokens", str(args.new_tokens), "--seed", str(seed)])
        cfg, quant, dense, refs, problems = cd.build_models(cargs, torch, bnb, "cpu")
        if problems:
            print("check_decode_calibrate.py: " + "; ".join(problems), file=sys.stderr)
            return 1
        all_paths = cd.make_paths(torch, quant, dense, bnb, nf4_torch)
        paths = {n: all_paths[n] for n in [cd.PATH_BNB, cd.PATH_DENSE] + list(judged.values())}
        for kind in STAND_INS:
            paths[kind] = (quant, lambda kind=kind: Replace(quant, bnb, stand_in(torch, nf4_torch, kind)))
        gen = torch.Generator().manual_seed(seed + 1)
        for batch in (1, 4):
            res = cd.accuracy(cargs, torch, cfg, paths, refs, batch, gen)
            base = res["paths"][cd.PATH_BNB]["summary"]
            for key in ratios:
                s = res["paths"][judged.get(key, key)]["summary"]
                ratios[key].append((s["mean_abs"] / base["mean_abs"], s["mean_kl"] / base["mean_kl"]))
        print(f"seed {seed}: " + ", ".join(f"{k} {v[-2][0]:.3f}/{v[-2][1]:.3f} {v[-1][0]:.3f}/{v[-1][1]:.3f}"
                                          for k, v in ratios.items()), flush=True)
    print(f"\nhidden {args.hidden}, intermediate {args.intermediate}, {args.layers} layers; {args.seeds} seeds x "
          "batches 1 and 4; ratio to bitsandbytes, min / median / max\n")
    print("| path | mean abs err | mean KL |")
    print("|---|---|---|")
    for key, v in ratios.items():
        cells = []
        for i in (0, 1):
            xs = [r[i] for r in v]
            cells.append(f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}")
        print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
