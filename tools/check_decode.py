#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Greedy decode of a transformers bnb-4bit model through nf4_torch.linear_4bit, against bitsandbytes.

On a machine with a CUDA GPU, torch, transformers (+ accelerate), bitsandbytes and nf4_torch (no
network: the model is made here, not downloaded):
  1. a small Llama with random weights (bf16) is saved and loaded back by transformers with
     BitsAndBytesConfig (NF4, double quantization, bf16 compute), as tools/check_transformers.py does;
  2. for each batch size (default 1 and 4) a random prompt is decoded greedily with the KV cache,
     one new token per forward, twice on the same model object: with bitsandbytes' own
     Linear4bit.forward, then with every Linear4bit's forward replaced by nf4_torch.linear_4bit
     (the fused product for up to 8 rows, so every decode step; dequantize + matmul for the
     prompt). Everything else (embeddings, norms, attention, lm_head, cache) is transformers' own.
     The nf4 run is fed bitsandbytes' tokens, so the logits of each step compare the same inputs;
     its own greedy choice is compared with bitsandbytes' token;
  3. the logits of every step must agree within the bound below, and where the greedy tokens differ
     the two candidates must be a near tie (within the same bound in bitsandbytes' logits);
  4. the decode steps of both are timed (wall clock of one forward with the cache, synchronized,
     after a warm-up run): median per token with the spread.
Exit status 0 when everything holds, 1 when not, 2 when the machine cannot run it.

    python3 tools/check_decode.py [--new-tokens 16] [--prompt 12] [--batches 1,4] [--json FILE]
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import types

# The bound, per step: |logits_nf4 - logits_bnb| <= ULPS bf16 ulps of the step's largest |logit|.
# Why a few ulps: both paths round every 4-bit linear's output to bf16 once after an fp32
# accumulation (nf4: docs/GEMV.md section 1 for the decode rows, dequantize + matmul for the prompt;
# bitsandbytes 0.50.2: Linear4bit -> matmul_4bit -> its fused gemm_4bit kernel at decode, or its
# dequantize + F.linear, where older releases took gemv_4bit for a single row -- the same single
# rounding). docs/GEMV.md section 2: nf4's sum is within ~1e-7 of exact before that rounding, so each
# linear output of the two paths differs by at most about one bf16 ulp (2^-8 relative). Those
# differences go through RMSNorm, attention and the residual stream of each layer in bf16, and into
# the logits through the same bf16 lm_head, rounded once more: a few ulps of the logit magnitude, not
# more, unless a path computes something else. An ulp here is bf16's spacing at the largest |logit|
# of the step (2^(floor(log2 v) - 7)), so the bound is at most ULPS * 2^-7 of it.
DEFAULT_ULPS = 4


def bf16_ulp(v):
    """bf16's spacing at magnitude v (8 significant bits): 2^(floor(log2 v) - 7); 2^-133 at 0."""
    if v <= 0 or not math.isfinite(v):
        return 2.0 ** -133
    return 2.0 ** (math.floor(math.log2(v)) - 7)


def summarize(samples):
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def compare_steps(bnb_logits, nf4_logits, bnb_tokens, nf4_tokens, ulps):
    """Per step: the largest |logit|, max |diff|, the bound, whether the greedy tokens agree and, where
    they do not, bitsandbytes' margin between its token and nf4's. Tensors are [batch, vocab] float,
    tokens [batch] integer; lists of steps. Returns (rows, problems)."""
    rows, problems = [], []
    for s, (a, b, ta, tb) in enumerate(zip(bnb_logits, nf4_logits, bnb_tokens, nf4_tokens)):
        scale = a.abs().max().item()
        diff = (a - b).abs().max().item()
        bound = ulps * bf16_ulp(scale)
        agree = bool((ta == tb).all().item())
        margin = 0.0
        if not agree:
            idx = (ta != tb).nonzero().flatten().tolist()
            margin = max((a[i, ta[i]] - a[i, tb[i]]).item() for i in idx)
        ok = diff <= bound and (agree or margin <= bound)
        rows.append({"step": s, "max_abs_logit": scale, "max_abs_diff": diff, "bound": bound,
                     "tokens_agree": agree, "tie_margin": margin, "ok": ok})
        if diff > bound:
            problems.append(f"step {s}: logits differ by {diff:g} > {bound:g} ({ulps} bf16 ulps of {scale:g})")
        if not agree and margin > bound:
            problems.append(f"step {s}: greedy tokens differ and it is no near tie (margin {margin:g} > {bound:g})")
    return rows, problems


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens generated one at a time (default 16)")
    ap.add_argument("--prompt", type=int, default=12, help="prompt length in tokens (default 12)")
    ap.add_argument("--batches", default="1,4", help="batch sizes, comma-separated (default 1,4; at most 8 "
                    "keeps the decode steps on the fused product)")
    ap.add_argument("--ulps", type=float, default=DEFAULT_ULPS, help="the bound in bf16 ulps of the largest logit")
    ap.add_argument("--timing-runs", type=int, default=3, help="timed decode runs per path and batch (default 3)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (device 0), or cpu for a smoke test: bitsandbytes' CPU "
                    "path against nf4's CPU oracle (slow; its timings mean nothing)")
    ap.add_argument("--workdir", help="where the dense source model goes (default: a temporary folder)")
    ap.add_argument("--json", help="write the per-step comparison and the timings here")
    return ap


def parse_batches(text):
    try:
        batches = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        batches = []
    if not batches or any(b < 1 for b in batches):
        raise SystemExit(f"check_decode.py: --batches is a comma-separated list of positive sizes, got {text!r}")
    return batches


def build_model(args, torch, work):
    """The bnb-4bit Llama, quantized by transformers + bitsandbytes on CUDA device 0 (or the CPU)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    dense_dir = os.path.join(work, "dense-source")
    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=max(256, args.prompt +
                                                                                    args.new_tokens + 8))
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dense_dir)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(dense_dir, quantization_config=quant,
                                                 device_map={"": 0 if args.device == "cuda" else "cpu"})
    model.eval()
    return model, cfg


class Nf4Forward:
    """Replaces the forward of every bitsandbytes Linear4bit of a model by nf4_torch.linear_4bit (an
    instance attribute, so removing it restores the class's forward), counting which path each call took."""

    def __init__(self, model, bnb, nf4_torch):
        self.modules = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        self.nf4_torch = nf4_torch
        self.fused = self.dense = 0

    def forward(self, module, x):
        # As Linear4bit.forward: compute in the module's compute dtype, return the input's dtype.
        inp_dtype = x.dtype
        if module.compute_dtype is not None:
            x = x.to(module.compute_dtype)
        rows = x.numel() // x.shape[-1]
        if rows <= 8:
            self.fused += 1
        else:
            self.dense += 1
        return self.nf4_torch.linear_4bit(x, module.weight, module.weight.quant_state, module.bias).to(inp_dtype)

    def __enter__(self):
        patcher = self
        for m in self.modules:
            m.forward = types.MethodType(lambda module, x: patcher.forward(module, x), m)
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            del m.forward
        return False


def decode(model, torch, prompt, new_tokens, forced=None, step_times=None):
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    """Greedy decode with the KV cache: (logits per step [batch, vocab] float32, own greedy token per
    step). Step 0's logits are the prompt's last position; step s > 0 follows one forward of the
    previous token: bitsandbytes' token from `forced` where given, else the own one. The wall time of
    each single-token forward is appended to step_times."""
    logits_steps, tokens = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()
        for s in range(new_tokens):
            logits_steps.append(logits)
            own = logits.argmax(-1)
            tokens.append(own)
            if s == new_tokens - 1:
                break
            nxt = own if forced is None else forced[s]
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            sync()
            if step_times is not None:
                step_times.append((time.perf_counter() - t0) * 1e3)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()
    return logits_steps, tokens


def main(argv=None):
    args = make_parser().parse_args(argv)
    batches = parse_batches(args.batches)
    if args.new_tokens < 2 or args.prompt < 1 or args.timing_runs < 1:
        print("check_decode.py: --new-tokens must be at least 2, --prompt and --timing-runs at least 1",
              file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("check_decode.py: needs torch", file=sys.stderr)
        return 2
    if args.device not in ("cuda", "cpu"):
        print(f"check_decode.py: --device is cuda or cpu, got {args.device!r}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_decode.py: no CUDA device: transformers quantizes with bitsandbytes on a GPU, and the "
              "decode runs there (--device cpu is a slow smoke test of the script)", file=sys.stderr)
        return 2
    missing = []
    for mod in ("transformers", "accelerate", "bitsandbytes", "nf4_torch"):
        try:
            __import__(mod)
        except Exception as e:  # noqa: BLE001 - which module and why, then stop
            missing.append(f"{mod} ({type(e).__name__}: {e})")
    if missing:
        print("check_decode.py: cannot import " + "; ".join(missing), file=sys.stderr)
        return 2
    import bitsandbytes as bnb
    import nf4_torch
    import transformers

    env = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
           "bitsandbytes": getattr(bnb, "__version__", "?"), "nf4": nf4_torch.nf4_version()}
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="nf4-decode-") as tmp:
        model, cfg = build_model(args, torch, args.workdir or tmp)
    patch = Nf4Forward(model, bnb, nf4_torch)
    print(f"model: Llama, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate "
          f"{cfg.intermediate_size}, vocab {cfg.vocab_size}; {len(patch.modules)} bitsandbytes Linear4bit modules",
          flush=True)
    problems = [] if patch.modules else ["no bitsandbytes Linear4bit module in the model"]
    results = {"env": env, "ulps": args.ulps, "batches": {}}
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    for batch in batches:
        prompt = torch.randint(0, cfg.vocab_size, (batch, args.prompt), generator=g).to(args.device)
        # bitsandbytes' own forward, then nf4's fed the same tokens.
        bnb_logits, bnb_tokens = decode(model, torch, prompt, args.new_tokens)
        with patch:
            patch.fused = patch.dense = 0
            nf4_logits, nf4_tokens = decode(model, torch, prompt, args.new_tokens, forced=bnb_tokens)
            fused, dense = patch.fused, patch.dense
        rows, probs = compare_steps(bnb_logits, nf4_logits, bnb_tokens, nf4_tokens, args.ulps)
        problems += [f"batch {batch}, {p}" for p in probs]
        if batch <= 8 and fused == 0:
            problems.append(f"batch {batch}: the nf4 run never took the fused product")
        # Timing: a warm-up run per path, then --timing-runs runs each, alternating.
        times = {"bitsandbytes Linear4bit": [], "nf4 linear_4bit": []}
        for run in range(args.timing_runs + 1):
            for name in (list(times) if run % 2 == 0 else list(reversed(list(times)))):
                sink = times[name] if run > 0 else None
                if name == "nf4 linear_4bit":
                    with patch:
                        decode(model, torch, prompt, args.new_tokens, forced=bnb_tokens, step_times=sink)
                else:
                    decode(model, torch, prompt, args.new_tokens, forced=bnb_tokens, step_times=sink)
        timing = {n: summarize(t) for n, t in times.items()}
        results["batches"][batch] = {"steps": rows, "nf4_fused_calls": fused, "nf4_dequantize_matmul_calls": dense,
                                     "ms_per_token": timing}

        print(f"\n### batch {batch}: {args.prompt}-token prompt, {args.new_tokens} greedy steps "
              f"(nf4: {fused} fused-product calls, {dense} dequantize + matmul calls)\n")
        print("| step | max abs logit | max abs diff | bound | diff / bound | greedy tokens |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            tok = "agree" if r["tokens_agree"] else f"differ (bnb margin {r['tie_margin']:.3g})"
            print(f"| {r['step']}{' (prompt)' if r['step'] == 0 else ''} | {r['max_abs_logit']:.4g} | "
                  f"{r['max_abs_diff']:.3g} | {r['bound']:.3g} | {r['max_abs_diff'] / r['bound']:.2f} | {tok} |")
        worst = max(r["max_abs_diff"] / r["bound"] for r in rows)
        agree = sum(r["tokens_agree"] for r in rows)
        print(f"\nbatch {batch}: max |diff| {max(r['max_abs_diff'] for r in rows):.3g}, at most {worst:.2f} of the "
              f"bound; greedy tokens agree at {agree} of {len(rows)} steps")
        print("\n| decode step, ms per token | median (min-max) | vs bitsandbytes |")
        print("|---|---|---|")
        base = timing["bitsandbytes Linear4bit"]["median"]
        for name, s in timing.items():
            print(f"| {name} | {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}), n={s['n']} | "
                  f"{base / s['median']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print()
    for p in problems:
        print("PROBLEM:", p)
    print("RESULT:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
