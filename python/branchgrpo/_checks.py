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


def rollout_arguments(
    where: str,
    latent_shape: Sequence[int],
    steps: int,
    shift: float,
    seed: int,
    max_batch: int,
    device: Any,
    dtype: Any,
) -> tuple[list[int], int, float, int, int, torch.device, torch.dtype]:
    """rollout()'s arguments checked once, each error naming the value: (latent, steps, shift, seed, max_batch,
    device, dtype)."""
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
    return (
        integers(where, "latent_shape", latent_shape, 1),
        integer(where, "steps", steps, 1, 255),
        float(shift),
        integer(where, "seed", seed, 0, 2**64 - 1),
        integer(where, "max_batch", max_batch, 1, 2**62),
        torch_device,
        torch_dtype,
    )
