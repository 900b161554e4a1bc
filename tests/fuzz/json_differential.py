#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The JSON differential: nf4's readers against Python's json module, an independent parser.

Every input (fuzz_model_json's format: a control byte, then the text; fuzz_safetensors_header's:
8 bytes of data-section size, then the header) goes through nf4 (the json_oracle program prints
what nf4 made of it) and through Python's json, strict: the text must be UTF-8, with no byte
order mark, no NaN or Infinity, no repeated key in an object, nothing but whitespace after the
value. A finding is an input that nf4 accepts but Python refuses, or reads as another value:
  - parse_json_bounded: the same value (types too: 1 is not 1.0, -0.0 is not 0.0);
  - dense_model_config: the edited text is JSON, every top-level member but quantization_config
    and the dtype members is the input's, the dtype members are set;
  - parse_index: the same weight_map and metadata;
  - parse_header: the same tensor names, dtypes, shapes and offsets, the same metadata.
nf4 refusing what Python accepts is allowed (it is stricter: depth, sizes, numbers a double
cannot hold), and counted.

  json_differential.py --oracle BUILD/json_oracle [--generated] [--model-json DIR]... [--header DIR]...

--generated adds this script's own hostile inputs (byte order marks, NUL bytes, trailing text,
numbers past 64 bits or the double range, surrogates, repeated keys, ...). Exit status 1 on any
finding, each printed with its file.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile


class Refused(Exception):
    pass


def strict_loads(raw):
    """Python's reading of raw bytes as strict JSON, or Refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Refused(f"not UTF-8: {e}")

    def no_constant(name):
        raise Refused(f"{name} is not JSON")

    def no_repeats(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise Refused("a repeated key")
        return dict(pairs)

    try:
        return json.loads(text, parse_constant=no_constant, object_pairs_hook=no_repeats)
    except (ValueError, RecursionError) as e:
        raise Refused(str(e))


def same(a, b):
    """Equal as JSON values, types included (bool, int and float apart; -0.0 apart from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check_model_json(raw, nf4, findings, stats):
    text = raw[1:]
    try:
        py = strict_loads(text)
        py_error = None
    except Refused as e:
        py, py_error = None, str(e)
    accepted = nf4["json"] is not None
    stats["accepted" if accepted else "refused"] += 1
    if accepted and py_error is not None:
        findings.append(f"parse_json_bounded accepts what Python refuses ({py_error})")
        return
    if not accepted:
        if py_error is None:
            stats["stricter"] += 1
        for what in ("config", "index"):
            if nf4[what] is not None:
                findings.append(f"{what}: accepted although parse_json_bounded refuses the text")
        return
    # nf4's value, as it dumped it (round-tripped through Python's reader of that dump).
    value = json.loads(json.dumps(nf4["json"]))
    if not same(value, py):
        findings.append("parse_json_bounded reads another value than Python")
    if nf4["config"] is not None:
        if not isinstance(py, dict):
            findings.append("config: accepted a text that is not an object")
        else:
            try:
                out = strict_loads(nf4["config"].encode("utf-8"))
            except Refused as e:
                findings.append(f"config: the edited config.json is not JSON to Python ({e})")
                return
            dtype = nf4["dtype"]
            expected = {k: v for k, v in py.items() if k != "quantization_config"}
            if dtype:
                for k in ("torch_dtype", "dtype"):
                    if k in expected:
                        expected[k] = dtype
                if "torch_dtype" not in expected and "dtype" not in expected:
                    expected["torch_dtype"] = dtype
            if not same(out, expected):
                findings.append("config: the edited config.json differs from the input by more than the edit")
    if nf4["index"] is not None:
        if not isinstance(py, dict) or not isinstance(py.get("weight_map"), dict):
            findings.append("index: accepted without a weight_map object")
        else:
            metadata = py.get("metadata") or {}
            if not same(nf4["index"]["weight_map"], py["weight_map"]) or not same(nf4["index"]["metadata"], metadata):
                findings.append("index: another weight_map or metadata than Python reads")


def check_header(raw, nf4, findings, stats):
    try:
        py = strict_loads(raw[8:])
        py_error = None
    except Refused as e:
        py, py_error = None, str(e)
    accepted = nf4["header"] is not None
    stats["accepted" if accepted else "refused"] += 1
    if not accepted:
        stats["stricter"] += py_error is None
        return
    if py_error is not None:
        findings.append(f"parse_header accepts what Python refuses ({py_error})")
        return
    if not isinstance(py, dict):
        findings.append("parse_header accepts a header that is not an object")
        return
    metadata = py.get("__metadata__", {})
    if not same(nf4["header"]["metadata"], metadata):
        findings.append("parse_header reads other metadata than Python")
    mine = {t[0]: t[1:] for t in nf4["header"]["tensors"]}
    theirs = {k: v for k, v in py.items() if k != "__metadata__"}
    if mine.keys() != theirs.keys():
        findings.append("parse_header finds other tensor names than Python")
        return
    for name, (dtype, shape, begin, end) in mine.items():
        t = theirs[name]
        if not isinstance(t, dict) or t.get("dtype") != dtype or not same(t.get("shape"), shape) or \
                not same(t.get("data_offsets"), [begin, end]):
            findings.append(f"parse_header reads tensor {name!r} otherwise than Python")


BOM = b"\xef\xbb\xbf"
HEADER = b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}'


