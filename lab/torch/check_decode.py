#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Greedy decode of a bnb-4bit Llama: each product path judged against a float64 reference, and timed
with a static KV cache in CUDA graphs.

On a machine with a CUDA GPU, torch, transformers (5.x: StaticCache layers that keep their length in a
device tensor), bitsandbytes and nf4_torch (no network: the model is made here, not downloaded):
  1. a Llama with random weights (bf16, --hidden/--intermediate/--layers/--heads/--kv-heads/--vocab) is
     made on the device; its attention and MLP projections become bitsandbytes Linear4bit modules (NF4,
     double quantization, bf16 compute, as transformers' BitsAndBytesConfig makes them), quantized by
     bitsandbytes. The lm_head, embeddings and norms stay bf16, as transformers leaves them;
  2. the reference is the same model in float64 (--ref-dtype) with every quantized weight replaced by
     the checkpoint's values, dequantized in fp32 (REF_CHECKPOINT below); transformers' Llama still
     normalizes (RMSNorm) and computes the rotary angles in fp32 there, 1e-7 relative, far below bf16's
     4e-3. It decodes a random prompt greedily; its tokens are then fed to every path (teacher forcing),
     so at every step each path sees the inputs the reference saw;
  3. the paths, all with bf16 activations and the same 4-bit weights: bitsandbytes' own Linear4bit
     forward; nf4_torch.linear_4bit in its place with mode None (the default), "exact" and "fast"; nf4's
     dequantize + F.linear; and a dense bf16 model (nn.Linear holding bitsandbytes' bf16 dequantization
     of the weights). Per step
     and batch: max and mean |logit - reference logit|, the KL divergence KL(reference || path) of the
     softmax, and whether the path's top-1 token is the reference's;
  4. the judgement, per batch: each nf4 mode's mean |logit error| and mean KL over all steps and rows
     are at most --ratio (DEFAULT_RATIO below) times bitsandbytes'. The distance between nf4's and bitsandbytes' logits
     in bf16 ulps is printed as information only: two correct paths drift apart through the layers and
     the KV cache, so a fixed distance between them judges neither;
  5. speed (CUDA): for each path and each batch, one decode step (the forward with the static cache and
     the greedy token written back into the input buffer) captured in a CUDA graph and replayed:
     --timed-tokens steps per run, the median of --timing-runs runs, as ms per step and tokens per
     second; the path's quantized linears alone (the same calls, same shapes, in a graph of their own),
     so the share of the step they take is visible, beside their floor (the weights' bytes at a
     measured device-to-device copy rate); a prefill of each --prefill length at batch 1, also
     captured; and, with torch._dynamo.explain, the graphs and graph breaks that torch.compile would see
     in a decode step of each path, with their reasons.
Exit status 0 when every judgement holds, 1 when not, 2 when the machine cannot run it.

    python3 lab/torch/check_decode.py [--batches 1,4,8,16] [--new-tokens 32] [--json FILE]
    python3 lab/torch/check_decode.py --hidden 4096 --intermediate 14336 --layers 4 --heads 32 --kv-heads 8 \\
        --vocab 32000                                   # the real-size run of lab/gpu_torch_bench.sh
"""
import argparse
import json
import math
import statistics
import sys
import time
import types

# The judgement: nf4's mean |logit error| and mean KL against the reference, over all steps and rows of a
# batch, at most DEFAULT_RATIO times bitsandbytes'. Why a ratio: the paths share all of the model's bf16
# arithmetic outside the quantized linears (norms, attention, residual stream, lm_head) and each rounds a
# linear's output to bf16 once, so their errors against the reference are of one size and differ by how
# their drift happens to fall. Why this one: lab/torch/check_decode_calibrate.py (docs/PERFORMANCE_LOG.md,
# "Decode end to end") measured, on the CPU over 32 runs (seeds, batches 1 and 4, 2 and 4 layers), a
# path as accurate as bitsandbytes by construction (its fp32 sums taken in another order) within 1.026
# of it on both measures; partial sums rounded to bf16 gave at least 1.14 (mean error) and 1.29 (KL);
# truncating each output to bf16 instead of rounding it gave 1.05 to 1.40 in KL (median 1.18). The
# margin, 5%, is about twice that spread: it catches bf16 accumulation always and truncation in most
# runs; a defect that adds less than a few percent to the model's error can pass.
DEFAULT_RATIO = 1.05

PATH_BNB = "bitsandbytes Linear4bit"
PATH_NF4 = {None: "nf4 linear_4bit", "exact": "nf4 linear_4bit exact", "fast": "nf4 linear_4bit fast"}
PATH_DEQ = "nf4 dequantize + matmul"
PATH_DENSE = "dense bf16"
PATHS = [PATH_BNB, PATH_NF4[None], PATH_NF4["exact"], PATH_NF4["fast"], PATH_DEQ, PATH_DENSE]
JUDGED = [PATH_NF4[None], PATH_NF4["exact"], PATH_NF4["fast"]]
# The references. The judged one holds the checkpoint's values: each 4-bit weight dequantized in fp32
# (value * absmax). bitsandbytes, nf4's fast contract, dequantize + matmul and the dense model multiply by
# that weight rounded to bf16, as dequantization to the compute dtype writes it; nf4's exact contract
# multiplies by the fp32 value itself (docs/GEMV.md section 1), so it computes the checkpoint's product
# with one rounding less. The second reference holds the bf16-rounded weights: against it the bf16-weight
# paths carry no weight rounding and the exact contract does; it is shown, not judged.
REF_CHECKPOINT = "fp32-dequantized weights"
REF_BF16 = "bf16-dequantized weights"


def bf16_ulp(v):
    """bf16's spacing at magnitude v (8 significant bits): 2^(floor(log2 v) - 7); 2^-133 at 0."""
    if v <= 0 or not math.isfinite(v):
        return 2.0 ** -133
    return 2.0 ** (math.floor(math.log2(v)) - 7)


def quantile(values, q):
    """The q-quantile (0..1) of a non-empty list, linear between order statistics."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def step_metrics(torch, ref, out):
    """One step against the reference: ref and out are [batch, vocab] logits. Per row: mean |error|,
    KL(softmax(ref) || softmax(out)) and whether out's top-1 token is ref's; and the max |error|."""
    ref = ref.double()
    out = out.double()
    err = (out - ref).abs()
    logp = torch.log_softmax(ref, dim=-1)
    logq = torch.log_softmax(out, dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)  # rounding can give -1e-17 for equal rows
    top1 = out.argmax(-1) == ref.argmax(-1)
    return {"max_abs": err.max().item(), "row_mean_abs": err.mean(-1).tolist(), "row_kl": kl.tolist(),
            "row_top1": top1.tolist()}


def summarize_path(steps):
    """Aggregates over the steps of one path and batch (each a step_metrics dict)."""
    mean_abs = [v for s in steps for v in s["row_mean_abs"]]
    kl = [v for s in steps for v in s["row_kl"]]
    top1 = [v for s in steps for v in s["row_top1"]]
    return {"mean_abs": statistics.fmean(mean_abs), "max_abs": max(s["max_abs"] for s in steps),
            "mean_kl": statistics.fmean(kl), "max_kl": max(kl), "top1": sum(top1), "rows": len(top1),
            "mean_abs_p10_p50_p90": [quantile(mean_abs, q) for q in (0.1, 0.5, 0.9)],
            "kl_p10_p50_p90": [quantile(kl, q) for q in (0.1, 0.5, 0.9)]}


def judge(summaries, ratio):
    """summaries: path name -> summarize_path of one batch. Each judged nf4 path's mean |error| and mean KL
    must be at most `ratio` times bitsandbytes'. Returns a list of problems (empty when it holds)."""
    problems = []
    base = summaries.get(PATH_BNB)
    if base is None:
        return [f"no {PATH_BNB} run to judge against"]
    for name in JUDGED:
        s = summaries.get(name)
        if s is None:
            problems.append(f"{name}: not run")
            continue
        for key, what in (("mean_abs", "mean |logit error|"), ("mean_kl", "mean KL")):
            if not math.isfinite(s[key]):
                problems.append(f"{name}: {what} is {s[key]}")
            elif s[key] > ratio * base[key]:
                problems.append(f"{name}: {what} {s[key]:.4g} > {ratio} x {PATH_BNB}'s {base[key]:.4g} "
                                f"(ratio {s[key] / base[key] if base[key] > 0 else math.inf:.3f})")
    return problems


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy steps judged per batch (default 32)")
    ap.add_argument("--prompt", type=int, default=12, help="prompt length in tokens (default 12)")
    ap.add_argument("--batches", default="1,4,8,16", help="batch sizes judged and timed (default 1,4,8,16)")
    ap.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                    help=f"largest nf4 / bitsandbytes ratio of mean |logit error| and mean KL (default {DEFAULT_RATIO})")
    ap.add_argument("--ref-dtype", choices=("float64", "float32"), default="float64",
                    help="the reference model's dtype (default float64)")
    ap.add_argument("--timed-tokens", type=int, default=64, help="decode steps per timed run (default 64)")
    ap.add_argument("--timing-runs", type=int, default=5, help="timed runs per path and batch; the median (default 5)")
    ap.add_argument("--prefill", default="256,1024", help="prefill lengths timed at batch 1 (default 256,1024; "
                    "'' for none)")
    ap.add_argument("--no-timing", action="store_true", help="judge only: no CUDA-graph timing")
    ap.add_argument("--graph-breaks", default="1,16", help="batch sizes whose decode step goes through "
                    "torch._dynamo.explain for every path (default 1,16; '' for none)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (device 0), or cpu: bitsandbytes' CPU path against "
                    "nf4's CPU backend, judged the same way, without the timing (slow)")
    ap.add_argument("--json", help="write the per-step metrics, the summaries and the timings here")
    return ap


