"""The tensor operations the C++ rollout engine asks of torch (python/src/torch_backend.hpp calls them).

They mirror the LibTorch adapter's ``torch_backend`` (adapters/torch/branchgrpo/torch/backend.hpp) operation for
operation, so that the same keyed noise gives the same latents: noise and initial latents arrive as float64 host
arrays (the engine's keyed draws) and are copied to the latents' device once; no latent leaves its device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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
    """Per row r: -sum (next - mean)^2 / (2 std_r^2 n) - log std_r - log(2 pi) / 2, as float64 numpy."""
    if not next_.shape[0]:
        return np.zeros(0)
    return row_log_probs(next_, mean, torch.from_numpy(std)).detach().to("cpu").numpy()


def row_log_probs(next_: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """row_log_prob as a float64 tensor on the latents' device, differentiable in ``mean``."""
    std = std.to(device=next_.device, dtype=torch.float64)
    n = float(next_[0].numel())
    squares = (next_.to(torch.float64) - mean.to(torch.float64)).square().flatten(1).sum(1)
    return -squares / (2.0 * std * std * n) - torch.log(std) - 0.5 * math.log(2.0 * math.pi)


def fused_rows(x: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the fused CUDA SDE kernel takes these rows: CUDA, one device, both float32 or both float64."""
    return x.is_cuda and v.device == x.device and x.dtype == v.dtype and x.dtype in (torch.float32, torch.float64)


def is_float32(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32


def fused_sde_buffers(
    x: torch.Tensor,
    v: torch.Tensor,
    children: int,
    own: np.ndarray,
    shared: np.ndarray | None,
    stds: np.ndarray,
    workspace: int,
) -> tuple:
    """The fused SDE kernel's buffers on x's device (python/src/cuda_step.hpp): (device guard, x and v contiguous,
    next, own and shared key bytes, stds, log_prob, workspace, torch's current stream handle)."""
    device = x.device
    f64 = {"dtype": torch.float64, "device": device}
    with torch.cuda.device(device):
        return (
            torch.cuda.device(device),
            x.contiguous(),
            v.contiguous(),
            torch.empty([children, *x.shape[1:]], dtype=x.dtype, device=device),
            torch.from_numpy(own).to(device),
            None if shared is None else torch.from_numpy(shared).to(device),
            torch.from_numpy(stds).to(device),
            torch.empty(children, **f64),
            torch.empty(max(workspace, 1), **f64),
            torch.cuda.current_stream(device).cuda_stream,
        )


def call_velocity(
    velocity, x: torch.Tensor, sigma: float, step: int, prompts: np.ndarray, trees: np.ndarray, iteration: int
) -> torch.Tensor:
    """velocity(latents, sigma, step, prompts, trees), checked: a tensor of x's shape, dtype and device, finite.
    ``prompts`` and ``trees`` are int64 tensors on the latents' device."""
    rows_prompts = torch.from_numpy(prompts).to(x.device)
    rows_trees = torch.from_numpy(trees.astype(np.int64)).to(x.device)
    v = velocity(x, sigma, step, rows_prompts, rows_trees)
    return checked_velocity(v, x, f"velocity at iteration {iteration}, step {step} ({x.shape[0]} rows)").detach()


def checked_velocity(v: object, x: torch.Tensor, where: str) -> torch.Tensor:
    """``v`` if it is a finite tensor of ``x``'s shape, dtype and device; else a TypeError or ValueError naming
    ``where`` and, for NaN or inf, the rows."""
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{where}: returned {type(v).__name__}, not a torch.Tensor")
    if v.shape != x.shape:
        raise ValueError(f"{where}: returned shape {tuple(v.shape)}, the latents are {tuple(x.shape)}")
    if v.dtype != x.dtype:
        raise ValueError(f"{where}: returned dtype {v.dtype}, the latents are {x.dtype}")
    if v.device != x.device:
        raise ValueError(f"{where}: returned a tensor on {v.device}, the latents are on {x.device}")
    finite = torch.isfinite(v.detach()).flatten(1).all(1)
    if not bool(finite.all()):
        raise ValueError(f"{where}: NaN or inf in rows {listed(torch.nonzero(~finite).flatten().tolist())}")
    return v


def listed(indices: list[int], most: int = 8) -> str:
    """The first ``most`` indices, comma-separated, with ", ..." when there are more."""
    return ", ".join(str(i) for i in indices[:most]) + (", ..." if len(indices) > most else "")


def call_reward(
    reward,
    leaves: torch.Tensor,
    prompts: np.ndarray,
    groups: np.ndarray | None,
    iteration: int | None = None,
    groupwise: bool = False,
    win_rate: bool = False,
) -> tuple[np.ndarray, list[tuple[str, float, np.ndarray]]]:
    """``reward(leaves, prompts)`` or, ``groupwise``, ``reward(leaves, prompts, groups)`` (int64 tensors on the
    leaves' device), checked: one finite score per leaf, or a mapping of named parts, each scores or (weight,
    scores). With ``win_rate`` each score (each part's) becomes its win rate within its group (``groups``).
    Returns the total (sum of weight x part) as float64 numpy and the parts as (name, weight, scores)."""
    device = leaves.device
    rows_prompts = torch.from_numpy(prompts.astype(np.int64)).to(device)
    if groupwise:
        out = reward(leaves, rows_prompts, torch.from_numpy(groups.astype(np.int64)).to(device))
    else:
        out = reward(leaves, rows_prompts)
    where = "reward" if iteration is None else f"reward at iteration {iteration}"
    if not isinstance(out, Mapping):
        total = _scores(out, leaves.shape[0], where)
        return (_win_rates(total, groups) if win_rate else total), []
    if not out:
        raise ValueError(f"{where} returned an empty mapping: give at least one part")
    parts = []
    for name, value in out.items():
        weight, scores = value if isinstance(value, tuple) else (1.0, value)
        if not isinstance(name, str) or isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise TypeError(f"{where}: part {name!r} must be named by a string and weighted by a number")
        if not math.isfinite(weight):
            raise ValueError(f"{where}: part {name!r} has weight {weight}")
        rows = _scores(scores, leaves.shape[0], f"{where}, part {name!r},")
        parts.append((name, float(weight), _win_rates(rows, groups) if win_rate else rows))
    total = sum(weight * rows for _, weight, rows in parts)
    return np.ascontiguousarray(total, dtype=np.float64), parts


def _scores(out: object, leaves: int, where: str) -> np.ndarray:
    """``out`` as one finite float64 per leaf, else a TypeError or ValueError naming ``where`` and the leaves."""
    if isinstance(out, torch.Tensor):
        out = out.detach().to("cpu", torch.float64).numpy()
    try:
        values = np.asarray(out, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{where} returned {type(out).__name__}, not one number per leaf") from error
    if values.shape[0] != leaves:
        raise ValueError(f"{where} returned {values.shape[0]} scores for {leaves} leaves")
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(f"{where} returned NaN or inf for leaves {listed(bad.tolist())} (of {leaves})")
    return np.ascontiguousarray(values)


def _win_rates(scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each score's win rate within its group (the engine's win_rates, tie 0.5)."""
    from branchgrpo import _core

    return np.asarray(_core.win_rates(scores.tolist(), groups.astype(np.int64).tolist(), 0.5), dtype=np.float64)
