"""The Python package's own share of a rollout (docs/performance.md, "Python package"): the time a rollout spends
outside the velocity calls, as a fraction of the rollout, measured in one run for a tiny convolutional velocity and
for a free one (the engine alone). Run: .venv/bin/python bench/python_overhead.py [--repeats N]."""

from __future__ import annotations

import argparse
import time

import torch

import branchgrpo


class TinyVelocity(torch.nn.Module):
    """Two 3x3 convolutions over [3, 16, 16] latents, as a stand-in for a small transformer's cost."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, width, 3, padding=1)
        self.b = torch.nn.Conv2d(width, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.silu(self.a(x)))


def measure(model, repeats: int, method: str) -> tuple[float, float, int]:
    inside = 0.0

    def velocity(x, sigma, step, prompts, trees):
        nonlocal inside
        start = time.perf_counter()
        with torch.no_grad():
            v = model(x)
        inside += time.perf_counter() - start
        return v

    start = time.perf_counter()
    calls = 0
    for i in range(repeats):
        result = branchgrpo.rollout(velocity, method=method, prompts=[0, 1], latent_shape=[3, 16, 16], iteration=i)
        calls += result.denoiser_calls
    return time.perf_counter() - start, inside, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    for label, model in (("conv width 64", TinyVelocity(64)), ("free (v = 0)", lambda x: torch.zeros_like(x))):
        for method in ("dance", "branch"):
            total, inside, calls = measure(model, args.repeats, method)
            print(
                f"{label:14s} {method:7s} rollout {1e3 * total / args.repeats:8.1f} ms,"
                f" velocity {1e3 * inside / args.repeats:8.1f} ms,"
                f" {calls // args.repeats} calls; package share {(total - inside) / total:.1%},"
                f" {1e6 * (total - inside) / calls:.0f} us per call"
            )


if __name__ == "__main__":
    main()
