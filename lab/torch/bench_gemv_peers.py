#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""nf4's fused product, both contracts, against the peers': one process, the same tensors.

W [N x K] nested NF4 (blocksize 64, nested blocksize 256, bitsandbytes' second-level table), bf16;
x [m, K] bf16 for m = 1, 2, 4, ..., 256; y = x @ dequant(W)^T [m, N] bf16. Methods:

  nf4 exact            torch.ops.nf4.gemv(..., mode="exact") (nf4_torch.gemv without the quant-state
                       unpacking): the bit-exact contract, the same bits on every backend
  nf4 fast             torch.ops.nf4.gemv(..., mode="fast"): the tensor-core contract (weights rounded
                       to bf16, fp32 accumulation in an order fixed by K); what nf4_torch.linear_4bit
                       takes by default up to 256 rows
  unsloth gemv_nf4     unsloth_kernels.nf4_gemv.gemv_nf4(X[1,1,K], W, absmax, code2, absmax2, offset,
                       code, blocksize, blocksize2, shape, dtype, out) for m = 1 and
                       gemv_nf4_rows(X[m,1,K], ..., shape, out[m,1,N]) for m > 1: the kernel at every
                       m, also above the rows Unsloth's own dispatch gives it
  unsloth dispatch     what Unsloth's forward does: that kernel up to its GEMV_MAX_ROWS rows
                       (UNSLOTH_GEMV_MAX_ROWS, default 4), above that unsloth_kernels.nf4.dequantize_nf4
                       into one kept bf16 buffer, then F.linear
  bnb gemv_4bit        bitsandbytes.functional.gemv_4bit(A, B, out, state=...): one activation row
                       (its kernel is launched with n = 1), so m = 1 only; with nested statistics
                       it dequantizes the absmax first on every call, as bitsandbytes does
  bnb matmul_4bit      bitsandbytes.matmul_4bit(A, B, quant_state) without autograd: what a
                       Linear4bit forward calls; in 0.50.2 that is torch.ops.bitsandbytes.gemm_4bit,
                       its fused kernel up to 4 rows and its own heuristic above (a note says
                       which way it went)
  dequantize + matmul  torch.ops.nf4.dequantize into one kept bf16 buffer, then F.linear
  dense bf16           F.linear on the dequantized weight stored as bf16 (cuBLAS; the dense reference)

Timing: for each method a CUDA graph of --iters back-to-back calls rotating over copies of the
weight (together more than 4x the L2 cache, so each call reads its weight from memory), replayed
--repeats times interleaved with the other methods; a cell is the per-call median (min-max) in
microseconds, [p%] its share of the floor. The floor of a shape and m is the larger of two
times measured in the same run: the bytes a product must move (packed codes, uint8 absmax, fp32
nested absmax, tables, x and y) at the copy ceiling (a device-to-device copy captured and
rotated the same way), and its 2 m N K flops at the bf16 matmul ceiling (a square bf16 matmul of
--mm-size, timed the same way). On the CPU (--device cpu) the same, by wall clock.

Accuracy: each method's output for weight copy 0 against a float64 reference (the fp32 dequantized
weight, exactly the w(n, k) of docs/GEMV.md section 1, and x in float64): relative max error
max|y - ref| / max|ref|. Twice: bf16 output (the timed call), and fp32 output (nf4 with
out_dtype=float32; the peers with x given as fp32, which their kernels read as fp32 anyway),
where the bf16 rounding no longer hides the summation. nf4 exact's fp32 output is checked against
the per-element bound of docs/GEMV.md section 2; nf4 fast's outputs against the fast contract's
bound, k 2^-22 sum|w x| plus half an ulp of the output, around a float64 sum over the weights
rounded to bf16 (tests/support/gemv_fast.h). The peers are not bit-identical to nf4 (another
reduction order): the count of elements differing from nf4 exact's is shown for information only.

Batch invariance, for every method: row 0 of the m-row call against row 0 computed alone, bit
for bit (yes/no), and how many of the m rows differ from the same row alone (nf4's two modes
must match on every row; the peers are reported).

