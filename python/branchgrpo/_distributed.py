"""The collectives the C++ trainer asks of torch.distributed (python/src/trainer.hpp: python_communicator).

One process when torch.distributed is not initialized. With nccl the buffers go through the current CUDA device;
with gloo through the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def rank_and_size(group: object | None) -> tuple[int, int]:
    """This process's rank in ``group`` (None: the default group) and the group's size; (0, 1) without
    torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError(f"group = {group!r}: torch.distributed is not initialized (init_process_group first)")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def device_of(group: object | None) -> torch.device:
    """Where the group's collectives take their tensors: the current CUDA device for nccl, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: np.ndarray, group: object | None) -> np.ndarray:
    """The element-wise sum of every rank's ``values`` (float64)."""
    tensor = torch.from_numpy(values).to(device_of(group))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor.cpu().numpy()


def all_gather_bytes(local: np.ndarray, size: int, group: object | None) -> np.ndarray:
    """Every rank's ``local`` bytes (equal lengths), concatenated in rank order."""
    device = device_of(group)
    tensor = torch.from_numpy(local).to(device)
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts).cpu().numpy()


def barrier(group: object | None) -> None:
    dist.barrier(group=group)


def sum_gradients(parameters: list[torch.nn.Parameter], group: object | None, scale: float) -> None:
    """Each parameter's gradient becomes ``scale`` times its sum over the group (scale = size after a wrapper that
    averaged them in the backward pass, so that the sum is restored; 1 to sum them here)."""
    device = device_of(group)
    for p in parameters:
        if p.grad is None:  # a rank without rows this step still takes part, with zeros
            p.grad = torch.zeros_like(p)
        if scale != 1.0:
            p.grad.mul_(scale)
            continue
        grad = p.grad.to(device)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)
        if grad is not p.grad:
            p.grad.copy_(grad)