def parse_sizes(text, what, allow_empty=False):
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        sizes = None
    if sizes is None or (not sizes and not allow_empty) or any(b < 1 for b in sizes):
        raise SystemExit(f"check_decode.py: {what} is a comma-separated list of positive sizes, got {text!r}")
    return sorted(set(sizes))


# ---------------------------------------------------------------------------------------------------
# The models


def build_models(args, torch, bnb, device):
    """The bnb-4bit model, the dense bf16 model holding bitsandbytes' bf16 dequantization of its weights,
    and the two references in --ref-dtype: REF_CHECKPOINT, whose quantized weights are dequantized in fp32
    (value * absmax, the checkpoint's own values, before any rounding to the compute dtype), and REF_BF16,
    the dense bf16 model's weights. Returns (config, quantized, dense, {name: reference}, problems)."""
    import copy
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, tie_word_embeddings=False,
                      max_position_embeddings=max(2048, args.prompt + args.new_tokens + args.timed_tokens + 8,
                                                  max(parse_sizes(args.prefill, "--prefill", True) or [0])))
    torch.manual_seed(args.seed)
    with torch.device(device):
        dense = LlamaForCausalLM(cfg).to(torch.bfloat16)
    dense.eval()
    quant = copy.deepcopy(dense)
    ref_dtype = getattr(torch, args.ref_dtype)
    checkpoint_weights = {}
    problems = []
    # The projections of every layer, as transformers' bitsandbytes integration converts them (the
    # lm_head is kept dense there too).
    for i, (layer_q, layer_d) in enumerate(zip(quant.model.layers, dense.model.layers)):
        for parent_name in ("self_attn", "mlp"):
            parent_q, parent_d = getattr(layer_q, parent_name), getattr(layer_d, parent_name)
            for name, lin in list(parent_q.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                                      device="meta")
                q.weight = bnb.nn.Params4bit(lin.weight.data.detach().clone(), requires_grad=False,
                                             compress_statistics=True, quant_type="nf4", module=q)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data.clone(), requires_grad=False)
                q = q.to(device)  # bitsandbytes quantizes here
                setattr(parent_q, name, q)
                qs = q.weight.quant_state
                w16 = bnb.functional.dequantize_4bit(q.weight.data, qs)
                qs32 = copy.copy(qs)
                qs32.dtype = torch.float32
                w32 = bnb.functional.dequantize_4bit(q.weight.data, qs32)
                if w16.dtype != torch.bfloat16 or w32.dtype != torch.float32 or not torch.equal(
                        w32.to(torch.bfloat16).view(torch.int16), w16.view(torch.int16)):
                    problems.append(f"layer {i} {parent_name}.{name}: bitsandbytes' bf16 dequantization is not its "
                                    "fp32 one rounded to nearest even")
                getattr(parent_d, name).weight.data.copy_(w16.reshape(lin.out_features, lin.in_features))
                checkpoint_weights[f"model.layers.{i}.{parent_name}.{name}.weight"] = w32.reshape(
                    lin.out_features, lin.in_features)
    quant.eval()
    refs = {}
    refs[REF_BF16] = copy.deepcopy(dense).to(ref_dtype).eval()
    refs[REF_CHECKPOINT] = copy.deepcopy(dense).to(ref_dtype).eval()
    params = dict(refs[REF_CHECKPOINT].named_parameters())
    for key, w in checkpoint_weights.items():
        params[key].data.copy_(w)
    if not checkpoint_weights:
        problems.append("no weight was quantized")
    return cfg, quant, dense, refs, problems