Peers come from --peers DIR (made by lab/fetch_peers.sh): DIR first on sys.path, then
`import bitsandbytes`, `from unsloth_kernels import nf4_gemv` and `nf4` (its dequantize, for the
dispatch). A peer that is missing or fails to import leaves its columns saying so; nf4 still
runs. Exit status 1 when an nf4 mode is not batch invariant or repeatable, or its error exceeds
its bound; 2 without a CUDA device.

    python bench_gemv_peers.py --peers DIR --json gemv_peers.json
    python bench_gemv_peers.py --peers DIR --shapes 4096x4096 --m 1,16,256 --iters 50 --repeats 5
    python bench_gemv_peers.py --device cpu --small      # smoke test of the harness, no GPU
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
SMALL_SHAPES = [(64, 256), (96, 512)]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
MAX_M = 256  # torch.ops.nf4.gemv's limit (NF4_GEMV_MAX_M)
BLOCKSIZE, NESTED_BLOCKSIZE = 64, 256
NF4_MODES = {"nf4 exact": "exact", "nf4 fast": "fast"}
METHODS = ("nf4 exact", "nf4 fast", "unsloth gemv_nf4", "unsloth dispatch", "bnb gemv_4bit", "bnb matmul_4bit",
           "dequantize + matmul", "dense bf16")
PEER_OF = {"unsloth gemv_nf4": "unsloth", "unsloth dispatch": "unsloth", "bnb gemv_4bit": "bnb",
           "bnb matmul_4bit": "bnb"}
# docs/GEMV.md section 2: rounding to bf16's 8 significant bits costs at most 2^-8 of the largest
# magnitude; nf4 exact's summation adds ~1e-7 before it.
BF16_REL_BOUND = 2.0 ** -8
# Significant bits of an output dtype, for the fast contract's half ulp.
OUT_BITS = {"bfloat16": 8, "float16": 11, "float32": 24}


# ---- arguments (no torch needed: --help works anywhere) --------------------------------------------

def parse_shape(text):
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is NxK, e.g. 14336x4096; got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"shape sizes must be positive, got {text!r}")
    return rows, cols


def parse_shapes(text):
    shapes = [parse_shape(s.strip()) for s in text.split(",") if s.strip()]
    if not shapes:
        raise argparse.ArgumentTypeError("--shapes needs at least one NxK")
    return shapes


def parse_ms(text):
    try:
        ms = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--m is a comma-separated list of row counts, got {text!r}") from None
    if not ms or any(m < 1 or m > MAX_M for m in ms):
        raise argparse.ArgumentTypeError(f"--m values must be 1..{MAX_M}, got {text!r}")
    return sorted(set(ms))


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return v


