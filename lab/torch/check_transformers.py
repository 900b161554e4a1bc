#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""`nf4 convert` on a real transformers bnb-4bit model directory, checked with transformers itself.

On a machine with a CUDA GPU, torch, transformers and bitsandbytes (no network: the model is made
here, not downloaded):
  1. a small Llama is created with random weights (bf16) and saved;
  2. transformers loads it with BitsAndBytesConfig (NF4, double quantization) and saves the
     bnb-4bit model directory, as a user would publish it; a model card, a chat template and a
     tokenizer-like file are added beside it;
  3. `nf4 convert DIR OUT --dtype bf16` turns it into a dense model directory;
  4. transformers loads OUT as an ordinary model (no quantization config); every weight must be
     bit-identical to bitsandbytes' own dequantization of the bnb-4bit model's parameter, and the
     logits on a random prompt must agree with the bnb-4bit model's to bf16 precision (bnb's
     forward multiplies by the transposed dequantized weight, so cuBLAS may pick another
     algorithm and round a logit one bf16 step differently: same weights, not the same kernel).
Every non-weight file must be carried unchanged, and config.json must have lost
quantization_config. Exit status 0 when everything holds.

    python3 lab/torch/check_transformers.py --nf4 build/nf4 [--workdir DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nf4", required=True, help="the nf4 command-line tool")
    ap.add_argument("--workdir", help="where the model directories go (default: a temporary folder)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    work = args.workdir or tempfile.mkdtemp(prefix="nf4-transformers-")
    dense_in, bnb_dir, out_dir = (os.path.join(work, n) for n in ("dense-source", "bnb-4bit", "converted"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(dense_in)

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    bnb = AutoModelForCausalLM.from_pretrained(dense_in, quantization_config=quant, device_map={"": 0})
    bnb.save_pretrained(bnb_dir)
    extra = {"README.md": "# tiny test model\n", "chat_template.jinja": "{{ messages }}\n",
             "tokenizer_config.json": json.dumps({"model_max_length": 256}) + "\n"}
    for name, text in extra.items():
        with open(os.path.join(bnb_dir, name), "w") as f:
            f.write(text)
    print("bnb-4bit directory:", sorted(os.listdir(bnb_dir)))

    subprocess.run([args.nf4, "convert", bnb_dir, out_dir, "--dtype", "bf16"], check=True)
    print("converted directory:", sorted(os.listdir(out_dir)))

    problems = []
    for name in sorted(os.listdir(bnb_dir)):
        if name.endswith(".safetensors") or name.endswith(".index.json") or name == "config.json":
            continue
        src, dst = os.path.join(bnb_dir, name), os.path.join(out_dir, name)
        if not os.path.isfile(dst):
            problems.append(f"{name} was not carried")
        elif open(src, "rb").read() != open(dst, "rb").read():
            problems.append(f"{name} changed")
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    if "quantization_config" in config:
        problems.append("config.json still has quantization_config")

    dense = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16, device_map={"": 0})
    if getattr(dense, "is_loaded_in_4bit", False) or getattr(dense.config, "quantization_config", None):
        problems.append("transformers loaded the converted model as a quantized one")
    import bitsandbytes as bnb_lib
    dense_params = dict(dense.named_parameters())
    checked = 0
    for name, p in bnb.named_parameters():
        state = getattr(p, "quant_state", None)
        if state is None:
            continue
        ref = bnb_lib.functional.dequantize_4bit(p.data, state).to(torch.bfloat16)
        got = dense_params[name].data
        if got.shape != ref.shape or not torch.equal(got.view(torch.int16), ref.view(torch.int16)):
            problems.append(f"{name}: the converted weight differs from bitsandbytes' dequantization")
        checked += 1
    print(f"weights: {checked} quantized parameters compared bit for bit with bitsandbytes' dequantize_4bit")
    if checked == 0:
        problems.append("no quantized parameter found in the bnb-4bit model")
    ids = torch.randint(0, cfg.vocab_size, (2, 48), device="cuda")
    with torch.no_grad():
        a = bnb(ids).logits.float()
        b = dense(ids).logits.float()
    diff = (a - b).abs().max().item()
    scale = a.abs().max().item()
    print(f"logits: bnb-4bit vs converted, max abs difference {diff:g} (max |logit| {scale:g})")
    if diff > scale * 2.0**-7:  # two bf16 steps at the largest logit
        problems.append(f"logits differ by up to {diff:g}, more than bf16 rounding of the same product")
    for p in problems:
        print("PROBLEM:", p)
    print("RESULT:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