class Patch:
    """Replaces the forward of every bitsandbytes Linear4bit of a model (an instance attribute, so leaving
    restores the class's forward), counting which product each call took."""

    def __init__(self, model, torch, bnb, nf4_torch, kind):
        self.modules = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        self.torch = torch
        self.nf4_torch = nf4_torch
        self.kind = kind  # None, "exact" or "fast" for linear_4bit's mode; "dequantize" for dequantize + matmul
        self.calls = {}

    def forward(self, module, x):
        torch = self.torch
        # As Linear4bit.forward: compute in the module's compute dtype, return the input's dtype.
        inp_dtype = x.dtype
        if module.compute_dtype is not None:
            x = x.to(module.compute_dtype)
        qs = module.weight.quant_state
        bias = module.bias
        if self.kind == "dequantize":
            path = "dequantize"
            w = self.nf4_torch.dequantize(module.weight, qs).to(x.dtype)
            y = torch.nn.functional.linear(x, w, None if bias is None else bias.to(x.dtype))
        else:
            path = self.nf4_torch.linear_4bit_path(x, self.kind, qs.shape) or "dequantize"
            y = self.nf4_torch.linear_4bit(x, module.weight, qs, bias, mode=self.kind)
        if not torch.compiler.is_compiling():  # the count is the harness's, not part of the traced program
            self.calls[path] = self.calls.get(path, 0) + 1
        return y.to(inp_dtype)

    def __enter__(self):
        patcher = self
        for m in self.modules:
            m.forward = types.MethodType(lambda module, x: patcher.forward(module, x), m)
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            del m.forward
        return False


