#!/usr/bin/env bash
# bench/zero_memory.sh: each rank's training-state bytes, measured, under optimizer.sharding at 1, 2 and 4 ranks
# (Gloo on the loopback), for full fine-tuning of a FLUX-architecture transformer of 70.5 M parameters with random
# weights (`branchgrpo pretrain --steps 1`: hidden 512, 4 double and 8 single blocks, float32) on the shapes data.
# The figures are the metrics row's memory/rank<r>/* (policy_memory: the bytes of the tensors the policy holds,
# each storage once: parameters and masters, the gradient an update carries, the gradient peak at any moment, AdamW's
# moments) and the process's peak resident set (VmHWM), next to the formula of docs/distributed.md; from the second
# of 2 iterations (ZeRO-2 learns its reduction order in the first update). Writes $OUT/zero_memory.md (default
# out/zero_memory); ~5 minutes on 2 cores.
#   bench/zero_memory.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$repo/build}
tool=$build/bin/branchgrpo
out=${OUT:-$repo/out/zero_memory}
mkdir -p "$out"
model=$out/model
if [ ! -f "$model/model.safetensors" ]; then
  "$tool" pretrain --out "$model" --steps 1 --batch 2 --grid-samples 1 --quiet \
    --config-json '{"hidden": 512, "heads": 8, "depth_double": 4, "depth_single": 8, "rope_axes": [16, 24, 24]}' \
    > "$out/pretrain.log" 2>&1
fi
for ranks in 1 2 4; do
  for mode in none optimizer gradients; do
    name=$mode-$ranks
    rm -rf "$out/$name"
    cat > "$out/$name.toml" <<TOML
[model]
dir = "$model"
[data]
prompts_per_iteration = 4
[topology]
split_steps = [0]
branching = [2]
[rollout]
steps = 2
max_batch = 4
[optimizer]
lr = 1e-5
sharding = "$mode"
bucket_mb = 0.25
[lora]
enabled = false
[run]
iterations = 2
checkpoint_every = 0
grid_every = 0
output_dir = "$out/$name"
TOML
    echo "zero_memory: $ranks ranks, sharding = $mode" >&2
    bash "$repo/tests/distributed/run_ranks.sh" -n "$ranks" -t 900 -- \
      env OMP_NUM_THREADS=1 "$tool" train --config "$out/$name.toml" --quiet --timeout 600 > "$out/$name.log"
  done
done
python3 - "$out" "$model/pretrain.json" <<'PY'
import json, sys
out, info = sys.argv[1], json.load(open(sys.argv[2]))
P = info["parameters"]
rows = ["| ranks | sharding | parameters MB (formula) | gradients MB (formula) | gradient peak MB | optimizer MB (formula) | resident peak MB |",
        "|---:|---|---:|---:|---:|---:|---:|"]
measured = {}
for ranks in (1, 2, 4):
    for mode in ("none", "optimizer", "gradients"):
        row = [json.loads(line) for line in open(f"{out}/{mode}-{ranks}/metrics.jsonl")][-1]  # iteration 1: the learned order
        chunk = -(-P // ranks)  # this rank's elements of the flat buffer (rank 0's: the largest)
        # float32 model: the working weights 4P, sharded with this rank's float32 masters beside them (4 chunk);
        # the gradient 4P in full (none, ZeRO-1), or this rank's sums (4 chunk) under ZeRO-2, plus transients (a
        # bucket, one tensor's gradient: not in the formula); AdamW's moments 8P or 8 chunk.
        formula = {"parameters": 4 * P + (4 * chunk if mode != "none" else 0),
                   "gradients": 4 * chunk if mode == "gradients" else 4 * P,
                   "optimizer": 8 * (chunk if mode != "none" else P)}
        for r in range(ranks):
            got = {k: row[f"memory/rank{r}/{k}"] for k in list(formula) + ["gradients_peak", "resident_peak"]}
            if r == 0:
                measured[(mode, ranks)] = got
            cell = lambda k: f"{got[k] / 1e6:.1f} ({formula[k] / 1e6:.1f})"
            rows.append(f"| {ranks} (rank {r}) | {mode} | {cell('parameters')} | {cell('gradients')} | "
                        f"{got['gradients_peak'] / 1e6:.1f} | {cell('optimizer')} | {got['resident_peak'] / 1e6:.0f} |")
text = [f"{P} trainable parameters (float32, full fine-tuning, bucket_mb 0.25); MB = 10^6 bytes; measured (formula).",
        ""] + rows + [""]
for ranks in (2, 4):
    for key, name in (("optimizer", "optimizer state"), ("gradients", "gradients"), ("gradients_peak", "gradient peak")):
        ratio = measured[("gradients", ranks)][key] / measured[("gradients", 1)][key]
        text.append(f"ZeRO-2 on {ranks} ranks: rank 0's {name} is {ratio:.3f} of one rank's "
                    f"(1/N = {1 / ranks:.3f}; {ratio * ranks - 1:+.1%} off, {'within' if abs(ratio * ranks - 1) <= 0.1 else 'NOT within'} 10 %)")
open(f"{out}/zero_memory.md", "w").write("\n".join(text) + "\n")
print("\n".join(text))
PY