def make_parser():
    ap = argparse.ArgumentParser(
        description="nf4's fused NF4 product (torch.ops.nf4.gemv, exact and fast modes) against Unsloth's "
                    "gemv_nf4 and its dispatch, bitsandbytes' gemv_4bit / matmul_4bit, dequantize + matmul and "
                    "dense bf16, in one process on the same tensors, for 1 to 256 rows.",
        epilog="The module docstring says what each method and column is.")
    ap.add_argument("--peers",
                    help="folder made by lab/fetch_peers.sh (bitsandbytes/, unsloth_kernels/, unsloth_zoo/)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--shapes", type=parse_shapes, help="comma-separated NxK (default: " +
                    ",".join(f"{n}x{k}" for n, k in SHAPES) + ")")
    ap.add_argument("--m", type=parse_ms, default=MS,
                    help=f"rows of x, comma-separated, 1..{MAX_M} (default {','.join(map(str, MS))})")
    ap.add_argument("--iters", type=positive, default=100,
                    help="calls per CUDA graph (rounded to a multiple of the weight rotation)")
    ap.add_argument("--repeats", type=positive, default=15, help="interleaved replays per method")
    ap.add_argument("--copy-mib", type=positive, default=256, help="size of one copy for the copy ceiling")
    ap.add_argument("--mm-size", type=positive, default=8192,
                    help="side of the square bf16 matmul that measures the matmul ceiling (CPU: at most 256)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of the harness (wall clock)")
    ap.add_argument("--small", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--seed", type=int, default=1234)
    return ap


# ---- the shared pieces of bench_peers.py ----------------------------------------------------------------

def load_bench_peers():
    """bench_peers.py beside this file, as a module: its weights, statistics, tables and graph timing."""
    spec = importlib.util.spec_from_file_location("bench_peers", os.path.join(_HERE, "bench_peers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_peers(peers_dir):
    """bench_peers.load_peers for the products: bitsandbytes itself (gemv_4bit in its functional
    module, matmul_4bit at the top) and Unsloth's nf4_gemv, whose row limit is recorded."""
    peers = load_bench_peers().load_peers(peers_dir, unsloth_module="nf4_gemv", bnb_module="bitsandbytes")
    if peers["bnb"] is not None:
        try:
            importlib.import_module("bitsandbytes.functional")  # gemv_4bit lives there
        except Exception as e:  # noqa: BLE001
            peers["bnb"] = None
            peers["notes"]["bnb"] = f"bitsandbytes.functional not loaded: {type(e).__name__}: {e}"
    peers["unsloth_dequantize"] = None
    if peers["unsloth"] is not None:
        peers["versions"]["unsloth_gemv_max_rows"] = getattr(peers["unsloth"], "GEMV_MAX_ROWS", None)
        try:  # the dispatch's other half: dequantize, then matmul
            peers["unsloth_dequantize"] = importlib.import_module("unsloth_kernels.nf4").dequantize_nf4
        except Exception as e:  # noqa: BLE001
            peers["notes"]["unsloth dispatch"] = f"unsloth_kernels.nf4 not loaded: {type(e).__name__}: {e}"
    return peers


# ---- sizes and error measures ---------------------------------------------------------------------------

def weight_bytes(n, k):
    """Bytes of one nested NF4 weight as stored: packed codes, uint8 absmax, fp32 nested absmax, the
    16- and 256-entry fp32 tables and the fp32 offset."""
    numel = n * k
    blocks = -(-numel // BLOCKSIZE)
    blocks2 = -(-blocks // NESTED_BLOCKSIZE)
    return (numel + 1) // 2 + blocks + 4 * blocks2 + 4 * (16 + 256 + 1)


def floor_bytes(n, k, m, elem=2):
    """What one product must move: the weight, x [m, K] and y [m, N]."""
    return weight_bytes(n, k) + elem * m * (k + n)


def gemv_error_bound_factor(k):
    """docs/GEMV.md section 2: |Y - Y64| <= ((1 + 2^-24)^(d+1) - 1) * sum_k |w x|, d = log2(bit_ceil(K))."""
    d = max(0, (k - 1).bit_length())
    return (1.0 + 2.0 ** -24) ** (d + 1) - 1.0


def fast_bound(k, ref, abs_sum, out_bits):
    """The fast contract's bound on |Y - Y64| per output (tests/support/gemv_fast.h): k 2^-22 sum|w x|
    (fp32 accumulation in any fixed order), plus half an ulp of an output of `out_bits` significant
    bits. ref, abs_sum: the float64 sums over the weights rounded to x's dtype (tensors or numbers)."""
    acc = k * 2.0 ** -22 * abs_sum
    return acc + (abs(ref) + acc) * 2.0 ** -out_bits + 1e-30


def flops(n, k, m):
    return 2 * m * n * k


def rel_max_error(y, ref):
    """max |y - ref| / max |ref|, in float64 (0 when ref is all zero and y equals it)."""
    diff = (y.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    return diff / scale if scale > 0 else diff


# ---- methods ----------------------------------------------------------------------------------------------

def quant_args(w):
    """nf4_torch.QuantArgs of a bench_peers.Weight (its .args is the plain tuple), kept on it."""
    if getattr(w, "qargs", None) is None:
        import nf4_torch
        w.qargs = nf4_torch.unpack_quant_state(w.qs)
    return w.qargs


class Unsupported(Exception):
    """A method that has no form for this m (the table cell gives the reason)."""


class Ctx:
    """The per-shape tensors a method's calls use."""

    def __init__(self, weights, dense, dense_buf, peers, shape, device):
        self.weights, self.dense, self.dense_buf = weights, dense, dense_buf
        self.peers, self.shape, self.device = peers, shape, device


def make_call(name, ctx, i, x, fp32=False):
    """fn() -> y [m, N] for method `name` on weight copy i and activations x [m, K] (bf16).
    fp32=True: the fp32-output form (see the module docstring). Raises Unsupported."""
    import torch
    import torch.nn.functional as F
    n, k = ctx.shape
    m = x.shape[0]
    if name in NF4_MODES:
        w = ctx.weights[i]
        op = torch.ops.nf4.gemv.default
        a = quant_args(w)
        out_dtype = torch.float32 if fp32 else None
        mode = NF4_MODES[name]
        return lambda: op(x, w.W, a.absmax, a.quant_map, a.nested_absmax, a.nested_quant_map, a.offset, a.blocksize,
                          a.nested_blocksize, [n, k], a.quant_type, out_dtype, mode=mode)
    if name == "dequantize + matmul":
        w = ctx.weights[i]
        op = torch.ops.nf4.dequantize.out
        if fp32:
            buf = torch.empty(n, k, dtype=torch.float32, device=ctx.device)
            a = quant_args(w)._replace(dtype=torch.float32)
            xf = x.float()
            return lambda: F.linear(xf, op(w.W, *a, out=buf))
        buf = ctx.dense_buf
        return lambda: F.linear(x, op(w.W, *w.args, out=buf))
    if name == "dense bf16":
        if fp32:
            raise Unsupported("bf16 weights")
        wd = ctx.dense[i]
        return lambda: F.linear(x, wd)
    peer = ctx.peers[PEER_OF[name]]
    if peer is None:
        raise Unsupported("not loaded")
    xx = x.float() if fp32 else x
    w = ctx.weights[i]
    if name == "unsloth dispatch":
        limit = ctx.peers["versions"].get("unsloth_gemv_max_rows") or 0
        if m > limit:
            dequantize = ctx.peers["unsloth_dequantize"]
            if dequantize is None:
                raise Unsupported("not loaded")
            args = w.unsloth_args()
            buf = torch.empty(n, k, dtype=xx.dtype, device=ctx.device)
            return lambda: F.linear(xx, dequantize(*args, [n, k], xx.dtype, out=buf))
        name = "unsloth gemv_nf4"
    if name == "unsloth gemv_nf4":
        args = w.unsloth_args()  # W, absmax, code2, absmax2, offset, code, blocksize, blocksize2
        out = torch.empty(m, 1, n, dtype=xx.dtype, device=ctx.device)
        x3 = xx.view(m, 1, k)
        if m == 1:
            return lambda: peer.gemv_nf4(x3, *args, [n, k], xx.dtype, out=out).view(m, n)
        return lambda: peer.gemv_nf4_rows(x3, *args, [n, k], out).view(m, n)
    bnb = peer
    state = w.bnb_state(bnb.functional)
    if name == "bnb gemv_4bit":
        if m != 1:
            raise Unsupported("m = 1 only")
        out = torch.empty(1, 1, n, dtype=xx.dtype, device=ctx.device)
        x3 = xx.view(1, 1, k)
        gemv = bnb.functional.gemv_4bit
        return lambda: gemv(x3, w.W.t(), out=out, state=state).view(m, n)
    if name == "bnb matmul_4bit":
        mm = bnb.matmul_4bit

        def call():
            with torch.no_grad():
                return mm(xx, w.W, quant_state=state)
        return call
    raise ValueError(name)


def bnb_matmul_path(peers, m, shape, dtype, device):
    """Which way bitsandbytes' gemm_4bit dispatch goes for this call (its own heuristic), or None."""
    try:
        import torch
        from bitsandbytes.backends.cuda import ops as bnb_cuda_ops
        idx = torch.device(device).index or 0
        n, k = shape
        custom = bnb_cuda_ops._gemm_4bit_use_custom_cuda(idx, dtype, m, n, k)
        return "fused gemm_4bit kernel" if custom else "dequantize + F.linear"
    except Exception:  # noqa: BLE001 - a private helper of one release: absent elsewhere
        return None


# ---- timing ----------------------------------------------------------------------------------------------

def time_wall(call_lists, iters, repeats, bp):
    """CPU smoke test: wall clock of `iters` calls of each list, per call, interleaved."""
    times = {name: [] for name in call_lists}
    names = list(call_lists)
    for r in range(repeats):
        for name in bp.rotated(names, r):
            calls = call_lists[name]
            t0 = time.perf_counter()
            for j in range(iters):
                calls[j % len(calls)]()
            times[name].append((time.perf_counter() - t0) / iters * 1e6)
    return times


def time_calls(call_lists, iters, repeats, dev_cuda, bp, notes, key):
    """{name: [per-call us]}: each list's calls back to back in one CUDA graph (GPU) or wall clock (CPU).
    A graph holds `iters` calls rounded to a multiple of its list (one call per weight copy, in turn)."""
    if not dev_cuda:
        return time_wall(call_lists, iters, repeats, bp)
    import torch
    graphs, counts = {}, {}
    for name, calls in call_lists.items():
        count = max(iters, len(calls))
        count -= count % len(calls)
        try:
            graphs[name] = bp.capture([calls[j % len(calls)] for j in range(count)])
            counts[name] = count
        except Exception as e:  # noqa: BLE001 - a method that cannot be captured is recorded
            notes[f"{name} {key}"] = f"CUDA graph capture failed: {type(e).__name__}: {e}"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for g in graphs.values():  # one untimed replay each: first-replay costs stay out
        g.replay()
    torch.cuda.synchronize()
    times = {name: [] for name in graphs}
    for r in range(repeats):
        for name in bp.rotated(list(graphs), r):
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / counts[name])
    del graphs
    return times


def copy_ceiling(args, l2, dev_cuda, bp):
    """Bytes per second of a device-to-device copy (read + write), rotating over buffers > 4x L2."""
    import torch
    nbytes = args.copy_mib << 20
    if not dev_cuda:
        nbytes = min(nbytes, 16 << 20)
    rotation = max(2, math.ceil(4 * l2 / nbytes) + 1) if dev_cuda else 2
    device = args.device
    src = [torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(i) for i in range(rotation)]
    dst = [torch.empty_like(s) for s in src]
    calls = [(lambda i=i: dst[i].copy_(src[i])) for i in range(rotation)]
    times = time_calls({"copy": calls}, max(2 * rotation, 8), args.repeats, dev_cuda, bp, {}, "copy")["copy"]
    s = bp.summarize(times)
    del src, dst
    return 2 * nbytes / (s["median"] * 1e-6), s, rotation


def matmul_ceiling(args, dev_cuda, bp):
    """Flops per second of a square bf16 matmul of --mm-size (at most 256 on the CPU), timed like the methods."""
    import torch
    size = args.mm_size if dev_cuda else min(args.mm_size, 256)
    g = torch.Generator(args.device).manual_seed(args.seed)
    a = torch.randn(size, size, generator=g, device=args.device).to(torch.bfloat16)
    b = torch.randn(size, size, generator=g, device=args.device).to(torch.bfloat16)
    times = time_calls({"matmul": [lambda: a @ b]}, 4, args.repeats, dev_cuda, bp, {}, "matmul")["matmul"]
    s = bp.summarize(times)
    return 2 * size ** 3 / (s["median"] * 1e-6), s, size


# ---- the run ---------------------------------------------------------------------------------------------

def floor_us(n, k, m, results):
    """The larger of the memory floor and the compute floor (module docstring), in microseconds."""
    return max(floor_bytes(n, k, m) / results["copy_ceiling_Bps"], flops(n, k, m) / results["matmul_ceiling_flops"]) * 1e6


class Alone:
    """Each method's rows of x computed one at a time (row r alone), made when first asked for and
    kept for every m of the shape: the reference of the batch-invariance columns."""

    def __init__(self, ctx, x_all):
        self.ctx, self.x_all, self.rows = ctx, x_all, {}

    def row(self, name, r):
        key = (name, r)
        if key not in self.rows:
            n = self.ctx.shape[0]
            self.rows[key] = make_call(name, self.ctx, 0, self.x_all[r:r + 1].contiguous())().reshape(1, n).clone()
        return self.rows[key]


def run_shape(args, shape, peers, bp, code2, l2, dev_cuda, results, log):
    import torch
    n, k = shape
    key = f"{n}x{k}"
    dtype, device = torch.bfloat16, args.device
    notes = results["notes"]
    q_bytes = weight_bytes(n, k)
    rot_q = max(2, math.ceil(4 * l2 / q_bytes) + 1) if dev_cuda else 2
    rot_d = max(2, math.ceil(4 * l2 / (2 * n * k)) + 1) if dev_cuda else 2
    rot_d = min(rot_d, rot_q)
    weights = [bp.Weight(shape, dtype, device, args.seed + i, code2) for i in range(rot_q)]
    dense = [torch.ops.nf4.dequantize(w.W, *w.args) for w in weights[:rot_d]]
    dense_buf = torch.empty(n, k, dtype=dtype, device=device)
    ctx = Ctx(weights, dense, dense_buf, peers, shape, device)
    results["rotation"][key] = {"nf4 weights": rot_q, "dense weights": rot_d}

    mmax = max(args.m)
    g = torch.Generator(device).manual_seed(args.seed)
    x_all = torch.randn(mmax, k, generator=g, device=device, dtype=torch.float32).to(dtype)
    alone = Alone(ctx, x_all)
    # The float64 references: w(n, k) in fp32 (what nf4 dequantizes to fp32) for every method and
    # nf4 exact's bound; the same weights rounded to bf16 (what nf4 dequantizes to bf16) for nf4
    # fast's bound. x exact.
    w0 = weights[0]
    w32 = torch.ops.nf4.dequantize(w0.W, *quant_args(w0)._replace(dtype=torch.float32))
    x64 = x_all.double()
    w64 = w32.double()
    ref_all = x64 @ w64.t()
    sum_abs = x64.abs() @ w64.abs().t()
    w64 = w32.to(dtype).double()
    ref_fast = x64 @ w64.t()
    sum_abs_fast = x64.abs() @ w64.abs().t()
    del w32, w64, x64
    bound_factor = gemv_error_bound_factor(k)

    def fast_excess(y, m):
        """How far the worst element of nf4 fast's y lies outside the fast bound (<= 0: inside)."""
        bits = OUT_BITS[str(y.dtype).replace("torch.", "")]
        bound = fast_bound(k, ref_fast[:m], sum_abs_fast[:m], bits)
        return ((y.double() - ref_fast[:m]).abs() - bound).max().item()

    for m in args.m:
        mk = f"{key} m={m}"
        x = x_all[:m].contiguous()
        ref = ref_all[:m]
        errs, errs32, differ, invariance, row0 = {}, {}, {}, {}, {}
        call_lists = {}
        cells = {}
        want = None
        for name in METHODS:
            try:
                calls = [make_call(name, ctx, i, x) for i in range(rot_d if name == "dense bf16" else rot_q)]
                y = calls[0]()
                y2 = calls[0]()
            except Unsupported as e:
                cells[name] = str(e)
                continue
            except Exception as e:  # noqa: BLE001 - a peer failing on this shape is recorded, nf4 goes on
                cells[name] = "failed"
                notes[f"{name} {mk}"] = f"{type(e).__name__}: {e}"
                if name in NF4_MODES:
                    raise
                continue
            y = y.reshape(m, n)
            call_lists[name] = calls
            errs[name] = rel_max_error(y, ref)
            if name in NF4_MODES:
                if not torch.equal(bp_bits(y), bp_bits(y2.reshape(m, n))):
                    results["failures"].append(f"{name} {mk}: two calls gave different bits")
            if name == "nf4 exact":
                want = y
            elif want is not None:
                differ[name] = int((bp_bits(y) != bp_bits(want)).sum())
            if name == "nf4 fast":
                excess = fast_excess(y, m)
                if excess > 0:
                    results["failures"].append(f"nf4 fast {mk}: bf16 output outside the fast bound by {excess:g}")
            # Batch invariance: each row of the m-row call against that row alone.
            try:
                differing = [r for r in range(m) if not torch.equal(bp_bits(alone.row(name, r)), bp_bits(y[r:r + 1]))]
                invariance[name] = len(differing)
                row0[name] = 0 not in differing
                if name in NF4_MODES and differing:
                    results["failures"].append(f"{name} {mk}: {len(differing)} row(s) differ from the row alone")
            except Unsupported:
                pass
            except Exception as e:  # noqa: BLE001 - nf4's own failure stops the run below
                notes[f"{name} rows alone {mk}"] = f"{type(e).__name__}: {e}"
                if name in NF4_MODES:
                    raise
            try:
                y32 = make_call(name, ctx, 0, x, fp32=True)().reshape(m, n)
                errs32[name] = rel_max_error(y32, ref)
                if name == "nf4 exact":
                    excess = ((y32.double() - ref).abs() - bound_factor * sum_abs[:m]).max().item()
                    if excess > 0:
                        results["failures"].append(
                            f"nf4 exact {mk}: fp32 output outside docs/GEMV.md's bound by {excess:g}")
                elif name == "nf4 fast":
                    excess = fast_excess(y32, m)
                    if excess > 0:
                        results["failures"].append(f"nf4 fast {mk}: fp32 output outside the fast bound by {excess:g}")
            except Unsupported:
                pass
            except Exception as e:  # noqa: BLE001
                notes[f"{name} fp32 {mk}"] = f"{type(e).__name__}: {e}"
        if "nf4 exact" in errs and errs["nf4 exact"] > BF16_REL_BOUND:
            results["failures"].append(f"nf4 exact {mk}: bf16 relative error {errs['nf4 exact']:.3g} > 2^-8")
        if peers["bnb"] is not None and dev_cuda:
            path = bnb_matmul_path(peers, m, shape, dtype, device)
            if path:
                notes[f"bnb matmul_4bit {mk}"] = path
        if torch.cuda.is_available() and dev_cuda:
            torch.cuda.synchronize()
        times = time_calls(call_lists, args.iters, args.repeats, dev_cuda, bp, notes, mk)
        floor = floor_us(n, k, m, results)
        summary = {}
        for name, t in times.items():
            s = bp.summarize(t)
            s["pct_of_floor"] = 100.0 * floor / s["median"]
            summary[name] = s
        results["runs"][mk] = {
            "shape": [n, k], "m": m, "floor_us": floor, "floor_bytes": floor_bytes(n, k, m), "flops": flops(n, k, m),
            "times_us": summary, "unavailable": cells, "rel_error_bf16": errs, "rel_error_fp32": errs32,
            "elements_differing_from_nf4_exact": differ, "rows_differing_from_alone": invariance,
            "row0_batch_invariant": row0,
        }
        log(f"{mk}: floor {floor:.2f} us; " + ", ".join(f"{nm} {s['median']:.2f}" for nm, s in summary.items()))
    del weights, dense, dense_buf, ctx, alone, ref_all, sum_abs, ref_fast, sum_abs_fast
    if dev_cuda:
        torch.cuda.empty_cache()


def bp_bits(t):
    from nf4_torch.testing import bits
    return bits(t.contiguous())


# ---- report -----------------------------------------------------------------------------------------------

# Speedup columns: nf4 fast (linear_4bit's default path) against each peer, as the peer's time / nf4
# fast's. A column of several methods takes the fastest of them.
VERSUS = {"fast vs dense bf16": ("dense bf16",), "fast vs deq+mm": ("dequantize + matmul",),
          "fast vs bnb": ("bnb gemv_4bit", "bnb matmul_4bit"), "fast vs unsloth": ("unsloth gemv_nf4", "unsloth dispatch"),
          "fast vs exact": ("nf4 exact",)}


def report(results, args, bp, log):
    runs = results["runs"]
    keys_by_m = {}
    for mk, r in runs.items():
        keys_by_m.setdefault(r["m"], []).append(mk)

    def method_cell(r, name):
        s = r["times_us"].get(name)
        if s is None:
            return r["unavailable"].get(name, "-")
        return f"{bp.fmt_cell(s, 2)} [{s['pct_of_floor']:.0f}%]"

    def speedup(r, names):
        t = r["times_us"]
        timed = [n for n in names if n in t]
        if "nf4 fast" not in t or not timed:
            return "-"
        return f"{min(t[n]['median'] for n in timed) / t['nf4 fast']['median']:.2f}x"

    unit = "CUDA graph, per call (us)" if results["env"]["device"] != "cpu" else "CPU wall clock, per call (us)"
    for m, keys in keys_by_m.items():
        cols = ["floor"] + list(METHODS) + list(VERSUS)

        def cell(mk, c):
            r = runs[mk]
            if c == "floor":
                return f"{r['floor_us']:.2f}"
            if c in VERSUS:
                return speedup(r, VERSUS[c])
            return method_cell(r, c)
        log("")
        log(bp.format_table(f"m = {m}: {unit}, median (min-max) [% of floor]; W [N x K] nested NF4, bf16",
                            keys, cols, cell))
    log("")
    log(f"floor: the larger of the weight bytes (0.5 B/weight + uint8 absmax + fp32 nested absmax + tables) + x + y "
        f"at the copy ceiling {results['copy_ceiling_Bps'] / 1e12:.3f} TB/s (device-to-device copy, same run) and "
        f"2 m N K flops at the bf16 matmul ceiling {results['matmul_ceiling_flops'] / 1e12:.1f} TFLOP/s (square "
        f"matmul of {results['matmul']['size']}, same run). 'fast vs X': X's time / nf4 fast's (X of several "
        "methods: the fastest).")

    cols = list(METHODS)

    def icell(mk, c):
        r = runs[mk]
        if c in r["row0_batch_invariant"]:
            return "yes" if r["row0_batch_invariant"][c] else "no"
        return r["unavailable"].get(c, "-")
    log("")
    log(bp.format_table("batch invariance: row 0 of the m-row call equals row 0 computed alone, bit for bit",
                        list(runs), cols, icell))

    def rcell(mk, c):
        r = runs[mk]
        if c in r["rows_differing_from_alone"]:
            v = r["rows_differing_from_alone"][c]
            return "identical" if v == 0 else f"{v} of {r['m']} rows differ"
        return r["unavailable"].get(c, "-")
    multi = [mk for mk in runs if runs[mk]["m"] > 1]
    if multi:
        log("")
        log(bp.format_table("batch invariance, every row: the m-row call vs. each row alone (bits)", multi, cols,
                            rcell))

    for label, field in (("bf16 output", "rel_error_bf16"), ("fp32 output", "rel_error_fp32")):
        cols = list(METHODS) + ["exact smallest", "fast <= deq+mm"]

        def ecell(mk, c, field=field):
            errs = runs[mk][field]
            if c == "exact smallest":
                if "nf4 exact" not in errs:
                    return "-"
                others = [v for n, v in errs.items() if n in PEER_OF]
                return "yes" if all(errs["nf4 exact"] <= v for v in others) else "NO"
            if c == "fast <= deq+mm":
                if "nf4 fast" not in errs or "dequantize + matmul" not in errs:
                    return "-"
                return "yes" if errs["nf4 fast"] <= errs["dequantize + matmul"] else "NO"
            v = errs.get(c)
            return f"{v:.2e}" if v is not None else runs[mk]["unavailable"].get(c, "-")
        log("")
        log(bp.format_table(f"relative max error against float64, {label} (max|y - ref| / max|ref|)",
                            list(runs), cols, ecell))
    log("")
    log("fp32 output: nf4 with out_dtype=float32, the peers with x as fp32, dequantize + matmul in fp32. "
        "nf4 fast, dense bf16 and dequantize + matmul in bf16 multiply W rounded to bf16, so their error includes "
        "that rounding; 'exact smallest' compares nf4 exact with the peers, 'fast <= deq+mm' nf4 fast with "
        "dequantize + matmul.")

    def dcell(mk, c):
        d = runs[mk]["elements_differing_from_nf4_exact"]
        return str(d[c]) if c in d else ("(reference)" if c == "nf4 exact" else runs[mk]["unavailable"].get(c, "-"))
    log("")
    log(bp.format_table("elements whose bits differ from nf4 exact's (information: another reduction order)",
                        list(runs), list(METHODS), dcell))
    if results["notes"]:
        log("")
        for k, v in results["notes"].items():
            log(f"note: {k}: {v}")


def main(argv=None):
    args = make_parser().parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_gemv_peers.py: needs torch (and nf4_torch installed: pip install ./bindings/torch)",
              file=sys.stderr)
        return 2
    dev_cuda = args.device.startswith("cuda")
    if dev_cuda and not torch.cuda.is_available():
        print("bench_gemv_peers.py: no CUDA device: the timings and the peers need one "
              "(--device cpu --small runs a smoke test of the harness)", file=sys.stderr)
        return 2
    import nf4_torch
    bp = load_bench_peers()
    peers = load_peers(args.peers) if dev_cuda else load_peers_cpu(args)
    shapes = args.shapes or (SMALL_SHAPES if args.small else SHAPES)
    env = {
        "device": torch.cuda.get_device_name() if dev_cuda else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "nf4": nf4_torch.nf4_version(),
        "nf4_torch": nf4_torch.__version__, "peers": peers["versions"],
        "argv": sys.argv[1:] if argv is None else argv, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    results = {"env": env, "notes": dict(peers["notes"]), "runs": {}, "rotation": {}, "failures": []}
    limit = peers["versions"].get("unsloth_gemv_max_rows")
    if peers["unsloth"] is not None and limit and any(m > limit for m in args.m):
        results["notes"]["unsloth gemv_nf4"] = (f"Unsloth's own dispatch takes the kernel up to {limit} rows "
                                                "(UNSLOTH_GEMV_MAX_ROWS) and dequantizes + multiplies above "
                                                "('unsloth dispatch'); this column times the kernel anyway")
    log = lambda s: print(s, flush=True)  # noqa: E731
    print("# " + ", ".join(f"{k}={v}" for k, v in env.items() if k != "argv"), flush=True)
    l2 = bp.l2_bytes() if dev_cuda else 0
    results["l2_bytes"] = l2
    code2 = bp.bnb_code2().to(args.device)
    ceiling, copy_stats, copy_rot = copy_ceiling(args, l2, dev_cuda, bp)
    results["copy_ceiling_Bps"] = ceiling
    results["copy"] = {"bytes": args.copy_mib << 20, "rotation": copy_rot, "us": copy_stats}
    mm_ceiling, mm_stats, mm_size = matmul_ceiling(args, dev_cuda, bp)
    results["matmul_ceiling_flops"] = mm_ceiling
    results["matmul"] = {"size": mm_size, "us": mm_stats}
    log(f"copy ceiling: {ceiling / 1e12:.3f} TB/s (L2 {l2 >> 20} MiB); bf16 matmul ceiling: "
        f"{mm_ceiling / 1e12:.1f} TFLOP/s ({mm_size}^3)")
    for shape in shapes:
        run_shape(args, shape, peers, bp, code2, l2, dev_cuda, results, log)
    report(results, args, bp, log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if results["failures"]:
        for f in results["failures"]:
            print("FAILED:", f, file=sys.stderr)
        return 1
    return 0


def load_peers_cpu(args):
    """On the CPU the released peers cannot run (Triton, a CUDA library); a --peers folder of stand-ins
    with their signatures (the tests make one) is loaded the same way."""
    if args.peers:
        return load_peers(args.peers)
    return {"bnb": None, "unsloth": None, "unsloth_dequantize": None, "versions": {},
            "notes": {"peers": "CPU smoke test: peers left out"}}


if __name__ == "__main__":
    sys.exit(main())