class NoPatch:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_paths(torch, quant, dense, bnb, nf4_torch):
    """name -> (model, a context manager factory that sets its product path)."""
    paths = {PATH_BNB: (quant, NoPatch)}
    for mode, name in PATH_NF4.items():
        paths[name] = (quant, lambda mode=mode: Patch(quant, torch, bnb, nf4_torch, mode))
    paths[PATH_DEQ] = (quant, lambda: Patch(quant, torch, bnb, nf4_torch, "dequantize"))
    paths[PATH_DENSE] = (dense, NoPatch)
    return paths


def quantized_linears(model, bnb, torch):
    """The modules that are quantized in the bnb-4bit model, in call order (for the dense model, the
    nn.Linear at the same places)."""
    out = []
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for _, m in parent.named_children():
                if isinstance(m, (bnb.nn.Linear4bit, torch.nn.Linear)):
                    out.append(m)
    return out


def linear_weight_bytes(model, bnb, torch):
    """Bytes the quantized linears of one step must read at least: for Linear4bit the packed codes, the
    absmax (uint8 when nested), the nested absmax and both tables; for nn.Linear its weight."""
    total = 0
    for m in quantized_linears(model, bnb, torch):
        if isinstance(m, bnb.nn.Linear4bit):
            qs = m.weight.quant_state
            total += m.weight.numel() * m.weight.element_size() + qs.absmax.numel() * qs.absmax.element_size()
            total += qs.code.numel() * qs.code.element_size()
            if qs.nested:
                total += qs.state2.absmax.numel() * qs.state2.absmax.element_size()
                total += qs.state2.code.numel() * qs.state2.code.element_size()
        else:
            total += m.weight.numel() * m.weight.element_size()
    return total


