"""A FLUX.1-dev-size training iteration through diffusers and the Python package (bench/gpu_python.sh;
docs/performance.md, "The package with a FLUX.1-dev-size model"), measured in one run:

- the model: diffusers' FluxTransformer2DModel with FLUX.1-dev's config (19 double and 38 single blocks, width 3072,
  12B weights) and random weights in bfloat16, a LoRA (peft, rank 64 on the attention projections, float32) trained
  by AdamW under bfloat16 autocast, gradient checkpointing; random T5-size prompt embeddings (512 x 4096, pooled 768),
  embedded guidance 3.5; the FLUX pipeline's own sigmas through branchgrpo.diffusers;
- the iteration: Trainer.step on ``--prompts`` trees of ``--method`` (BranchGRPO's by default) at ``--resolution``;
- reported: seconds per iteration (the mean of ``--iterations`` after one warm-up) with its parts (the rollout's
  forwards, the update's forwards and backwards, the package's own share), peak GPU memory, and the model FLOPs per
  second as a fraction of the GPU's dense bfloat16 peak (FLOPs of one row's forward counted by torch's
  FlopCounterMode; a rollout row counts 1 forward, a trained row 3: forward and backward, the recomputation of
  gradient checkpointing not counted).

Run: python3 bench/python_gpu_flux.py [--resolution 512] [--steps 16] [--prompts 1] [--iterations 2] [--json FILE]
     (a dry run on a CPU with a shrunk model: --device cpu --layers 1 --single-layers 1 --text-tokens 16
      --resolution 64 --method dance --steps 2 --iterations 1)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from typing import Any

import torch

import branchgrpo
from branchgrpo.diffusers import flux

# Dense bfloat16 peaks (tensor cores, no sparsity), by a word of the device's name: NVIDIA's data sheets.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "B200": 2250.0, "L40S": 362.0}


def build_model(layers: int, single_layers: int, device: torch.device) -> torch.nn.Module:
    """FLUX.1-dev's transformer with random bfloat16 weights, built on the meta device and materialized on
    ``device``: linear weights N(0, 1 / fan_in) scaled by 0.5 (finite activations through 57 blocks), biases 0,
    norm weights 1."""
    from diffusers import FluxTransformer2DModel

    config = dict(in_channels=64, num_layers=layers, num_single_layers=single_layers, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                  axes_dims_rope=(16, 56, 56))  # fmt: skip
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to(torch.bfloat16).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.5 / math.sqrt(parameter.shape[1]), generator=generator)
            elif "norm" in name and name.endswith("weight"):
                parameter.fill_(1.0)
            else:
                parameter.zero_()
    return model.eval()


def add_lora(model: torch.nn.Module, rank: int) -> list[torch.nn.Parameter]:
    from peft import LoraConfig

    model.requires_grad_(False)
    targets = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights="gaussian"))
    trained = [p for p in model.parameters() if p.requires_grad]
    for parameter in trained:
        parameter.data = parameter.data.float()  # float32 masters of the LoRA beside the bfloat16 base
    return trained


class Counted:
    """A velocity in bfloat16 autocast that counts the rows it was called on."""

    def __init__(self, velocity: Any, device: torch.device) -> None:
        self.velocity, self.device, self.rows = velocity, device, 0

    def __call__(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        self.rows += x.shape[0]
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return self.velocity(x, *rest)


def forward_flops(velocity: Any, shape: list[int], device: torch.device) -> int:
    """The FLOPs of one row's forward (matrix products and attention), counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        velocity(
            torch.zeros([1, *shape], device=device), 0.5, 0, torch.zeros(1, dtype=torch.int64, device=device), None
        )
    return int(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--resolution", type=int, default=512)
    parser.add_argument("--method", default="branch")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=1, help="trees per iteration")
    parser.add_argument("--iterations", type=int, default=2, help="measured, after one warm-up")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--text-tokens", type=int, default=512, help="T5 tokens of the prompt embeddings")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--layers", type=int, default=19)
    parser.add_argument("--single-layers", type=int, default=38)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak (else looked up)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)

    began = time.perf_counter()
    model = build_model(args.layers, args.single_layers, device)
    model.enable_gradient_checkpointing()
    trained = add_lora(model, args.lora_rank)
    pipeline = flux.tiny_pipeline(0)  # FLUX.1-dev's scheduler config; its tiny transformer replaced
    pipeline.transformer = model
    embeddings = torch.Generator().manual_seed(1)
    prompt_embeds = torch.randn(args.prompts, args.text_tokens, 4096, generator=embeddings)
    pooled = torch.randn(args.prompts, 768, generator=embeddings)
    adapter = flux.FluxAdapter(pipeline, prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled, guidance_scale=3.5)
    train_adapter = copy.copy(adapter)
    train_adapter.gradients = True
    shape = adapter.latent_shape(args.resolution, args.resolution)
    sample, update = Counted(adapter.velocity, device), Counted(train_adapter.velocity, device)
    optimizer = torch.optim.AdamW(trained, lr=1e-5)
    policy = branchgrpo.Policy(update, optimizer, sample_velocity=sample, max_grad_norm=1.0)
    trainer = branchgrpo.Trainer(
        policy,
        lambda leaves, prompts: leaves.flatten(1).mean(1),  # a cheap reward: brighter is better
        latent_shape=shape,
        method=args.method,
        steps=args.steps,
        sigmas=adapter.sigmas(args.steps, args.resolution, args.resolution),
        max_batch=args.max_batch,
        total_iterations=args.iterations + 1,
        device=device,
        dtype=torch.float32,
    )
    flops = forward_flops(Counted(adapter.velocity, device), shape, device)
    setup_seconds = time.perf_counter() - began
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B weights ({len(trained)} LoRA tensors), "
          f"latents {shape}, {flops / 1e12:.2f} TFLOP per row's forward, set up in {setup_seconds:.0f} s")  # fmt: skip

    prompts = list(range(args.prompts))
    trainer.step(prompts)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sample.rows = update.rows = 0
    stats, seconds = [], []
    for _ in range(args.iterations):
        start = time.perf_counter()
        stats.append(trainer.step(prompts))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    per_iteration = sum(seconds) / len(seconds)
    model_flops = (sample.rows + 3 * update.rows) * flops / args.iterations
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)
    result = {
        "device": name,
        "resolution": args.resolution,
        "method": args.method,
        "steps": args.steps,
        "trees": args.prompts,
        "seconds_per_iteration": per_iteration,
        "seconds": seconds,
        "rollout_rows": sample.rows / args.iterations,
        "trained_rows": update.rows / args.iterations,
        "engine_share": sum(s["engine_seconds"] / s["seconds"] for s in stats) / len(stats),
        "parts_seconds": {k: sum(s[k] for s in stats) / len(stats) for k in stats[0] if k.endswith("_seconds")},
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "model_tflops_per_second": model_flops / per_iteration / 1e12,
        "bf16_peak_tflops": peak,
    }
    result["bf16_peak_fraction"] = result["model_tflops_per_second"] / peak if peak else None
    print(f"{name}: {per_iteration:.1f} s per iteration ({result['rollout_rows']:.0f} rollout rows, "
          f"{result['trained_rows']:.0f} trained rows), package share {result['engine_share']:.1%}")  # fmt: skip
    memory = "n/a" if result["peak_memory_gib"] is None else f"{result['peak_memory_gib']:.1f} GiB"
    fraction = "n/a (unknown peak: --peak-tflops)" if peak is None else f"{result['bf16_peak_fraction']:.1%}"
    print(f"peak memory {memory}; {result['model_tflops_per_second']:.0f} model TFLOP/s = {fraction} of bf16 peak")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
