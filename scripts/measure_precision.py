#!/usr/bin/env python3
"""How much of a run's weight update survives bfloat16: float32 vs bf16 with float32 masters vs all-bf16.

Trains the shipped shapes model (examples/shapes_branch.toml, on the CPU) three ways for each learning rate:
  float32            model.dtype = "float32"                            the reference
  bf16 + fp32 master model.dtype = "bfloat16", model.master_weights = true (the default)
  all bf16           model.dtype = "bfloat16", model.master_weights = false
and compares the trained LoRA tensors of the last checkpoint. Each variant's starting weights W0 come from one more
run of that variant at lr 1e-12 (one iteration: its steps round away, so the checkpoint holds the initial weights,
bf16-rounded for the bf16 variants). For each
variant x with update U_x = W_x - W0 it prints
  gap      ||U_x - U_fp32|| / ||U_fp32||   how far the update is from the float32 run's (0 = the same)
  kept     ||U_x|| / ||U_fp32||            how large it is (an update rounded away shows as kept << 1)
over all trainable tensors, and the same for the lora_A factors alone (B starts at zero, where bf16 keeps small
values; A starts at random values ~0.1, where an update below half a bf16 ulp, 2^-9 relative, is lost).
The rollouts differ too (bf16 forward passes sample other latents), so the bf16 + master gap is not 0: it is the
price of bf16 compute; the all-bf16 gap adds the lost updates on top.

Usage: python3 scripts/measure_precision.py [--tool build/bin/branchgrpo] [--iterations 10] [--lr 2e-3 --lr 1e-5]
       [--out /tmp/branchgrpo_precision]
Prints a Markdown table (docs/torch.md "Precision" holds one).
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    """The tensors of a safetensors file as float64 numpy arrays (F32 and BF16 only)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif entry["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32).astype(np.float64)
        else:
            sys.exit("error: %s: tensor %s has dtype %s, expected F32 or BF16" % (path, name, entry["dtype"]))
        out[name] = values.reshape(entry["shape"])
    return out


def config_text(base, output_dir, iterations, lr, dtype, master):
    """examples/shapes_branch.toml with the run's length, learning rate and precision replaced."""
    lines = []
    section = ""
    for line in base.splitlines():
        stripped = line.split("#")[0].strip()
        if stripped.startswith("["):
            section = stripped
        key = stripped.split("=")[0].strip() if "=" in stripped else ""
        if section == "[model]" and key == "dir":
            line = 'dir = "%s"' % os.path.join(ROOT, "models", "shapes-tiny")
        elif section == "[optimizer]" and key == "lr":
            line = "lr = %r" % lr
        elif section == "[run]" and key in ("iterations", "output_dir", "grid_every", "checkpoint_every"):
            line = {"iterations": "iterations = %d" % iterations, "output_dir": 'output_dir = "%s"' % output_dir,
                    "grid_every": "grid_every = 0", "checkpoint_every": "checkpoint_every = 0"}[key]
        lines.append(line)
        if section == "[model]" and key == "device":
            lines.append('dtype = "%s"' % dtype)
            lines.append("master_weights = %s" % ("true" if master else "false"))
    return "\n".join(lines) + "\n"


def train(tool, base, out, name, iterations, lr, dtype, master):
    run_dir = os.path.join(out, name)
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own run folder: a fresh run each time
    os.makedirs(run_dir)
    config = os.path.join(run_dir, "run.toml")
    with open(config, "w") as f:
        f.write(config_text(base, os.path.join(run_dir, "out"), iterations, lr, dtype, master))
    subprocess.run([tool, "train", "--config", config, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    checkpoint = os.path.join(run_dir, "out", "checkpoints", "iter-%06d" % iterations)
    return read_safetensors(os.path.join(checkpoint, "weights.safetensors"))


def norm(tensors):
    return math.sqrt(sum(float((t * t).sum()) for t in tensors))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "branchgrpo"))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--lr", type=float, action="append")
    parser.add_argument("--out", default="/tmp/branchgrpo_precision")
    args = parser.parse_args()
    rates = args.lr or [2e-3, 1e-5]
    with open(os.path.join(ROOT, "examples", "shapes_branch.toml")) as f:
        base = f.read()
    variants = (("float32", "float32", True), ("bf16 + fp32 master", "bfloat16", True),
                ("all bf16", "bfloat16", False))
    # Each variant's own starting weights: a bf16 model's LoRA factors start bf16-rounded, which must not count as
    # its update.
    start = {variant: train(args.tool, base, args.out, "start_" + variant.replace(" ", "").replace("+", "_"), 1, 1e-12,
                            dtype, master)
             for variant, dtype, master in variants}
    print("| lr | iterations | variant | gap (all) | kept (all) | gap (lora_A) | kept (lora_A) |")
    print("|---|---|---|---|---|---|---|")
    for lr in rates:
        runs = {}
        for variant, dtype, master in variants:
            tag = "%s_%g" % (variant.replace(" ", "").replace("+", "_"), lr)
            runs[variant] = train(args.tool, base, args.out, tag, args.iterations, lr, dtype, master)
        names = sorted(start["float32"])
        updates = {v: {n: w[n] - start[v][n] for n in names} for v, w in runs.items()}
        reference = updates["float32"]
        for variant, update in updates.items():
            cells = []
            for subset in (names, [n for n in names if n.endswith("lora_A.weight")]):
                ref = norm(reference[n] for n in subset)
                cells.append(norm(update[n] - reference[n] for n in subset) / ref)
                cells.append(norm(update[n] for n in subset) / ref)
            print("| %g | %d | %s | %.3g | %.3g | %.3g | %.3g |" % (lr, args.iterations, variant, *cells))


if __name__ == "__main__":
    main()