def copy_ceiling(torch):
    """Device-to-device copy rate in bytes/s (read + written), the median of 5 timed copies of 1 GiB."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * (1 << 30) / statistics.median(times)


# ---------------------------------------------------------------------------------------------------
# Decoding against the reference


def teacher_forced(model, torch, cfg, prompt, steps, forced=None):
    """Greedy decode with a static cache: logits [batch, vocab] per step (step 0: the prompt's last
    position; step s: after feeding token s-1) and the greedy tokens; `forced` (tokens per step) replaces
    the own greedy choice as the next input."""
    from transformers import StaticCache
    cache = StaticCache(config=cfg, max_cache_len=prompt.shape[1] + steps)
    logits_steps, tokens = [], []
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for s in range(steps):
            logits = out.logits[:, -1, :]
            logits_steps.append(logits.double() if logits.dtype != torch.float64 else logits.clone())
            own = logits.argmax(-1)
            tokens.append(own)
            if s == steps - 1:
                break
            nxt = own if forced is None else forced[s]
            out = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return logits_steps, tokens


def accuracy(args, torch, cfg, paths, refs, batch, gen):
    """Every path against the references at one batch size, all fed the judged reference's greedy tokens:
    per-step metrics and summaries against each reference, the distance to bitsandbytes in bf16 ulps
    (information), and the product calls each nf4 path made."""
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.prompt), generator=gen).to(args.device)
    ref_logits, ref_tokens = teacher_forced(refs[REF_CHECKPOINT], torch, cfg, prompt, args.new_tokens)
    other_logits, _ = teacher_forced(refs[REF_BF16], torch, cfg, prompt, args.new_tokens, forced=ref_tokens)
    result = {"paths": {}, "ref_max_abs_logit": [r.abs().max().item() for r in ref_logits],
              "ref_tokens": [t.tolist() for t in ref_tokens]}
    logits_of = {}
    for name, (model, patch) in paths.items():
        with patch() as p:
            logits, _ = teacher_forced(model, torch, cfg, prompt, args.new_tokens, forced=ref_tokens)
            calls = dict(getattr(p, "calls", {}))
        steps = [step_metrics(torch, r, o) for r, o in zip(ref_logits, logits)]
        other = summarize_path([step_metrics(torch, r, o) for r, o in zip(other_logits, logits)])
        result["paths"][name] = {"steps": steps, "summary": summarize_path(steps), "calls": calls,
                                 "vs_" + REF_BF16.replace(" ", "_"): other}
        logits_of[name] = logits
    base = logits_of[PATH_BNB]
    for name, logits in logits_of.items():
        ulps = [((o - b).abs().max().item() / bf16_ulp(b.abs().max().item())) for o, b in zip(logits, base)]
        same = all(torch.equal(o, b) for o, b in zip(logits, logits_of[PATH_DENSE]))
        result["paths"][name]["summary"]["max_ulps_vs_bnb"] = max(ulps)
        result["paths"][name]["summary"]["identical_to_dense"] = same
    return result


# ---------------------------------------------------------------------------------------------------
# Timing with CUDA graphs


def set_length(cache, n):
    for layer in cache.layers:
        layer.cumulative_length.fill_(n)


def graph_time(torch, graph, replays, runs, before=None):
    """Median over `runs` of the time of `replays` back-to-back replays (ms), CUDA events."""
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


def capture(torch, fn, warmups=2):
    """fn run `warmups` times on a side stream (library handles, workspaces, nf4's context and prepared
    launches come first), then captured. Returns the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def time_decode(args, torch, cfg, model, bnb, batch, gen):
    """One decode step (forward with the static cache, greedy token written back into the input
    buffer) captured and replayed --timed-tokens times per run; then the quantized linears alone."""
    from transformers import StaticCache
    warm = 2
    cache = StaticCache(config=cfg, max_cache_len=args.prompt + warm + args.timed_tokens + 1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.prompt), generator=gen).to(args.device)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = out.logits[:, -1].argmax(-1, keepdim=True).contiguous()

        def step():
            o = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            ids.copy_(o.logits[:, -1].argmax(-1, keepdim=True))

        g = capture(torch, step, warmups=warm)
        med, runs = graph_time(torch, g, args.timed_tokens, args.timing_runs,
                               before=lambda: set_length(cache, args.prompt))
        del g
        # The quantized linears alone, in the order and shapes of one step.
        lins = quantized_linears(model, bnb, torch)
        xs = [torch.randn(batch, 1, m.in_features, generator=gen).to(args.device, torch.bfloat16) for m in lins]

        def linears():
            for m, x in zip(lins, xs):
                m(x)

        gl = capture(torch, linears)
        lin_med, _ = graph_time(torch, gl, args.timed_tokens, args.timing_runs)
        del gl
    step_ms = med / args.timed_tokens
    lin_ms = lin_med / args.timed_tokens
    return {"ms_per_step": step_ms, "tokens_per_s": batch * 1e3 / step_ms, "runs_ms": runs,
            "linears_ms": lin_ms, "linears_share": lin_ms / step_ms}


def time_prefill(args, torch, cfg, model, length, gen):
    """A prefill of `length` tokens at batch 1 (the cache emptied inside the graph), captured and replayed.
    The cache holds exactly `length` tokens: transformers then needs no causal mask (sdpa's is_causal),
    and reads no tensor on the host."""
    from transformers import StaticCache
    cache = StaticCache(config=cfg, max_cache_len=length)
    prompt = torch.randint(0, cfg.vocab_size, (1, length), generator=gen).to(args.device)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)

        def run():
            set_length(cache, 0)
            model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)

        g = capture(torch, run)
        reps = max(3, args.timing_runs)
        med, runs = graph_time(torch, g, reps, args.timing_runs)
        del g
    ms = med / reps
    return {"ms": ms, "tokens_per_s": length * 1e3 / ms, "runs_ms": runs}