def generated():
    """(kind, name, bytes): hostile inputs of both formats."""
    texts = {
        "bom_empty": BOM + b"{}",
        "bom_config": BOM + b'{"architectures": ["X"], "quantization_config": {"load_in_4bit": true}}',
        "nul_then_junk": b'{"a": 1}\x00junk',
        "nul_then_json": b'{"quantization_config": {}}\x00{"b": [',
        "nul_in_string": b'{"a": "x\x00y"}',
        "trailing_text": b'{"a": 1} trailing',
        "trailing_object": b'{"a": 1}{"b": 2}',
        "trailing_whitespace": b'{"a": 1} \r\n\t',
        "leading_whitespace": b' \n{"torch_dtype": "float16", "quantization_config": {"x": 1}}',
        "int_past_64_bits": b'{"a": 18446744073709551616}',
        "int_min_minus_one": b'{"a": -9223372036854775809}',
        "uint_max": b'{"a": 18446744073709551615, "b": -9223372036854775808}',
        "float_past_range": b'{"a": 1e400}',
        "negative_zero": b'{"a": -0.0, "b": -0, "c": 0.1, "d": 1E+2}',
        "nan": b'{"a": NaN}',
        "infinity": b'{"a": -Infinity}',
        "lone_surrogate": b'{"a": "\\ud800"}',
        "surrogate_pair": b'{"a": "\\ud83d\\ude00", "b": "\\u00e9"}',
        "escaped_nul": b'{"a": "\\u0000"}',
        "cesu_surrogate": b'{"a": "\xed\xa0\x80"}',
        "latin1": b'{"a": "\xe9"}',
        "overlong": b'{"a": "\xc0\xaf"}',
        "repeated_key": b'{"a": 1, "a": 2}',
        "repeated_escaped_key": b'{"quantization_config": 1, "quantization\\u005fconfig": 2}',
        "index_bom": BOM + b'{"weight_map": {"a": "x.safetensors"}}',
        "index_nul": b'{"weight_map": {"a": "x.safetensors"}}\x00{"weight_map": {"b": "y.safetensors"}}',
        "index_numbers": b'{"metadata": {"total_size": 1e14, "n": 12345678901234567890}, "weight_map": {"a": "x.safetensors"}}',
        "deep": b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}",
        "too_deep": b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}",
        "utf16": '{"a": 1}'.encode("utf-16"),
        "control_char": b'{"a": "\x01"}',
        "empty": b"",
        "only_bom": BOM,
    }
    for name, text in texts.items():
        for control in (0, 2):
            yield "model_json", f"{name}_{control}", bytes([control]) + text
    headers = {
        "plain": HEADER,
        "bom": BOM + HEADER,
        "nul_junk": HEADER + b"\x00junk after the header",
        "trailing_text": HEADER + b" {}",
        "padding": HEADER + b"       ",
        "metadata": b'{"__metadata__": {"format": "pt", "x": "\\u00e9"}, "w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}',
        "repeated_tensor": b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}}',
        "offsets_past_64_bits": b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 18446744073709551620]}}',
        "shape_float": b'{"w": {"dtype": "U8", "shape": [4.0], "data_offsets": [0, 4]}}',
        "unknown_field_nan": b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4], "x": NaN}}',
        "unknown_field_huge": b'{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4], "x": 1e400}}',
        "latin1_name": b'{"w\xe9": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}',
    }
    for name, text in headers.items():
        yield "header", name, (4).to_bytes(8, "little") + text


def run_oracle(oracle, kind, paths):
    results = []
    for start in range(0, len(paths), 500):  # bounded command lines
        out = subprocess.run([oracle, kind] + paths[start:start + 500], check=True, capture_output=True).stdout
        results += [json.loads(line) for line in out.decode("utf-8").splitlines()]
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle", required=True)
    ap.add_argument("--model-json", action="append", default=[], help="a directory of fuzz_model_json inputs")
    ap.add_argument("--header", action="append", default=[], help="a directory of fuzz_safetensors_header inputs")
    ap.add_argument("--generated", action="store_true")
    args = ap.parse_args()
    inputs = {"model_json": [], "header": []}
    for kind, dirs in (("model_json", args.model_json), ("header", args.header)):
        for d in dirs:
            if os.path.isdir(d):
                inputs[kind] += sorted(os.path.join(d, f) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
    findings_total = 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.generated:
            for kind, name, raw in generated():
                path = os.path.join(tmp, f"{kind}-{name}")
                with open(path, "wb") as f:
                    f.write(raw)
                inputs[kind].append(path)
        for kind, paths in inputs.items():
            stats = {"accepted": 0, "refused": 0, "stricter": 0}
            check = check_model_json if kind == "model_json" else check_header
            for nf4 in run_oracle(args.oracle, kind, paths) if paths else []:
                with open(nf4["file"], "rb") as f:
                    raw = f.read()
                findings = []
                check(raw, nf4, findings, stats)
                for finding in findings:
                    print(f"FINDING {kind} {nf4['file']}: {finding}")
                findings_total += len(findings)
            print(f"{kind}: {len(paths)} inputs, nf4 accepted {stats['accepted']}, refused {stats['refused']} "
                  f"({stats['stricter']} of them valid JSON to Python: nf4's own limits)")
    print(f"json differential: {findings_total} findings")
    return 1 if findings_total else 0


if __name__ == "__main__":
    sys.exit(main())
