"""The tensor operations the C++ rollout engine asks of torch (python/src/torch_backend.hpp calls them).

They mirror the LibTorch adapter's ``torch_backend`` (adapters/torch/branchgrpo/torch/backend.hpp) operation for
operation, so that the same keyed noise gives the same latents: noise and initial latents arrive as float64 host
arrays (the engine's keyed draws) and are copied to the latents' device once; no latent leaves its device.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least: bfloat16 and float16 latents are combined in float32."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def from_host(values: np.ndarray, rows: int, dims: list[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(values).reshape([rows, *dims]).to(device=device, dtype=dtype, copy=True)


def to_host(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float64).contiguous().numpy().reshape(-1)


def gather_rows(x: torch.Tensor, index: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return x.index_select(0, torch.from_numpy(index).to(x.device)).to(dtype)


def slice_rows(x: torch.Tensor, begin: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    return x[begin:end].to(dtype, copy=True)


def concat_rows(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([p.to(dtype) for p in parts], 0)


def affine(a: float, x: torch.Tensor, c: float, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    compute = compute_dtype(dtype)
    return (x.to(compute) * a + v.to(compute) * c).to(dtype)


def row_log_prob(next_: torch.Tensor, mean: torch.Tensor, std: np.ndarray) -> np.ndarray:
    """Per row r: -sum (next - mean)^2 / (2 std_r^2 n) - log std_r - log(2 pi) / 2, each row reduced on its own."""
    n = float(next_[0].numel()) if next_.shape[0] else 1.0
    half_log_two_pi = 0.5 * math.log(2.0 * math.pi)
    out = []
    for r in range(next_.shape[0]):
        s = float(std[r])
        squares = (next_[r].to(torch.float64) - mean[r].to(torch.float64)).square().sum()
        out.append(-squares / (2.0 * s * s * n) - math.log(s) - half_log_two_pi)
    if not out:
        return np.zeros(0)
    return torch.stack(out).detach().to("cpu").numpy()


def call_velocity(
    velocity, x: torch.Tensor, sigma: float, step: int, prompts: np.ndarray, trees: np.ndarray, iteration: int
) -> torch.Tensor:
    """velocity(latents, sigma, step, prompts, trees), checked: a tensor of x's shape, dtype and device, finite.
    ``prompts`` and ``trees`` are int64 tensors on the latents' device."""
    where = f"velocity at iteration {iteration}, step {step} ({x.shape[0]} rows)"
    rows_prompts = torch.from_numpy(prompts).to(x.device)
    rows_trees = torch.from_numpy(trees.astype(np.int64)).to(x.device)
    v = velocity(x, sigma, step, rows_prompts, rows_trees)
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{where}: returned {type(v).__name__}, not a torch.Tensor")
    if v.shape != x.shape:
        raise ValueError(f"{where}: returned shape {tuple(v.shape)}, the latents are {tuple(x.shape)}")
    if v.dtype != x.dtype:
        raise ValueError(f"{where}: returned dtype {v.dtype}, the latents are {x.dtype}")
    if v.device != x.device:
        raise ValueError(f"{where}: returned a tensor on {v.device}, the latents are on {x.device}")
    finite = torch.isfinite(v).flatten(1).all(1)
    if not bool(finite.all()):
        rows = torch.nonzero(~finite).flatten().tolist()
        shown = ", ".join(str(r) for r in rows[:8]) + (", ..." if len(rows) > 8 else "")
        raise ValueError(f"{where}: NaN or inf in rows {shown}")
    return v.detach()
