#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nf4 side by side with bitsandbytes and Unsloth's released kernels: one process, the same tensors.

Weights: nested NF4 (blocksize 64, nested blocksize 256, bitsandbytes' second-level table), shapes
1024x4096, 2048x8192, 4096x14336, 8192x28672, output bf16 and fp16. Methods:

  nf4 op            torch.ops.nf4.dequantize, arguments unpacked once (torch's dispatcher)
  nf4 fast          nf4_torch.fast_dequantize(W, qs): the prepared launch kept on the quant state
  nf4 fast global   the same with use_global_buffer=True (one kept output buffer)
  bnb               bitsandbytes.functional.dequantize_4bit(W, quant_state)
  unsloth default   unsloth_kernels.nf4.dequantize_nf4(...): its eager launch, a new output
  unsloth planned   unsloth_kernels.nf4.dequantize_nf4_planned(...) once, then the returned relaunch
                    into one kept buffer (what its fast_dequantize does with use_global_buffer=True)

Every method's output is compared bit for bit with nf4's for every shape and dtype. Modes
(docs/DESIGN.md section 4):

  a  per call, a torch.cuda.synchronize() after each, wall clock (the Unsloth harness's shape)
  b  one cold call, L2 full of dirty lines (a buffer > 4x L2 written first), CUDA events around it
  c  one cold call, L2 full of clean lines (such a buffer read first)
  d  back-to-back calls in a CUDA graph, rotating over weights > 4x L2 (the kernel alone; nf4's
     eager helpers record the operator under capture, so only "nf4 op" is shown for nf4), with
     the device-to-device copy ceiling measured the same way
  e  dequantize then consume, as a QLoRA forward does: x @ dequantize(W).t() with x of --e-rows
     rows (16 and 4096), L2 full of dirty lines before each call (as in b), CUDA events around
     the pair; eager, and each method's pair under torch.compile (one compiled function per
     method, shape and row count, compiled before timing)
  cpu   CPU cost per call: batches of calls without synchronization, wall clock / calls
  workload  Unsloth's test_dequantize: three MLP configs, up/gate/down, a sync after each
  ncu   nothing timed: --samples single calls per method in three regimes (L2 dirty, L2 clean,
        L2 dirty then x[16] @ W.t()), each sequence printed, for a run under Nsight Compute
        (ncu --cache-control none, so that the regime each call starts in is the one made here)

In (b), (c) and (e) a spin kernel (torch.cuda._sleep) holds the GPU while the call is enqueued, so the
events time the GPU work and not the CPU's launch. Wall-clock modes (a, cpu, workload) interleave the
methods, rotating their order, and repeat: each cell is the median with the spread (min-max).
The workload also reports, per repeat, Unsloth planned's time over nf4's: each repeat runs every
row's --rounds rounds once, cut into --workload-slices slices that run row after row in a rotated
order, so that the rows of one repeat see the same machine over the same time (with one slice a
row's whole repeat runs before the next row's, and the machine's drift over that time, 12-18%
between repeats on an H200, falls between the rows).

--nf4-hints H,... (experiments) adds rows "nf4 fast hH": nf4's prepared launch with the cache hints
H (backends/cuda/launch.h's Hint bits) on sm_90's tuning-table geometry for the weight's size
class, forced through NF4_CUDA_CONFIG with NF4_CUDA_CONFIG_LIVE=1 when the launch is prepared (or
the operator is recorded, in d and under torch.compile); the tuning table's own choice is "nf4 fast".
--nf4-configs C;... does the same with whole configurations (threads,units,hints,grid,options, as
NF4_CUDA_CONFIG takes them, for every size): rows "nf4 fast cfg=C".

The peers are loaded at run time from --peers DIR (made by lab/fetch_peers.sh:
DIR/bitsandbytes, DIR/unsloth_kernels, DIR/unsloth_zoo): DIR goes first on sys.path, then
`import bitsandbytes` and `from unsloth_kernels import nf4`. Without it (or where one fails to import) its rows are left out
and the reason is printed and recorded.

    python bench_peers.py --peers DIR --json peers.json
    python bench_peers.py --peers DIR --modes a,workload --dtypes bf16 --shapes 1024x4096
    python bench_peers.py --device cpu --small --modes check,a,cpu,workload   # smoke test, no GPU
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch


SHAPES = [(1024, 4096), (2048, 8192), (4096, 14336), (8192, 28672)]
SMALL_SHAPES = [(64, 256), (96, 512)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
WORKLOAD = [  # (bsz, qlen, hd, m, dtype) as in Unsloth's test_dequantize
    (2, 3333, 2048, 8192, torch.float16),
    (5, 777, 1024, 4096, torch.bfloat16),
    (3, 2048, 4096, 14336, torch.bfloat16),
]
SMALL_WORKLOAD = [(1, 8, 128, 256, torch.float16), (1, 8, 64, 192, torch.bfloat16)]
MODES = ("check", "a", "b", "c", "d", "e", "cpu", "workload", "ncu")
E_ROWS = (16, 4096)
BLOCKSIZE, NESTED_BLOCKSIZE = 64, 256
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Cycles of torch.cuda._sleep before a timed single call: longer than any method's CPU launch time
# (mode e: a compiled function's guards and any graph break's eager part included).
SPIN_CYCLES = 400_000
E_SPIN_CYCLES = 1_500_000
# sm_90's tuning table (backends/cuda/tuning.h): the geometry of each size class, for --nf4-hints.
SM90_SMALL_ELEMENTS = 1 << 24
SM90_GEOMETRY = {"small": (512, 2, "group"), "large": (256, 2, "group")}
SM90_OPTIONS = 25


# ---- arguments --------------------------------------------------------------------------------------

def parse_shape(text):
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is ROWSxCOLS, e.g. 1024x4096; got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"shape sizes must be positive, got {text!r}")
    return rows, cols


def parse_list(text, allowed, what):
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what} must be a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return items


def make_parser():
    ap = argparse.ArgumentParser(
        description="nf4 vs bitsandbytes vs Unsloth's released kernels, in one process on the same tensors.",
        epilog="Modes: " + ", ".join(MODES) + " (see the module docstring).")
    ap.add_argument("--peers",
                    help="folder made by lab/fetch_peers.sh (bitsandbytes/, unsloth_kernels/, unsloth_zoo/)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--modes", default=",".join(MODES), type=lambda t: parse_list(t, MODES, "--modes"))
    ap.add_argument("--dtypes", default="bf16,fp16", type=lambda t: parse_list(t, tuple(DTYPES), "--dtypes"))
    ap.add_argument("--shapes", type=lambda t: [parse_shape(s) for s in t.split(",") if s.strip()],
                    help="comma-separated ROWSxCOLS (default: the four of docs/DESIGN.md section 4)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats of the wall-clock modes")
    ap.add_argument("--iters", type=int, default=200, help="calls per repeat in mode a")
    ap.add_argument("--samples", type=int, default=40, help="single cold calls per method in modes b and c")
    ap.add_argument("--graph-calls", type=int, default=32, help="calls per CUDA graph in mode d (at least the rotation)")
    ap.add_argument("--batch", type=int, default=100, help="calls per batch in the cpu mode")
    ap.add_argument("--rounds", type=int, default=500, help="rounds of the workload per repeat")
    ap.add_argument("--workload-slices", type=int, default=10,
                    help="slices of a repeat's rounds, run row after row (module docstring)")
    ap.add_argument("--e-rows", default=",".join(map(str, E_ROWS)),
                    type=lambda t: [int(v) for v in t.split(",") if v.strip()], help="rows of x in mode e")
    ap.add_argument("--e-compile", default="eager,compiled", type=lambda t: parse_list(t, ("eager", "compiled"), "--e-compile"),
                    help="mode e: eager calls, compiled ones, or both")
    ap.add_argument("--nf4-hints", default="", type=lambda t: [int(v) for v in t.split(",") if v.strip()],
                    help="experiments: extra rows 'nf4 fast hH' with cache hints H on the tuning table's geometry (sm_90)")
    ap.add_argument("--nf4-configs", default="", type=lambda t: [c.strip() for c in t.split(";") if c.strip()],
                    help="experiments: extra rows 'nf4 fast cfg=C' with NF4_CUDA_CONFIG=C (threads,units,hints,grid,options; sm_90)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of the harness (modes b-d skipped)")
    ap.add_argument("--small", action="store_true", help="tiny shapes and workload (smoke test)")
    return ap


# ---- statistics and output ----------------------------------------------------------------------------

def summarize(samples):
    """median, min, max and count of a list of numbers (None for an empty one)."""
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def fmt_cell(s, digits=1):
    if s is None:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def format_table(title, rows, columns, cell):
    """A markdown table: one row per key of `rows`, one column per name in `columns`."""
    lines = [f"### {title}", "", "| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(cell(row, c) for c in columns) + " |")
    return "\n".join(lines)


def bytes_per_element(out_dtype):
    """Bytes that must move per element (docs/DESIGN.md section 4): codes, absmax, nested absmax, output."""
    out_bytes = torch.empty((), dtype=out_dtype).element_size()
    return 0.5 + 1 / BLOCKSIZE + 4 / (BLOCKSIZE * NESTED_BLOCKSIZE) + out_bytes


def rotated(names, r):
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


# ---- peers --------------------------------------------------------------------------------------------

def load_peers(peers_dir, unsloth_module="nf4", bnb_module="bitsandbytes.functional"):
    """{"bnb": the module `bnb_module` or None, "unsloth": unsloth_kernels.<unsloth_module> or None,
    "notes": {...}, "versions": {...}}, both loaded from the folder made by lab/fetch_peers.sh.
    Import failures are notes, never errors. (bench_gemv_peers.py loads other modules with it.)"""
    import importlib
    peers = {"bnb": None, "unsloth": None, "notes": {}, "versions": {}}
    if not peers_dir:
        peers["notes"]["peers"] = "no --peers folder given: bitsandbytes and Unsloth left out"
        return peers
    peers_dir = os.path.abspath(peers_dir)
    if not os.path.isdir(peers_dir):
        peers["notes"]["peers"] = f"--peers {peers_dir} is not a folder: bitsandbytes and Unsloth left out"
        return peers
    if peers_dir not in sys.path:
        sys.path.insert(0, peers_dir)
    try:
        import bitsandbytes
        peers["bnb"] = importlib.import_module(bnb_module)
        peers["versions"]["bitsandbytes"] = getattr(bitsandbytes, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - any failure: the method is left out, the reason kept
        peers["notes"]["bnb"] = f"bitsandbytes not loaded: {type(e).__name__}: {e}"
    try:
        unsloth = importlib.import_module(f"unsloth_kernels.{unsloth_module}")
        peers["unsloth"] = unsloth
        peers["versions"]["unsloth_kernels"] = os.path.dirname(unsloth.__file__)
    except Exception as e:  # noqa: BLE001
        peers["notes"]["unsloth"] = f"Unsloth's unsloth_kernels.{unsloth_module} not loaded: {type(e).__name__}: {e}"
    return peers


# ---- weights and methods --------------------------------------------------------------------------------

def bnb_code2():
    """bitsandbytes' second-level table, from the golden file (random sorted floats where it cannot be read)."""
    from nf4_torch.testing import random_code2
    try:
        from safetensors.torch import load_file
        return load_file(os.path.join(REPO, "tests", "data", "golden.safetensors"))["c000.weight.nested_quant_map"]
    except Exception:  # noqa: BLE001 - the table's values do not change the timing
        return random_code2(generator=torch.Generator().manual_seed(0))


class Weight:
    """One nested NF4 weight [rows, cols] on the device, with what every method needs."""

    def __init__(self, shape, dtype, device, seed, code2):
        from nf4_torch.testing import make_weight
        import nf4_torch
        g = torch.Generator(device).manual_seed(seed)
        self.W, self.qs = make_weight(list(shape), blocksize=BLOCKSIZE, nested=True, nested_blocksize=NESTED_BLOCKSIZE,
                                      dtype=dtype, device=device, generator=g, code2=code2)
        self.args = tuple(nf4_torch.unpack_quant_state(self.qs))
        self.shape, self.dtype, self.device = list(shape), dtype, device
        self._bnb_state = None

    def numel(self):
        return math.prod(self.shape)

    def empty(self):
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def bnb_state(self, F):
        if self._bnb_state is None:
            s2 = self.qs.state2
            state2 = F.QuantState(absmax=s2.absmax, code=s2.code, blocksize=s2.blocksize, dtype=torch.float32)
            self._bnb_state = F.QuantState(absmax=self.qs.absmax, shape=torch.Size(self.shape), code=self.qs.code,
                                           blocksize=self.qs.blocksize, quant_type="nf4", dtype=self.dtype,
                                           offset=self.qs.offset, state2=state2)
        return self._bnb_state

    def unsloth_args(self):
        # dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, ...)
        q, s2 = self.qs, self.qs.state2
        return (self.W, q.absmax, s2.code, s2.absmax, q.offset, q.code, q.blocksize, s2.blocksize)


class Method:
    """A way to dequantize: `eager(w)` returns fn() -> output; `into(w, out)` returns fn() that
    writes `out` (for CUDA graphs), or None where the method has no such form."""

    def __init__(self, name, eager, into=None, graph_note=None):
        self.name, self.eager, self.into, self.graph_note = name, eager, into, graph_note


def nf4_methods():
    import nf4_torch
    op, op_out = torch.ops.nf4.dequantize.default, torch.ops.nf4.dequantize.out
    fast = nf4_torch.fast_dequantize
    note = "records torch.ops.nf4.dequantize under capture: the nf4 op row"
    return [
        Method("nf4 op", lambda w: (lambda: op(w.W, *w.args)), lambda w, out: (lambda: op_out(w.W, *w.args, out=out))),
        Method("nf4 fast", lambda w: (lambda: fast(w.W, w.qs)), graph_note=note),
        Method("nf4 fast global", lambda w: (lambda: fast(w.W, w.qs, use_global_buffer=True)), graph_note=note),
    ]


def sm90_config(numel, hints):
    """NF4_CUDA_CONFIG for sm_90's tuning-table geometry of a weight of numel elements, with `hints`."""
    threads, units, grid = SM90_GEOMETRY["small" if numel < SM90_SMALL_ELEMENTS else "large"]
    return f"{threads},{units},{hints},{grid},{SM90_OPTIONS}"


class forced_config:
    """Sets NF4_CUDA_CONFIG while nf4 plans a call (read per call with NF4_CUDA_CONFIG_LIVE=1)."""

    def __init__(self, config):
        self.config = config

    def __enter__(self):
        os.environ["NF4_CUDA_CONFIG"] = self.config

    def __exit__(self, *exc):
        os.environ.pop("NF4_CUDA_CONFIG", None)


def forced_rows(hints, configs):
    """{row name: its NF4_CUDA_CONFIG as a function of the weight} for --nf4-hints and --nf4-configs."""
    rows = {f"nf4 fast h{h}": (lambda w, h=h: sm90_config(w.numel(), h)) for h in hints}
    rows.update({f"nf4 fast cfg={c}": (lambda w, c=c: c) for c in configs})
    return rows


def nf4_forced_methods(hints, configs):
    """Rows "nf4 fast hH" and "nf4 fast cfg=C": a prepared launch made under the forced configuration
    on its own copy of the quant state, then relaunched as "nf4 fast" is (the configuration is read
    only when the launch is prepared, so later calls cost what nf4 fast's do)."""
    import copy
    import nf4_torch
    fast, op_out = nf4_torch.fast_dequantize, torch.ops.nf4.dequantize.out
    methods = []
    for name, config_of in forced_rows(hints, configs).items():
        def eager(w, config_of=config_of):
            qs = copy.copy(w.qs)  # before any call: the copy holds no prepared launch
            qs.__dict__.pop("_nf4_prepared", None)
            with forced_config(config_of(w)):
                fast(w.W, qs)  # prepares with the forced configuration
            return lambda: fast(w.W, qs)

        def into(w, out, config_of=config_of):
            cfg = config_of(w)

            def call():
                with forced_config(cfg):
                    return op_out(w.W, *w.args, out=out)
            return call
        methods.append(Method(name, eager, into))
    return methods


def bnb_methods(F):
    def eager(w):
        state = w.bnb_state(F)
        return lambda: F.dequantize_4bit(w.W, state)

    def into(w, out):
        state = w.bnb_state(F)
        return lambda: F.dequantize_4bit(w.W, state, out=out)

    return [Method("bnb", eager, into)]


def unsloth_methods(U):
    def default(w):
        a = w.unsloth_args()
        return lambda: U.dequantize_nf4(*a, w.shape, w.dtype)

    def default_into(w, out):
        a = w.unsloth_args()
        return lambda: U.dequantize_nf4(*a, w.shape, w.dtype, out=out)

    def planned_into(w, out):
        # The first call launches eagerly into `out` and returns the relaunch (None where Triton's
        # fast launcher is unavailable); a relaunch returning False must take the eager launch.
        a = w.unsloth_args()
        rerun = U.dequantize_nf4_planned(*a, out)

        def call():
            if rerun is None or not rerun(out):
                U.dequantize_nf4(*a, w.shape, w.dtype, out=out)
            return out
        return call

    def planned(w):
        return planned_into(w, w.empty())

    return [Method("unsloth default", default, default_into), Method("unsloth planned", planned, planned_into)]


def all_methods(peers, hints=(), configs=()):
    methods = nf4_methods() + nf4_forced_methods(hints, configs)
    if peers["bnb"] is not None:
        methods += bnb_methods(peers["bnb"])
    if peers["unsloth"] is not None:
        methods += unsloth_methods(peers["unsloth"])
    return methods


# ---- timing ------------------------------------------------------------------------------------------------

class Device:
    """Synchronization and events for the device in use (no-ops and wall clock on the CPU)."""

    def __init__(self, name):
        self.cuda = name.startswith("cuda")
        self.name = name

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def differing(a, b):
    from nf4_torch.testing import bits
    if a.shape != b.shape or a.dtype != b.dtype:
        return a.numel()
    return int((bits(a.contiguous()) != bits(b.contiguous())).sum())


def check_bits(fns, want):
    """{method: elements differing from nf4's output} (calls each fn once)."""
    return {name: differing(fn(), want) for name, fn in fns.items()}


def time_interleaved(fns, dev, calls, repeats, sync_each_call):
    """Wall clock per call in microseconds, `repeats` rounds of `calls` calls per method, the
    methods interleaved. sync_each_call: mode a (a sync after every call, so the time includes the
    kernel); otherwise the CPU cost per call (one sync after the batch, which stays far below the
    CUDA launch queue's depth, so no call waits for the GPU)."""
    times = {n: [] for n in fns}
    names = list(fns)
    for r in range(repeats):
        for n in rotated(names, r):
            fn = fns[n]
            dev.sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
                if sync_each_call:
                    dev.sync()
            times[n].append((time.perf_counter() - t0) / calls * 1e6)
            dev.sync()
    return times


def l2_bytes():
    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20))


def time_cold(fns, flush, dirty, samples, spin=SPIN_CYCLES):
    """Modes b (dirty) and c (clean): one call after filling L2 from `flush`, CUDA events around it;
    `spin` GPU cycles between the fill and the call keep the launch off the timed span."""
    times = {n: [] for n in fns}
    names = list(fns)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    acc = torch.empty((), dtype=torch.float32, device=flush.device)
    for s in range(samples):
        for n in rotated(names, s):
            if dirty:
                flush.fill_(float(s % 7))
            else:
                acc.copy_(flush.sum(dtype=torch.float32))
            torch.cuda._sleep(spin)
            start.record()
            fns[n]()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) * 1e3)
    return times


