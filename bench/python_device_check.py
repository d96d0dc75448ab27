"""The Python package on a device against the CPU (issue "The library from Python": its CUDA checks), run by
bench/gpu_kernels.sh on a lent GPU: a float64 rollout on --device equals the CPU's bit for bit (every latent of every
step: on CUDA the SDE steps run on the fused kernel, which draws the keyed noise on the device, when the package was
built with it, as _core.cuda_kernels says; the CPU's come from the host draws), its log-probs within 1e-12; one
update's edges, recomputed log-probs and PPO gradient within 1e-12; one Trainer iteration (the C++ trainer driving
a torch model on the device) ends at the CPU's parameters within 1e-12. Exit status 0 when every check passes.
Run: python3 bench/python_device_check.py --device cuda   (--device cpu checks the script itself)."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import branchgrpo


def iteration(device: str, method: str):
    def velocity(x, sigma, step, prompts, trees):
        return -0.5 * x + 0.1

    result = branchgrpo.rollout(
        velocity,
        method=method,
        prompts=[0, 1],
        latent_shape=[4, 16, 16],
        seed=11,
        iteration=2,
        device=device,
        dtype=torch.float64,
    )
    rewards = branchgrpo.score(result, lambda leaves, prompts: -leaves.square().flatten(1).mean(1))
    credit = branchgrpo.credit(result, rewards)
    edges = branchgrpo.edges(result, credit)
    a = torch.tensor(-0.5, dtype=torch.float64, device=device, requires_grad=True)
    loss = branchgrpo.ppo_loss(branchgrpo.transition_log_prob(edges, a * edges.latent + 0.1), edges)
    loss.backward()
    return result, edges, float(a.grad)


def trainer_iteration(device: str) -> torch.Tensor:
    """One Trainer step of branch on a float64 linear velocity on ``device``; the trained weight on the CPU."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16, dtype=torch.float64).to(device)
    policy = branchgrpo.Policy(lambda x, *rest: model(x), torch.optim.SGD(model.parameters(), lr=0.05))
    trainer = branchgrpo.Trainer(
        policy,
        lambda leaves, prompts: -leaves.square().mean(1),
        latent_shape=[16],
        seed=4,
        device=device,
        dtype=torch.float64,
        updates_per_iteration=2,
    )
    trainer.step([0, 1])
    return model.weight.detach().cpu()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"python_device_check: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    failures = 0
    for method in ("dance", "branch", "branch-mix-flash"):
        on_device, edges_device, grad_device = iteration(args.device, method)
        on_cpu, edges_cpu, grad_cpu = iteration("cpu", method)
        same = all(torch.equal(d.cpu(), c) for d, c in zip(on_device.latents, on_cpu.latents, strict=True))
        log_gap = float(np.abs(on_device.log_probs - on_cpu.log_probs).max())
        grad_gap = abs(grad_device - grad_cpu) / max(abs(grad_cpu), 1e-300)
        ok = same and log_gap <= 1e-12 and grad_gap <= 1e-12 and len(edges_device) == len(edges_cpu)
        failures += not ok
        print(
            f"{method:17s} latents bit for bit: {same}; log-probs max gap {log_gap:.2e}; PPO gradient relative gap"
            f" {grad_gap:.2e}; {len(edges_device)} edges: {'ok' if ok else 'FAILED'}"
        )
    on_device, on_cpu = trainer_iteration(args.device), trainer_iteration("cpu")
    gap = float((on_device - on_cpu).abs().max())
    ok = gap <= 1e-12
    failures += not ok
    print(f"Trainer step        weights max gap {gap:.2e}: {'ok' if ok else 'FAILED'}")
    print(f"fused CUDA SDE kernel in the package: {branchgrpo._core.cuda_kernels}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