def graph_breaks(args, torch, cfg, model, batch, gen):
    """torch._dynamo.explain of one decode step with the static cache: graphs, breaks and their reasons."""
    from transformers import StaticCache
    cache = StaticCache(config=cfg, max_cache_len=args.prompt + 4)
    prompt = torch.randint(0, cfg.vocab_size, (batch, args.prompt), generator=gen).to(args.device)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = out.logits[:, -1].argmax(-1, keepdim=True)

        def step(i):
            return model(input_ids=i, past_key_values=cache, use_cache=True, logits_to_keep=1).logits

        torch._dynamo.reset()
        exp = torch._dynamo.explain(step)(ids)
        torch._dynamo.reset()
    reasons = []
    for r in exp.break_reasons:
        frame = r.user_stack[-1] if getattr(r, "user_stack", None) else None
        where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame is not None else ""
        text = " ".join(str(r.reason).split())[:240] + where
        if text not in reasons:
            reasons.append(text)
    return {"graphs": exp.graph_count, "breaks": exp.graph_break_count, "reasons": reasons}


# ---------------------------------------------------------------------------------------------------
# Output


def fmt(v, digits=3):
    return f"{v:.{digits}g}"


def print_accuracy(batch, res, ratio, args):
    print(f"\n### batch {batch}: {args.prompt}-token prompt, {args.new_tokens} steps teacher-forced on the "
          f"reference's greedy tokens; judged against the {args.ref_dtype} model with {REF_CHECKPOINT}, "
          f"nf4 at most {ratio}x bitsandbytes\n")
    base = res["paths"][PATH_BNB]["summary"]
    print("| path | mean abs err | / bnb | max abs err | mean KL | / bnb | max KL | top-1 = ref | "
          "row mean abs err p10/p50/p90 | row KL p10/p50/p90 | max diff vs bnb (bf16 ulps, info) | products |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, p in res["paths"].items():
        s = p["summary"]
        r_abs = s["mean_abs"] / base["mean_abs"] if base["mean_abs"] > 0 else math.inf
        r_kl = s["mean_kl"] / base["mean_kl"] if base["mean_kl"] > 0 else math.inf
        calls = ", ".join(f"{k} {v}" for k, v in sorted(p["calls"].items())) or "-"
        print(f"| {name} | {fmt(s['mean_abs'])} | {r_abs:.3f} | {fmt(s['max_abs'])} | {fmt(s['mean_kl'])} | "
              f"{r_kl:.3f} | {fmt(s['max_kl'])} | {s['top1']}/{s['rows']} | "
              f"{'/'.join(fmt(v, 2) for v in s['mean_abs_p10_p50_p90'])} | "
              f"{'/'.join(fmt(v, 2) for v in s['kl_p10_p50_p90'])} | {s['max_ulps_vs_bnb']:.1f} | {calls} |")
    key = "vs_" + REF_BF16.replace(" ", "_")
    other_base = res["paths"][PATH_BNB][key]
    print(f"\nagainst the reference with {REF_BF16} (information, not judged):\n")
    print("| path | mean abs err | / bnb | mean KL | / bnb | identical logits to dense bf16 |")
    print("|---|---|---|---|---|---|")
    for name, p in res["paths"].items():
        o = p[key]
        r_abs = o["mean_abs"] / other_base["mean_abs"] if other_base["mean_abs"] > 0 else math.inf
        r_kl = o["mean_kl"] / other_base["mean_kl"] if other_base["mean_kl"] > 0 else math.inf
        print(f"| {name} | {fmt(o['mean_abs'])} | {r_abs:.3f} | {fmt(o['mean_kl'])} | {r_kl:.3f} | "
              f"{'yes' if p['summary']['identical_to_dense'] else 'no'} |")
    print(f"\nper step against the judged reference (mean abs err / KL, mean over the {batch} row(s)):\n")
    names = list(res["paths"])
    print("| step | max abs ref logit | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for s in range(len(res["ref_max_abs_logit"])):
        cells = []
        for n in names:
            m = res["paths"][n]["steps"][s]
            cells.append(f"{fmt(statistics.fmean(m['row_mean_abs']), 2)} / {fmt(statistics.fmean(m['row_kl']), 2)}")
        print(f"| {s}{' (prompt)' if s == 0 else ''} | {res['ref_max_abs_logit'][s]:.3g} | " + " | ".join(cells) + " |")


def print_path_table(results, keys, headers, cell):
    """A markdown table, one row per path of results[path][key]: cell(result, key), "-" where the
    path has no result for the key, "failed" where it raised."""
    print("| path | " + " | ".join(headers) + " |")
    print("|---|" + "---|" * len(headers))
    for name, per in results.items():
        cells = []
        for key in keys:
            t = per.get(key)
            cells.append("-" if t is None else "failed" if "error" in t else cell(t, key))
        print(f"| {name} | " + " | ".join(cells) + " |")


def print_timing(timing, batches, env, floors):
    print(f"\n### decode in CUDA graphs (static KV cache), {env['device']}: ms per step (tokens/s), and the "
          "quantized linears alone (their share of the step)\n")
    if floors:
        print(f"Floor of the linears (their weights' bytes at the copy ceiling, {floors['ceiling'] / 1e12:.2f} TB/s "
              f"measured here): {floors['quantized_ms']:.3f} ms for the 4-bit weights ({floors['quantized_bytes'] / 1e6:.0f} MB), "
              f"{floors['dense_ms']:.3f} ms for bf16 ({floors['dense_bytes'] / 1e6:.0f} MB).\n")
    def step(t, b):
        return (f"{t['ms_per_step']:.3f} ms ({t['tokens_per_s']:.0f}/s); linears "
                f"{t['linears_ms']:.3f} ({100 * t['linears_share']:.0f}%)")
    print_path_table(timing, batches, [f"batch {b}" for b in batches], step)
    base = timing.get(PATH_BNB, {})
    print("\nspeed-up over bitsandbytes (decode step):\n")

    def speedup(t, b):
        r = base.get(b)
        return f"{r['ms_per_step'] / t['ms_per_step']:.2f}x" if r and "error" not in r else "-"
    print_path_table(timing, batches, [f"batch {b}" for b in batches], speedup)


def print_prefill(prefill):
    if prefill:
        lengths = sorted({n for per in prefill.values() for n in per})
        print("\n### prefill at batch 1 in a CUDA graph: ms (tokens/s)\n")
        print_path_table(prefill, lengths, [f"{n} tokens" for n in lengths],
                         lambda t, n: f"{t['ms']:.3f} ({t['tokens_per_s']:.0f}/s)")


def print_breaks(breaks):
    if breaks:
        print("\n### torch.compile's view of a decode step (torch._dynamo.explain)\n")
        print("| path | batch | graphs | graph breaks | reasons |")
        print("|---|---|---|---|---|")
        for name, per in breaks.items():
            for b, r in per.items():
                if "error" in r:
                    print(f"| {name} | {b} | - | - | explain failed: {r['error']} |")
                else:
                    print(f"| {name} | {b} | {r['graphs']} | {r['breaks']} | {'; '.join(r['reasons']) or '-'} |")


# ---------------------------------------------------------------------------------------------------


def main(argv=None):
    args = make_parser().parse_args(argv)
    batches = parse_sizes(args.batches, "--batches")
    prefill_lengths = parse_sizes(args.prefill, "--prefill", allow_empty=True)
    break_batches = parse_sizes(args.graph_breaks, "--graph-breaks", allow_empty=True)
    if args.new_tokens < 2 or args.prompt < 1 or args.timing_runs < 1 or args.timed_tokens < 1 or args.ratio < 1:
        print("check_decode.py: --new-tokens must be at least 2, --prompt, --timing-runs and --timed-tokens at "
              "least 1, --ratio at least 1", file=sys.stderr)
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
        print("check_decode.py: no CUDA device (--device cpu judges the paths on the CPU, without timing)",
              file=sys.stderr)
        return 2
    missing = []
    for mod in ("transformers", "bitsandbytes", "nf4_torch"):
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
    try:
        from transformers import StaticCache  # noqa: F401
        from transformers.cache_utils import StaticLayer
        assert isinstance(StaticLayer(max_cache_len=1).cumulative_length, torch.Tensor)
    except Exception as e:  # noqa: BLE001
        print(f"check_decode.py: transformers {transformers.__version__} has no StaticCache whose layers keep "
              f"their length in a tensor (transformers 5.x has): {type(e).__name__}: {e}", file=sys.stderr)
        return 2

    timing_on = args.device == "cuda" and not args.no_timing
    env = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": transformers.__version__, "bitsandbytes": getattr(bnb, "__version__", "?"),
           "nf4": nf4_torch.nf4_version()}
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    t0 = time.perf_counter()
    cfg, quant, dense, refs, problems = build_models(args, torch, bnb, args.device)
    n_quant = sum(isinstance(m, bnb.nn.Linear4bit) for m in quant.modules())
    print(f"model: Llama, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate "
          f"{cfg.intermediate_size}, heads {cfg.num_attention_heads} (kv {cfg.num_key_value_heads}), vocab "
          f"{cfg.vocab_size}, attention {cfg._attn_implementation}; {n_quant} bitsandbytes Linear4bit modules (NF4, "
          f"nested); references in {args.ref_dtype} ({REF_CHECKPOINT}, judged; {REF_BF16}, shown); built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    paths = make_paths(torch, quant, dense, bnb, nf4_torch)
    if not n_quant:
        problems.append("no bitsandbytes Linear4bit module in the model")
    results = {"env": env, "args": vars(args), "ratio": args.ratio, "accuracy": {}, "decode": {}, "prefill": {},
               "graph_breaks": {}}
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)

    for batch in batches:
        t0 = time.perf_counter()
        res = accuracy(args, torch, cfg, paths, refs, batch, gen)
        summaries = {n: p["summary"] for n, p in res["paths"].items()}
        probs = judge(summaries, args.ratio)
        for name in JUDGED:
            if not res["paths"][name]["calls"]:
                probs.append(f"{name}: no product call went through nf4")
        problems += [f"batch {batch}: {p}" for p in probs]
        results["accuracy"][batch] = res
        print_accuracy(batch, res, args.ratio, args)
        print(f"\nbatch {batch}: {'ok' if not probs else '; '.join(probs)} ({time.perf_counter() - t0:.1f} s)",
              flush=True)
    del refs
    if args.device == "cuda":
        torch.cuda.empty_cache()

    timing, prefill, breaks, floors = {}, {}, {}, {}
    if timing_on:
        t0 = time.perf_counter()
        ceiling = copy_ceiling(torch)
        qb, db = linear_weight_bytes(quant, bnb, torch), linear_weight_bytes(dense, bnb, torch)
        floors = {"ceiling": ceiling, "quantized_bytes": qb, "dense_bytes": db, "quantized_ms": qb / ceiling * 1e3,
                  "dense_ms": db / ceiling * 1e3}
        for name, (model, patch) in paths.items():
            timing[name] = {}
            with patch():
                for batch in batches:
                    try:
                        timing[name][batch] = time_decode(args, torch, cfg, model, bnb, batch, gen)
                    except Exception as e:  # noqa: BLE001 - recorded and reported as a problem
                        timing[name][batch] = {"error": f"{type(e).__name__}: {e}"}
                        problems.append(f"timing {name}, batch {batch}: {type(e).__name__}: {e}")
                    torch.cuda.empty_cache()
                if prefill_lengths:
                    prefill[name] = {}
                for n in prefill_lengths:
                    try:
                        prefill[name][n] = time_prefill(args, torch, cfg, model, n, gen)
                    except Exception as e:  # noqa: BLE001
                        prefill[name][n] = {"error": f"{type(e).__name__}: {e}"}
                        problems.append(f"prefill {name}, {n} tokens: {type(e).__name__}: {e}")
                    torch.cuda.empty_cache()
        print(f"\n(timing took {time.perf_counter() - t0:.1f} s)", flush=True)
    if break_batches:
        t0 = time.perf_counter()
        for name, (model, patch) in paths.items():
            breaks[name] = {}
            with patch():
                for batch in break_batches:
                    try:
                        breaks[name][batch] = graph_breaks(args, torch, cfg, model, batch, gen)
                    except Exception as e:  # noqa: BLE001 - recorded and reported as a problem
                        breaks[name][batch] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
                        problems.append(f"graph breaks {name}, batch {batch}: explain failed")
        print(f"\n(graph-break report took {time.perf_counter() - t0:.1f} s)", flush=True)
    results.update(decode=timing, prefill=prefill, graph_breaks=breaks, floors=floors)
    if timing_on:
        print_timing(timing, batches, env, floors)
        print_prefill(prefill)
    print_breaks(breaks)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    print()
    for p in problems:
        print("PROBLEM:", p)
    print("RESULT:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