def capture(calls):
    """A CUDA graph of the calls, made after one warm-up of each on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def time_graphs(graphs, calls_per_graph, repeats):
    """Mode d: replays of each graph, interleaved, per call in microseconds."""
    times = {n: [] for n in graphs}
    names = list(graphs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    for r in range(repeats):
        for n in rotated(names, r):
            start.record()
            graphs[n].replay()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) * 1e3 / calls_per_graph)
    return times


# ---- the run -----------------------------------------------------------------------------------------------

def run_shapes(args, peers, dev, methods, results, log):
    code2 = bnb_code2().to(dev.name)
    shapes = args.shapes or (SMALL_SHAPES if args.small else SHAPES)
    l2 = l2_bytes() if dev.cuda else 0
    flush = None
    if dev.cuda and ({"b", "c", "d", "e", "ncu"} & set(args.modes)):
        flush = torch.empty(max(4 * l2 + (1 << 20), 64 << 20) // 4 + 1, dtype=torch.float32, device=dev.name)
        flush.fill_(1.0)
        results["l2_bytes"] = l2
        results["flush_bytes"] = flush.numel() * 4
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for shape in shapes:
            key = f"{shape[0]}x{shape[1]} {dname}"
            w = Weight(shape, dtype, dev.name, 1234, code2)
            fns = {}
            for m in methods:
                try:
                    fns[m.name] = m.eager(w)
                    fns[m.name]()  # warm-up: plans, compiled kernels, contexts
                except Exception as e:  # noqa: BLE001 - a peer failing on this shape is recorded
                    results["notes"][f"{m.name} {key}"] = f"{type(e).__name__}: {e}"
                    fns.pop(m.name, None)
            dev.sync()
            want = fns["nf4 op"]().clone()
            bits = check_bits(fns, want)
            results["bits_differing"][key] = bits
            bad = {n: b for n, b in bits.items() if b}
            log(f"{key}: outputs compared with nf4 op: " + ("all identical" if not bad else f"DIFFER {bad}"))
            if "a" in args.modes:
                results["a"][key] = {n: summarize(t) for n, t in
                                     time_interleaved(fns, dev, args.iters, args.repeats, sync_each_call=True).items()}
            if "cpu" in args.modes:
                results["cpu"][key] = {n: summarize(t) for n, t in
                                       time_interleaved(fns, dev, args.batch, args.repeats, sync_each_call=False).items()}
            for mode, dirty in (("b", True), ("c", False)):
                if mode in args.modes and dev.cuda:
                    results[mode][key] = {n: summarize(t) for n, t in time_cold(fns, flush, dirty, args.samples).items()}
            if "d" in args.modes and dev.cuda:
                results["d"][key] = run_graphs(args, w, methods, l2, code2, results, key)
            if "e" in args.modes and dev.cuda:
                for row, cells in run_consume(args, w, fns, flush, results, key).items():
                    results["e"][row] = cells
            if "ncu" in args.modes and dev.cuda:
                run_profile(args, w, fns, flush, key, log)
            del fns, want, w
            if dev.cuda:
                torch.cuda.empty_cache()


# Methods whose result is not what a training step consumes (the operator through the dispatcher,
# the kept buffer): left out of mode e.
E_SKIP = ("nf4 op", "nf4 fast global")


def allow_recompiles():
    """Mode e compiles one function per method, shape and row count from the same code: let
    dynamo keep them all instead of falling back to eager after its default limit."""
    import torch._dynamo
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)


def time_consume(fns, flush, samples):
    """Mode e: one dequantize + matmul after filling L2 with dirty lines, CUDA events around it
    (mode b's timing, with a longer spin: the consumer's matmul takes longer to launch)."""
    return time_cold(fns, flush, True, samples, spin=E_SPIN_CYCLES)


def run_consume(args, w, fns, flush, results, key):
    """Mode e: {"<key> x<rows> eager|compiled": {method: summary}}: y = x @ dequantize(W).t()."""
    out = {}
    forced_cfg = forced_configs(w, fns, args)
    for rows in args.e_rows:
        g = torch.Generator(w.device).manual_seed(rows)
        x = (torch.randn(rows, w.shape[1], device=w.device, generator=g) * 0.1).to(w.dtype)
        pairs = {}
        for kind in args.e_compile:
            for n, dq in fns.items():
                if n in E_SKIP:
                    continue
                name = f"{n}" if kind == "eager" else f"{n} compiled"
                try:
                    if kind == "eager":
                        fn = (lambda dq=dq: x @ dq().t())
                    else:
                        allow_recompiles()
                        fn = torch.compile(lambda dq=dq: x @ dq().t(), dynamic=False)
                    if n in forced_cfg:
                        fn = (lambda fn=fn, cfg=forced_cfg[n]: _forced_call(fn, cfg))
                    want = x @ fns["nf4 op"]().t()
                    got = fn()  # warm-up (and compilation)
                    bad = differing(got, want)
                    if bad:
                        results["notes"][f"e {key} x{rows} {name}"] = f"{bad} elements of y differ from nf4 op's"
                    pairs.setdefault(kind, {})[name] = fn
                except Exception as e:  # noqa: BLE001 - a method that cannot run this way is recorded
                    results["notes"][f"e {key} x{rows} {name}"] = f"{type(e).__name__}: {str(e)[:300]}"
        torch.cuda.synchronize()
        for kind, kfns in pairs.items():
            out[f"{key} x{rows} {kind}"] = {n.replace(" compiled", ""): summarize(t)
                                            for n, t in time_consume(kfns, flush, args.samples).items()}
        del pairs, x
    return out


def forced_configs(w, fns, args):
    """{method name: its NF4_CUDA_CONFIG} for the forced rows among `fns`."""
    rows = forced_rows(args.nf4_hints, args.nf4_configs)
    return {n: rows[n](w) for n in fns if n in rows}


def _forced_call(fn, cfg):
    with forced_config(cfg):
        return fn()


def run_profile(args, w, fns, flush, key, log):
    """Mode ncu: single calls in three regimes, nothing timed here; the order is printed so that
    each kernel Nsight Compute lists can be matched to its method and regime."""
    forced_cfg = forced_configs(w, fns, args)
    x = (torch.randn(16, w.shape[1], device=w.device) * 0.1).to(w.dtype)
    acc = torch.empty((), dtype=torch.float32, device=w.device)
    names = [n for n in fns if n not in E_SKIP]
    for s in range(args.samples):
        for regime in ("dirty", "clean", "consume"):
            for n in rotated(names, s):
                if regime == "clean":
                    acc.copy_(flush.sum(dtype=torch.float32))
                else:
                    flush.fill_(float(s % 7))
                torch.cuda._sleep(SPIN_CYCLES)
                if regime == "consume":
                    fn = lambda: x @ fns[n]().t()  # noqa: E731
                else:
                    fn = fns[n]
                if n in forced_cfg:
                    _forced_call(fn, forced_cfg[n])
                else:
                    fn()
                torch.cuda.synchronize()
                log(f"ncu-seq\t{key}\t{regime}\t{n}\t{s}")


def run_graphs(args, w, methods, l2, code2, results, key):
    per_weight = w.numel() * bytes_per_element(w.dtype)
    rotation = max(2, math.ceil(4 * l2 / per_weight) + 1)
    calls = max(args.graph_calls, rotation)
    calls -= calls % rotation
    weights = [w] + [Weight(w.shape, w.dtype, w.device, 1234 + i, code2) for i in range(1, rotation)]
    outs = [x.empty() for x in weights]
    graphs = {}
    for m in methods:
        if m.into is None:
            results["notes"].setdefault(f"d: {m.name}", m.graph_note or "no out= form")
            continue
        try:
            fns = [m.into(x, o) for x, o in zip(weights, outs)]
            graphs[m.name] = capture([fns[i % rotation] for i in range(calls)])
        except Exception as e:  # noqa: BLE001
            results["notes"][f"d: {m.name} {key}"] = f"capture failed: {type(e).__name__}: {e}"
    # The copy ceiling: the same bytes read + written per call, rotating the same way.
    nbytes = int(per_weight / 2)  # a copy of nbytes reads and writes per_weight bytes
    src = [torch.empty(nbytes, dtype=torch.uint8, device=w.device).fill_(i) for i in range(rotation)]
    dst = [torch.empty_like(s) for s in src]
    graphs["copy"] = capture([(lambda i=i: dst[i % rotation].copy_(src[i % rotation])) for i in range(calls)])
    times = {n: summarize(t) for n, t in time_graphs(graphs, calls, args.repeats).items()}
    copy_us = times["copy"]["median"]
    ceiling = 2 * nbytes / (copy_us * 1e-6)  # bytes/s
    results.setdefault("copy_ceiling_GBps", {})[key] = ceiling / 1e9
    for n, t in times.items():
        if n != "copy" and t is not None:
            t["pct_of_copy"] = 100.0 * (per_weight / ceiling) / (t["median"] * 1e-6)
    results.setdefault("graph_rotation", {})[key] = {"weights": rotation, "calls": calls}
    del graphs, weights, outs, src, dst
    return times


def run_workload(args, peers, dev, results, log):
    import nf4_torch
    code2 = bnb_code2().to(dev.name)
    configs = SMALL_WORKLOAD if args.small else WORKLOAD
    rows = {"nf4": lambda w: (lambda: nf4_torch.fast_dequantize(w.W, w.qs)),
            "nf4 global": lambda w: (lambda: nf4_torch.fast_dequantize(w.W, w.qs, use_global_buffer=True))}
    by_name = {m.name: m for m in all_methods(peers, args.nf4_hints, args.nf4_configs)}
    for name in forced_rows(args.nf4_hints, args.nf4_configs):
        rows[name.replace("nf4 fast ", "nf4 ")] = by_name[name].eager
    for peer_row, method in (("unsloth default", "unsloth default"), ("unsloth planned", "unsloth planned"),
                             ("bitsandbytes", "bnb")):
        if method in by_name:
            rows[peer_row] = by_name[method].eager
    mlps = []
    for i, (_, _, hd, m, dtype) in enumerate(configs):
        shapes = {"up": (m, hd), "gate": (m, hd), "down": (hd, m)}
        mlps.append({k: Weight(s, dtype, dev.name, 3407 + 10 * i + j, code2) for j, (k, s) in enumerate(shapes.items())})
    # One function per row and weight, made (and checked bit for bit) before timing.
    calls, mismatches = {}, {}
    for row, make in rows.items():
        try:
            fns = [[make(mlp[k]) for k in ("up", "gate", "down")] for mlp in mlps]
            mismatches[row] = sum(differing(f(), torch.ops.nf4.dequantize(mlp[k].W, *mlp[k].args))
                                  for fl, mlp in zip(fns, mlps) for f, k in zip(fl, ("up", "gate", "down")))
            calls[row] = fns
        except Exception as e:  # noqa: BLE001
            results["notes"][f"workload {row}"] = f"{type(e).__name__}: {e}"
    dev.sync()

    def harness(fns, rounds):
        # The harness's mlp_dequantize: up, gate, down, each result transposed, each followed by a sync.
        for fl in fns:
            for _ in range(rounds):
                for f in fl:
                    f().t()
                    dev.sync()

    seconds = {r: [] for r in calls}
    names = list(calls)
    slices = max(1, min(args.workload_slices, args.rounds))
    for rep in range(args.repeats):
        total = dict.fromkeys(names, 0.0)
        for sl in range(slices):
            rounds = args.rounds // slices + (1 if sl < args.rounds % slices else 0)
            for r in rotated(names, rep + sl):
                dev.sync()
                t0 = time.perf_counter()
                harness(calls[r], rounds)
                total[r] += time.perf_counter() - t0
        for r in names:
            seconds[r].append(total[r])
    # Repeat k ran every row once: the ratio of Unsloth planned to each nf4 row, repeat by repeat.
    per_repeat = {}
    if "unsloth planned" in seconds:
        for r in (n for n in seconds if n.startswith("nf4")):
            per_repeat[r] = [u / t for u, t in zip(seconds["unsloth planned"], seconds[r])]
    results["workload"] = {
        "configs": [list(c[:4]) + [str(c[4]).replace("torch.", "")] for c in configs],
        "rounds": args.rounds,
        "slices": slices,
        "seconds": {r: summarize(s) for r, s in seconds.items()},
        "samples": seconds,
        "unsloth_planned_over_row_per_repeat": per_repeat,
        "bits_differing": mismatches,
    }
    results["bits_differing"]["workload"] = mismatches
    log("workload: outputs compared with nf4 op: " + ("all identical" if not any(mismatches.values()) else
                                                      f"DIFFER {mismatches}"))


def report(results, args, log):
    modes = [("a", "per call, sync after each, wall clock (us)"),
             ("b", "one cold call, L2 dirty, GPU time (us)"),
             ("c", "one cold call, L2 clean, GPU time (us)"),
             ("d", "back-to-back in a CUDA graph, per call (us)"),
             ("e", "dequantize + x @ W.t(), L2 dirty, GPU time (us)"),
             ("cpu", "CPU cost per call, no sync (us)")]
    for mode, title in modes:
        table = results.get(mode) or {}
        if not table:
            continue
        columns = []
        for row in table.values():
            for n in row:
                if n not in columns:
                    columns.append(n)

        def cell(row, c, table=table, mode=mode):
            s = table[row].get(c)
            text = fmt_cell(s, 2 if mode == "d" else 1)
            if s is not None and "pct_of_copy" in s:
                text += f" [{s['pct_of_copy']:.0f}%]"
            return text
        log("")
        log(format_table(f"({mode}) {title}", list(table), columns, cell))
    w = results.get("workload")
    if w:
        log("")
        log(format_table(f"Unsloth test_dequantize workload, {w['rounds']} rounds x {len(w['configs'])} configs "
                         f"in {w['slices']} slices a repeat (s)",
                         list(w["seconds"]), ["seconds", "vs nf4", "bits differing"],
                         lambda r, c: {"seconds": fmt_cell(w["seconds"][r], 3),
                                       "vs nf4": (f"{w['seconds'][r]['median'] / w['seconds']['nf4']['median']:.2f}x"
                                                  if "nf4" in w["seconds"] else "-"),
                                       "bits differing": str(w["bits_differing"].get(r, "-"))}[c]))
        for r, ratios in w["unsloth_planned_over_row_per_repeat"].items():
            log(f"unsloth planned / {r}, repeat by repeat: " + " ".join(f"{v:.3f}x" for v in ratios))
    if results["notes"]:
        log("")
        for k, v in results["notes"].items():
            log(f"note: {k}: {v}")


def main(argv=None):
    args = make_parser().parse_args(argv)
    dev = Device(args.device)
    if dev.cuda and not torch.cuda.is_available():
        print("bench_peers.py: no CUDA device (use --device cpu --small for a smoke test of the harness)", file=sys.stderr)
        return 2
    import nf4_torch
    peers = load_peers(args.peers)
    if args.nf4_hints or args.nf4_configs:
        # Before the first nf4 call: the CUDA context reads NF4_CUDA_CONFIG per call from then on.
        os.environ["NF4_CUDA_CONFIG_LIVE"] = "1"
        os.environ.pop("NF4_CUDA_CONFIG", None)
    methods = all_methods(peers, args.nf4_hints, args.nf4_configs)
    env = {
        "device": torch.cuda.get_device_name() if dev.cuda else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "nf4": nf4_torch.nf4_version(),
        "nf4_torch": nf4_torch.__version__, "peers": peers["versions"], "argv": sys.argv[1:] if argv is None else argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    results = {"env": env, "notes": dict(peers["notes"]), "bits_differing": {},
               "a": {}, "b": {}, "c": {}, "d": {}, "e": {}, "cpu": {}}
    if not dev.cuda:
        for mode in ("b", "c", "d", "e", "ncu"):
            if mode in args.modes:
                results["notes"][f"mode {mode}"] = "needs a CUDA device: skipped"
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items() if k != "argv"), flush=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if set(args.modes) & {"check", "a", "b", "c", "d", "e", "cpu", "ncu"}:
        run_shapes(args, peers, dev, methods, results, log)
    if "workload" in args.modes:
        run_workload(args, peers, dev, results, log)
    report(results, args, log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    differ = {k: {n: b for n, b in v.items() if b} for k, v in results["bits_differing"].items()}
    differ = {k: v for k, v in differ.items() if v}
    if differ:
        print(f"ERROR: outputs differ from nf4's: {differ}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
