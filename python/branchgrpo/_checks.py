"""Argument checks shared by rollout() and Trainer: each bad value is one TypeError or ValueError naming it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def integer(where: str, name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an integer in [low, high], else a TypeError or ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} = {value!r}: must be an integer")
    if not low <= value <= high:
        raise ValueError(f"{where}: {name} = {value}: must be in [{low}, {high}]")
    return value


def integers(where: str, name: str, values: Sequence[int], low: int) -> list[int]:
    """``values`` as a list of integers of at least ``low``, else a TypeError or ValueError naming them."""
    listed = list(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in listed):
        raise TypeError(f"{where}: {name} = {listed!r}: must be integers")
    if any(v < low for v in listed):
        raise ValueError(f"{where}: {name} = {listed!r}: every value must be at least {low}")
    return listed


def sigma_values(where: str, sigmas: Sequence[float] | None, steps: int) -> list[float]:
    """``sigmas`` as a list of floats: steps + 1 finite values, strictly decreasing from at most 1 to 0 (the
    schedule a diffusers scheduler makes, its terminal 0 included); [] for None (the shifted linear schedule). Else a
    TypeError or ValueError naming the bad value.

    >>> sigma_values("rollout", [1.0, 0.6, 0.0], 2), sigma_values("rollout", None, 2)
    ([1.0, 0.6, 0.0], [])
    >>> sigma_values("rollout", [1.0, 0.6, 0.7, 0.0], 3)
    Traceback (most recent call last):
    ValueError: rollout: sigmas[2] = 0.7: must be below sigmas[1] = 0.6 (a decreasing schedule)
    """
    if sigmas is None:
        return []
    try:
        array = np.asarray(sigmas.detach().cpu() if isinstance(sigmas, torch.Tensor) else sigmas, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim != 1:
        raise TypeError(f"{where}: sigmas = {sigmas!r}: must be a sequence of numbers")
    values = array.tolist()
    if len(values) != steps + 1:
        raise ValueError(f"{where}: sigmas has {len(values)} values: must have steps + 1 = {steps + 1}")
    for i, value in enumerate(values):
        if not np.isfinite(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}: sigmas[{i}] = {value}: must be in [0, 1]")
        if i > 0 and not value < values[i - 1]:
            previous = f"sigmas[{i - 1}] = {values[i - 1]}"
            raise ValueError(f"{where}: sigmas[{i}] = {value}: must be below {previous} (a decreasing schedule)")
    if values[-1] != 0.0:
        raise ValueError(f"{where}: sigmas[{steps}] = {values[-1]}: the schedule must end at 0")
    return values


def rollout_arguments(
    where: str,
    latent_shape: Sequence[int],
    steps: int,
    shift: float,
    seed: int,
    max_batch: int,
    device: Any,
    dtype: Any,
    sigmas: Sequence[float] | None = None,
) -> tuple[list[int], int, float, list[float], int, int, torch.device, torch.dtype]:
    """rollout()'s arguments checked once, each error naming the value: (latent, steps, shift, sigmas, seed,
    max_batch, device, dtype); sigmas [] for None."""
    torch_dtype = torch.float32 if dtype is None else dtype
    if torch_dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        raise TypeError(f"{where}: dtype = {torch_dtype!r}: must be torch.float32, float64, bfloat16 or float16")
    if not isinstance(shift, (int, float)) or isinstance(shift, bool) or not np.isfinite(shift) or shift <= 0:
        raise ValueError(f"{where}: shift = {shift!r}: must be a positive number")
    torch_device = torch.device(device)
    if torch_device.type == "meta":
        raise ValueError(
            f"{where}: device = {device!r}: the engine reads the latents' values (log-probs, finiteness); "
            "use a device with data (cpu, cuda)"
        )
    steps = integer(where, "steps", steps, 1, 255)
    return (
        integers(where, "latent_shape", latent_shape, 1),
        steps,
        float(shift),
        sigma_values(where, sigmas, steps),
        integer(where, "seed", seed, 0, 2**64 - 1),
        integer(where, "max_batch", max_batch, 1, 2**62),
        torch_device,
        torch_dtype,
    )
