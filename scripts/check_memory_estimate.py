#!/usr/bin/env python3
"""The pre-flight memory estimate (`branchgrpo train --memory`) against what a run takes, on the CPU.

For each scaled-down run (the shipped image model models/shapes-tiny and video model models/moving-shapes-tiny at
larger latents than they were trained on, LoRA, one iteration) it reads the estimate by part from
`train --memory --json` (nothing loaded), then trains the run for one iteration in a child process and reads that
child's peak resident memory (ru_maxrss of wait4). The same peak of `train --memory` (LibTorch and the tool
loaded, nothing built) is subtracted as the baseline. It prints a Markdown table (docs/reliability.md holds one):
estimate, measured peak above the baseline, and their ratio (below 1: the estimate is an upper bound).

Usage: python3 scripts/check_memory_estimate.py [--tool build/bin/branchgrpo] [--out /tmp/branchgrpo_memory]
"""
import argparse
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, model directory, [model] keys, rewards) of each run.
RUNS = [
    ("image 64 x 64", "shapes-tiny", {"latent_height": 64, "latent_width": 64}, "jpeg_compressibility"),
    ("image 128 x 128", "shapes-tiny", {"latent_height": 128, "latent_width": 128}, "jpeg_compressibility"),
    ("video 16 frames 32 x 32", "moving-shapes-tiny", {"latent_frames": 16, "latent_height": 32, "latent_width": 32},
     "smoothness"),
]


def config_text(model_dir, keys, reward, out):
    lines = ["[model]", 'dir = "%s"' % model_dir] + ["%s = %s" % item for item in keys.items()]
    lines += ["[data]", "prompts_per_iteration = 2",
              "[topology]", "split_steps = [0, 3, 6]", "branching = [2]",
              "[rollout]", "steps = 8", "max_batch = 16",
              "[lora]", "rank = 4", "alpha = 4.0",
              "[[rewards]]", 'name = "%s"' % reward,
              "[run]", "iterations = 1", 'output_dir = "%s"' % out]
    return "\n".join(lines) + "\n"


def run_measured(command):
    """Runs `command`; returns (stdout, peak resident bytes of that child alone)."""
    pid = os.fork()
    if pid == 0:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        captured = os.open(os.path.join(OUT_DIR, "stdout.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(captured, 1)
        os.execv(command[0], command)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("error: %s failed (exit %d)" % (" ".join(command), os.waitstatus_to_exitcode(status)))
    with open(os.path.join(OUT_DIR, "stdout.txt")) as f:
        return f.read(), usage.ru_maxrss * 1024  # Linux reports kilobytes


def text(n):
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return "%.3g %s" % (n, unit)
        n /= 1000.0


def main():
    global OUT_DIR
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "branchgrpo"))
    parser.add_argument("--out", default="/tmp/branchgrpo_memory")
    args = parser.parse_args()
    OUT_DIR = args.out
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    print("| run | estimate | of it: activations | measured peak above baseline | measured / estimate |")
    print("|---|---:|---:|---:|---:|")
    for label, model, keys, reward in RUNS:
        out = os.path.join(args.out, model + "_" + "_".join(str(v) for v in keys.values()))
        config = out + ".toml"
        with open(config, "w") as f:
            f.write(config_text(os.path.join(ROOT, "models", model), keys, reward, out))
        estimate_text, baseline = run_measured([args.tool, "train", "--config", config, "--memory", "--json"])
        estimate = json.loads(estimate_text)
        _, peak = run_measured([args.tool, "train", "--config", config, "--quiet"])
        measured = peak - baseline
        print("| %s | %s | %s | %s | %.2f |" % (label, text(estimate["total"]), text(estimate["activations"]),
                                               text(measured), measured / estimate["total"]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
