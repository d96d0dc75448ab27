"""The Python package's training iteration on the shipped FLUX model in diffusers (docs/performance.md, "The Python
package's iteration"), measured in one run:

1. its own overhead: Trainer.step's engine_seconds (the time outside the model's sampling, forward and backward
   calls, the optimizer and the reward) as a share of the iteration; the issue's target is at most 5 %;
2. against batch-1 Python loops in the structure of the official BranchGRPO code (its tree: one node per
   transformer call in the rollout, one edge per forward and backward pass in the update, the noise from
   torch.randn) and of DanceGRPO's (the same loop over its 16 independent chains per prompt): the ratios of the
   iteration times, alternating.

All train every parameter of the model with AdamW on the same prompts: models/shapes-tiny in diffusers'
FluxTransformer2DModel (branchgrpo.flux, --model shapes-tiny) or the tiny random diffusers FLUX pipeline of
branchgrpo.diffusers (--model tiny-flux, 32 x 32 pixels).
Run: .venv/bin/python bench/python_flux_iteration.py [--model shapes-tiny] [--iterations 3] [--prompts 4]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

import branchgrpo
from branchgrpo import flux
from branchgrpo.diffusers import flux as diffusers_flux

MODEL = Path(__file__).resolve().parent.parent / "models" / "shapes-tiny"


def load(model: str) -> tuple[torch.nn.Module, Any, list[int]]:
    """A fresh copy of ``model``: the trained module, its velocity with gradients, and one latent row's shape."""
    if model == "shapes-tiny":
        transformer, prompts = flux.load_model(MODEL), flux.load_prompts(MODEL)
        return transformer, flux.velocity(transformer, prompts, gradients=True), [3, 16, 16]
    pipeline = diffusers_flux.tiny_pipeline(seed=0)
    embeddings = torch.Generator().manual_seed(1)
    adapter = diffusers_flux.FluxAdapter(
        pipeline,
        prompt_embeds=torch.randn(8, 5, 32, generator=embeddings),
        pooled_prompt_embeds=torch.randn(8, 32, generator=embeddings),
        gradients=True,
    )
    return pipeline.transformer, adapter.velocity, adapter.latent_shape(32, 32)


def reward(leaves: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
    """A cheap reward of the leaves (the same for both): brighter is better."""
    return leaves.flatten(1).mean(1)


def trainer_for(model_name: str, method: str, seed: int) -> branchgrpo.Trainer:
    model, velocity, latent = load(model_name)
    policy = branchgrpo.Policy(velocity, torch.optim.AdamW(model.parameters(), lr=1e-5))
    return branchgrpo.Trainer(policy, reward, method=method, latent_shape=latent, seed=seed)


def batch_one_loop(model_name: str, method: str, prompt_rows: list[int], iteration: int) -> float:
    """One iteration of ``method``'s tree in the official code's structure (batch 1 everywhere); its seconds (the
    model load excluded). With dance's tree it is DanceGRPO's structure: 16 independent chains per prompt."""
    model, velocity, latent = load(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    # The tree and each step's transition from the engine (a rollout of it, not timed).
    probe = branchgrpo.rollout(velocity, method=method, prompts=prompt_rows, latent_shape=latent, iteration=iteration)
    probe_edges = branchgrpo.edges(probe, branchgrpo.credit(probe, branchgrpo.score(probe, reward)))
    step_of = {int(s): i for i, s in enumerate(probe_edges.step.tolist())}
    tree = probe.tree
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parent.tolist()):
        if parent >= 0:
            children.setdefault(parent, []).append(node)
    start = time.perf_counter()
    x = {int(n): torch.randn(1, *latent) for n in range(tree.node_count) if tree.parent[n] < 0}
    old_log_prob: dict[int, float] = {}
    for s in range(tree.step.max()):
        i = step_of[s]
        a, c, std = float(probe_edges.x_coeff[i]), float(probe_edges.velocity_coeff[i]), float(probe_edges.std[i])
        for node in [n for n in x if tree.step[n] == s]:
            prompt = torch.tensor([prompt_rows[node // tree.nodes_per_tree]])
            mean = a * x[node] + c * velocity(x[node], probe_edges.sigma[i].item(), s, prompt, None).detach()
            for child in children[node]:
                x[child] = mean + std * torch.randn_like(mean)
                old_log_prob[child] = float(-(x[child] - mean).square().mean() / (2 * std * std) - math.log(std))
    leaves = torch.cat([x[int(n)] for n in tree.leaves])
    scores = reward(leaves, torch.zeros(len(leaves)))
    normalized = (scores - scores.mean()) / (scores.std() + 1e-6)
    advantage = {int(n): float(v) for n, v in zip(tree.leaves, normalized, strict=True)}
    edges = [n for n in x if tree.parent[n] >= 0]
    for node in edges:  # one forward and backward pass per edge
        parent, s = int(tree.parent[node]), int(tree.step[tree.parent[node]])
        i = step_of[s]
        a, c, std = float(probe_edges.x_coeff[i]), float(probe_edges.velocity_coeff[i]), float(probe_edges.std[i])
        prompt = torch.tensor([prompt_rows[node // tree.nodes_per_tree]])
        mean = a * x[parent] + c * velocity(x[parent], probe_edges.sigma[i].item(), s, prompt, None)
        log_prob = -(x[node] - mean).square().mean() / (2 * std * std) - math.log(std)
        ratio = torch.exp(log_prob - old_log_prob[node])
        share = advantage.get(node, 0.0)
        loss = torch.maximum(-share * ratio, -share * ratio.clamp(1 - 1e-4, 1 + 1e-4)) / len(edges)
        loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=("shapes-tiny", "tiny-flux"), default="shapes-tiny")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    prompt_rows = list(range(args.prompts))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.model}, {args.prompts} prompts")
    loops: dict[str, float] = {}
    for method in ("dance", "branch"):
        trainer = trainer_for(args.model, method, seed=1)
        trainer.step(prompt_rows)  # warm-up
        package, engine, loop = [], [], []
        for _ in range(args.iterations):  # alternating
            stats = trainer.step(prompt_rows)
            package.append(stats["seconds"])
            engine.append(stats["engine_seconds"])
            loop.append(batch_one_loop(args.model, method, prompt_rows, trainer.iteration))
        loops[method] = min(loop)
        parts = {k: stats[k] for k in stats if k.endswith("_seconds")}
        print(
            f"{method}: package iteration {min(package):.3f} s (median of {args.iterations}: "
            f"{sorted(package)[len(package) // 2]:.3f}), engine share {sum(engine) / sum(package):.1%}; "
            f"batch-1 loop {min(loop):.3f} s: ratio {min(loop) / min(package):.2f}x"
        )
        print("  last iteration's parts: " + ", ".join(f"{k[:-8]} {v:.3f}" for k, v in parts.items()))
    print(
        f"the package's branch iteration against the official structure (branch, batch 1): "
        f"{loops['branch'] / min(package):.2f}x; against DanceGRPO's (16 chains, batch 1): "
        f"{loops['dance'] / min(package):.2f}x"
    )


if __name__ == "__main__":
    main()
