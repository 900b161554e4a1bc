#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/) from tests/data/golden.safetensors.

Run from the repository root: python3 tests/fuzz/make_seeds.py
The output is committed (kept small, well under 1 MB); rerun only when an input format changes.
Each target's input format is described at the top of its fuzz_<target>.cpp.
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden.safetensors")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")

# Small cases: nf4/fp4 x nested/flat at 3x7, odd sizes (1x1001), the largest blocksize.
CASES = ["c001", "c005", "c059", "c063", "c002", "c064", "c053", "c114"]
SUFFIXES = [".weight", ".weight.absmax", ".weight.quant_map", ".weight.nested_absmax",
            ".weight.nested_quant_map"]


def read_golden():
    with open(GOLDEN, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header_text = f.read(n)
        data = f.read()
    return header_text, json.loads(header_text), data


def tensor_bytes(header, data, name):
    b, e = header[name]["data_offsets"]
    return data[b:e]


def build_file(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes). Returns the safetensors bytes."""
    header, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + blob, text, len(blob)


def case_tensors(header, data, case, with_expected):
    out = []
    for name in sorted(k for k in header if k.startswith(case + ".")):
        if not with_expected and ".expected." in name:
            continue
        h = header[name]
        out.append((name, h["dtype"], h["shape"], tensor_bytes(header, data, name)))
    return out


def quant_state(header, data, case):
    key = next(k for k in header if k.startswith(case + ".weight.quant_state."))
    return tensor_bytes(header, data, key)


def write(target, name, raw):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(raw)


def weight_format(header, data, case):
    """A golden case's quant state and the counts the fuzz inputs describe: numel, blocksize,
    nested, nested_absmax entries (nested blocksize 256)."""
    qs = json.loads(quant_state(header, data, case))
    numel = 1
    for d in qs["shape"]:
        numel *= d
    bs = qs["blocksize"]
    blocks = -(-numel // bs)
    return qs, numel, bs, "nested_blocksize" in qs, -(-blocks // 256)


def capi_case(header, data, case, dtype, offset_ptr):
    """One tensor description in fuzz_capi's input format, all fields 'right', buffers from golden."""
    qs, numel, bs, nested, nblocks = weight_format(header, data, case)
    b = bytearray()
    b += bytes([0 if qs["quant_type"] == "nf4" else 1])        # quant_type selector
    b += bytes([dtype])                                         # out_dtype selector
    b += bytes([0]) + struct.pack("<I", numel - 1)              # numel = 1 + (numel-1) % 3000
    b += bytes([0]) + struct.pack("<I", bs.bit_length() - 6)    # blocksize = 32 << k
    b += bytes([7 if nested else 0])                            # nested
    b += bytes([0])                                             # nested_blocksize 256
    b += struct.pack("<f", qs.get("nested_offset", 0.0))
    b += bytes([0] * 5)                                         # the five counts: right
    b += bytes([0])                                             # out_bytes: right
    b += bytes([0 if offset_ptr else 1, 0])                     # pointers (bit 0: no offset ptr)
    w = case + ".weight"
    b += tensor_bytes(header, data, w)
    b += tensor_bytes(header, data, w + ".absmax")
    b += tensor_bytes(header, data, w + ".quant_map")
    b += tensor_bytes(header, data, w + ".nested_absmax") if nested else bytes(4 * nblocks)
    b += tensor_bytes(header, data, w + ".nested_quant_map") if nested else bytes(1024)
    b += struct.pack("<f", qs.get("nested_offset", 0.0))
    b += bytes(numel * (4 if dtype == 2 else 2))                # the output's initial content
    return bytes(b)


def gemv_case(header, data, case, m, x_dtype, y_dtype, offset_ptr, arena=False):
    """One product description in fuzz_gemv's input format (after its flags byte): every field
    right, the weight's buffers from golden, x from a fixed sequence of values, y zeros."""
    qs, numel, bs, nested, nblocks = weight_format(header, data, case)
    n, k = qs["shape"]
    b = bytearray()
    b += bytes([0 if qs["quant_type"] == "nf4" else 1])        # quant_type selector
    b += bytes([2])                                             # weight out_dtype (unused)
    b += bytes([0]) + struct.pack("<I", bs.bit_length() - 6)    # blocksize = 32 << k
    b += bytes([7 if nested else 0])                            # nested
    b += bytes([0])                                             # nested_blocksize 256
    b += struct.pack("<f", qs.get("nested_offset", 0.0))
    b += bytes([8]) + struct.pack("<I", n - 1)                  # n = 1 + (n-1) % 4096
    b += bytes([6]) + struct.pack("<I", k - 1)                  # k = 1 + (k-1) % 4096
    b += bytes([0]) + struct.pack("<I", m - 1)                  # m = 1 + (m-1) % 8
    b += bytes([x_dtype, y_dtype])
    b += bytes([0] * 6)                                         # numel and the five counts: right
    b += bytes([0])                                             # y_bytes: right
    b += struct.pack("<q", 0)                                   # weight out_bytes (unused)
    b += bytes([0 if offset_ptr else 1, 0, 0])                  # pointers (bit 0: no offset ptr); weight out NULL
    w = case + ".weight"
    xs = 4 if x_dtype == 2 else 2
    x = b"".join(struct.pack("<f", ((i * 7919) % 23 - 11) / 8.0)[4 - xs:] for i in range(m * k))
    bufs = [tensor_bytes(header, data, w), tensor_bytes(header, data, w + ".absmax"),
            tensor_bytes(header, data, w + ".quant_map"),
            tensor_bytes(header, data, w + ".nested_absmax") if nested else bytes(4 * nblocks),
            tensor_bytes(header, data, w + ".nested_quant_map") if nested else bytes(1024),
            struct.pack("<f", qs.get("nested_offset", 0.0)), x, bytes(m * n * (4 if y_dtype == 2 else 2))]
    if arena:  # the buffers one after another (each offset = the arena's size so far), y right after x
        offsets, size = [], 0
        for buf in bufs[:-1]:
            b += struct.pack("<I", size)
            offsets.append(size)
            size += (max(len(buf), 4) + 3) & ~3
        b += bytes([97]) + struct.pack("<I", 1)                 # y after buffer 97 % 7 = 6 (x), nudge 0
        offsets.append(size)
        arena_bytes = bytearray(size + max(len(bufs[-1]), 4))
        for off, buf in zip(offsets, bufs):
            arena_bytes[off:off + len(buf)] = buf
        b += arena_bytes
    else:
        for buf in bufs:
            b += buf
    b += bytes([2, 0x40, 0x25])                                 # launches: new x and y; x mask; the refused y
    return bytes(b)


def main():
    header_text, header, data = read_golden()

    # safetensors_header: the golden header, and the headers of the small files below.
    write("safetensors_header", "golden", struct.pack("<Q", len(data)) + header_text)
    for case in CASES:
        for with_expected in (False, True):
            raw, text, data_bytes = build_file(case_tensors(header, data, case, with_expected), {"format": "pt"})
            tag = case + ("_expected" if with_expected else "")
            write("safetensors_file", tag, raw)
            write("safetensors_header", tag, struct.pack("<Q", data_bytes) + text)
    both = case_tensors(header, data, "c001", False) + case_tensors(header, data, "c063", True)
    raw, text, data_bytes = build_file(both, {"format": "pt", "quant_method": "bitsandbytes"})
    write("safetensors_file", "two_params", raw)
    write("safetensors_header", "two_params", struct.pack("<Q", data_bytes) + text)
    write("safetensors_file", "empty_header", build_file([])[0])

    # quant_state: control byte (damage kind in bits 0-2, companion in bits 3-5) + the JSON.
    for i, case in enumerate(["c001", "c005", "c059", "c063", "c053"]):
        text = quant_state(header, data, case)
        for control in (0, 1 + 8 * i, 2 + 8 * (i + 1), 3 + 8 * (i + 2) + 64, 4, 5):
            write("quant_state", f"{case}_{control:02x}", bytes([control]) + text)

    # capi: a flags byte (bits 0-1: tensor count - 1; bit 3: grouped; bits 4-6: arena per tensor)
    # then the descriptions.
    seeds = {
        "c001_f16": bytes([0]) + capi_case(header, data, "c001", 0, True),
        "c005_bf16": bytes([0]) + capi_case(header, data, "c005", 1, False),
        "c059_f32": bytes([0]) + capi_case(header, data, "c059", 2, False),
        "c063_f16": bytes([8]) + capi_case(header, data, "c063", 0, False),
        "c053_bf16": bytes([0]) + capi_case(header, data, "c053", 1, True),
        "group3": bytes([2]) + b"".join(capi_case(header, data, c, d, False) for c, d in (("c001", 0), ("c064", 1), ("c005", 2))),
        "zeros": bytes(64),
    }
    for name, raw in seeds.items():
        write("capi", name, raw)

    # gemv: a flags byte (bit 0: arena; bit 1: nf4_gemv instead of nf4_gemv_host), then the
    # description. x dtype, y dtype: 0 f16, 1 bf16, 2 f32.
    seeds = {
        "c001_m4": bytes([0]) + gemv_case(header, data, "c001", 4, 1, 2, True),
        "c005_m8": bytes([0]) + gemv_case(header, data, "c005", 8, 0, 1, False),
        "c059_m1": bytes([2]) + gemv_case(header, data, "c059", 1, 2, 0, False),
        "c063_arena": bytes([1]) + gemv_case(header, data, "c063", 2, 1, 1, False, arena=True),
        "c064_m1": bytes([0]) + gemv_case(header, data, "c064", 1, 1, 2, False),
        "zeros": bytes(64),
    }
    for name, raw in seeds.items():
        write("gemv", name, raw)

    # model_json and safetensors_header: what the parser alone would skip or stop at (a byte order
    # mark, a NUL byte and text after it, text after the value, numbers a double cannot hold).
    bom = b"\xef\xbb\xbf"
    config = b'{"architectures": ["X"], "quantization_config": {"load_in_4bit": true}, "torch_dtype": "float16"}'
    seeds = {
        "bom_empty": bytes([1]) + bom + b"{}",
        "bom_config": bytes([2]) + bom + config,
        "nul_junk": bytes([0]) + config + b"\x00junk",
        "nul_open": bytes([3]) + b'{"quantization_config": {}}\x00{"b": [',
        "trailing_text": bytes([1]) + config + b" trailing",
        "trailing_object": bytes([1]) + b'{"a": 1}{"b": 2}',
        "numbers": bytes([2]) + b'{"a": 18446744073709551616, "b": 1e400, "c": -0.0, "torch_dtype": "float16"}',
        "index_bom": bytes([0]) + bom + b'{"weight_map": {"a": "x.safetensors"}}',
        "index_nul": bytes([0]) + b'{"weight_map": {"a": "x.safetensors"}}\x00{"weight_map": {"b": "y.safetensors"}}',
    }
    for name, raw in seeds.items():
        write("model_json", name, raw)
    entry = b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}'
    for name, text in {"bom": bom + entry, "nul_junk": entry + b"\x00junk after the header", "trailing_text": entry + b" {}",
                       "padded": entry + b"       "}.items():
        write("safetensors_header", name, struct.pack("<Q", 4) + text)

    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote the seed corpus to {OUT}: {total} bytes")


if __name__ == "__main__":
    main()
