"""The update's stages for a user's own loop (issue "The library from Python", update way (b)): the trained edges
of an iteration as torch tensors, each edge's log-prob recomputed with gradients from a velocity, and the PPO-clipped
loss of ``ppo_ratio`` (include/branchgrpo/loss/ppo.hpp) as a differentiable torch function over the engine's per-edge
terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from branchgrpo import _core, _torch_ops

ALL = slice(None)  # every edge


@dataclass(frozen=True)
class Edges:
    """The trained edges of one iteration, in the credit's order (by step); every tensor has one row per edge.

    ``latent`` and ``next_latent`` are the edge's two latents (on the rollout's device, in its dtype); ``sigma``,
    ``step``, ``prompt`` and ``tree`` what its velocity call is told; ``x_coeff``, ``velocity_coeff`` and ``std``
    its transition (mean = x_coeff latent + velocity_coeff v); ``old_log_prob`` the rollout's; ``advantage`` the
    credit's; ``weight`` 1 / edges (the trainer's per-edge weight).
    """

    node: torch.Tensor
    step: torch.Tensor
    sigma: torch.Tensor
    prompt: torch.Tensor
    tree: torch.Tensor
    latent: torch.Tensor
    next_latent: torch.Tensor
    x_coeff: torch.Tensor
    velocity_coeff: torch.Tensor
    std: torch.Tensor
    old_log_prob: torch.Tensor
    advantage: torch.Tensor
    weight: torch.Tensor

    def __len__(self) -> int:
        return int(self.node.shape[0])


def edges(result: _core.Rollout, credit: _core.Credit, *, step_weight: str = "none") -> Edges:
    """The edges ``credit`` trains, gathered from ``result`` (the rollout the credit was assigned on).

    ``weight`` is the trainer's per-edge weight w(step) / edges, with w the run config's ``loss.step_weight``
    (none, inverse_dt, noise_std or equal_steps; docs/config.md) computed by the engine.

    >>> import branchgrpo
    >>> r = branchgrpo.rollout(lambda x, *rest: -x, prompts=[0], latent_shape=[2])
    >>> e = edges(r, branchgrpo.credit(r, branchgrpo.score(r, lambda leaves, prompts: leaves.sum(1))))
    >>> len(e), tuple(e.latent.shape), round(float(e.weight.sum()), 12)
    (218, (218, 2), 1.0)
    >>> c = branchgrpo.credit(r, branchgrpo.score(r, lambda leaves, prompts: leaves.sum(1)))
    >>> round(float(edges(r, c, step_weight="equal_steps").weight.sum()), 12)
    1.0
    """
    table = _core.trained_edges(result, credit, step_weight)
    if not table.node:
        raise ValueError("edges: the credit trains no edge")
    step = np.asarray(table.step, dtype=np.int64)
    parent_row = np.asarray(table.parent_row, dtype=np.int64)
    row = np.asarray(table.row, dtype=np.int64)
    steps = np.unique(step)  # the credit's edges come by step: one gather per step keeps that order

    def gathered(rows: np.ndarray, offset: int) -> torch.Tensor:
        # Rows `rows` of the latents at step s + offset, for the edges leaving step s, over every step.
        parts = [
            result.latents[s + offset].index_select(0, _index(rows[step == s], result.latents[s + offset]))
            for s in steps
        ]
        return torch.cat(parts)

    latent = gathered(parent_row, 0)
    next_latent = gathered(row, 1)
    tree = result.tree
    node = torch.tensor(table.node, dtype=torch.int64)
    tree_of = node // tree.nodes_per_tree
    f64 = {"dtype": torch.float64}
    return Edges(
        node=node,
        step=torch.from_numpy(step),
        sigma=torch.tensor(table.sigma, **f64),
        prompt=torch.from_numpy(tree.prompts.astype(np.int64))[tree_of],
        tree=tree_of,
        latent=latent,
        next_latent=next_latent,
        x_coeff=torch.tensor(table.x_coeff, **f64),
        velocity_coeff=torch.tensor(table.velocity_coeff, **f64),
        std=torch.tensor(table.std, **f64),
        old_log_prob=torch.tensor(table.old_log_prob, **f64),
        advantage=torch.tensor(table.advantage, **f64),
        weight=torch.tensor(table.weight, **f64),
    )


def _index(rows: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """Row indices as an int64 tensor on ``like``'s device."""
    return torch.from_numpy(rows).to(like.device)


def transition_log_prob(edges: Edges, velocity: torch.Tensor, rows: slice = ALL) -> torch.Tensor:
    """Each edge's log-prob under ``velocity`` (the model's output for ``edges.latent[rows]``, with gradients), in
    float64: the row's mean over elements of log N(next; x_coeff latent + velocity_coeff v, std^2), as the engine
    scores it. With the rollout's own velocity it is the rollout's ``old_log_prob``.

    >>> import branchgrpo
    >>> r = branchgrpo.rollout(lambda x, *rest: -x, prompts=[0], latent_shape=[2], dtype=torch.float64)
    >>> e = edges(r, branchgrpo.credit(r, branchgrpo.score(r, lambda leaves, prompts: leaves.sum(1))))
    >>> bool(torch.allclose(transition_log_prob(e, -e.latent), e.old_log_prob, rtol=1e-12, atol=0))
    True
    >>> transition_log_prob(e, -e.latent[:2], slice(0, 2)).shape
    torch.Size([2])
    >>> transition_log_prob(e, -e.latent, slice(0, 2))
    Traceback (most recent call last):
    ValueError: transition_log_prob: velocity of shape (218, 2) for edges of shape (2, 2)
    """
    if not isinstance(velocity, torch.Tensor):
        raise TypeError(f"transition_log_prob: velocity = {type(velocity).__name__}: must be a torch.Tensor")
    if velocity.shape != edges.latent[rows].shape:
        raise ValueError(
            f"transition_log_prob: velocity of shape {tuple(velocity.shape)} for edges of shape "
            f"{tuple(edges.latent[rows].shape)}"
        )
    x = edges.latent[rows].to(torch.float64)
    shape = (-1,) + (1,) * (x.dim() - 1)
    x_coeff = edges.x_coeff[rows].to(x.device).view(shape)
    velocity_coeff = edges.velocity_coeff[rows].to(x.device).view(shape)
    mean = x_coeff * x + velocity_coeff * velocity.to(torch.float64)
    return _torch_ops.row_log_probs(edges.next_latent[rows], mean, edges.std[rows])


def ppo_loss(
    log_prob: torch.Tensor,
    edges: Edges,
    rows: slice = ALL,
    *,
    clip_range: float | None = None,
    advantage_clip: float | None = None,
) -> torch.Tensor:
    """ppo_ratio's loss over ``edges[rows]``: sum of weight x max(-A r, -A clamp(r, 1 - eps, 1 + eps)) with
    r = exp(log_prob - old_log_prob) and A clipped to [-advantage_clip, advantage_clip] (defaults and rules:
    ppo_options). Each edge's term and its derivative are the engine's (loss/ppo.hpp: ppo_clipped_loss and
    ppo_clipped_loss_gradient); differentiable in ``log_prob``. At the first optimizer step (r = 1) it is
    -sum(weight A).

    >>> import branchgrpo
    >>> r = branchgrpo.rollout(lambda x, *rest: -x, prompts=[0], latent_shape=[2], dtype=torch.float64)
    >>> e = edges(r, branchgrpo.credit(r, branchgrpo.score(r, lambda leaves, prompts: leaves.sum(1))))
    >>> a = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    >>> loss = ppo_loss(transition_log_prob(e, a * e.latent), e)
    >>> bool(abs(loss - (-(e.weight * e.advantage.clamp(-5, 5)).sum())) < 1e-12)
    True
    >>> loss.backward(); a.grad is not None
    True
    >>> ppo_loss(e.old_log_prob, e, clip_range=1.5)
    Traceback (most recent call last):
    ValueError: loss.clip_range = 1.5: must be in (0, 1)
    """
    default_clip, default_advantage_clip = _core.ppo_defaults()
    eps = default_clip if clip_range is None else clip_range
    cap = default_advantage_clip if advantage_clip is None else advantage_clip
    return _PpoLoss.apply(log_prob, edges.old_log_prob[rows], edges.advantage[rows], edges.weight[rows], eps, cap)


class _PpoLoss(torch.autograd.Function):
    """sum_i weight_i loss_i with the engine's per-edge PPO terms; backward: weight_i d loss_i / d log_prob_i."""

    @staticmethod
    def forward(ctx, log_prob, old_log_prob, advantage, weight, clip_range, advantage_clip):  # noqa: ANN001
        host = log_prob.detach().to("cpu", torch.float64)
        loss, gradient = _core.ppo_terms(
            host.tolist(), old_log_prob.tolist(), advantage.tolist(), float(clip_range), float(advantage_clip)
        )
        weight = weight.to(torch.float64)
        ctx.save_for_backward((weight * torch.tensor(gradient, dtype=torch.float64)).to(log_prob.device))
        return (weight * torch.tensor(loss, dtype=torch.float64)).sum().to(log_prob.device)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        (per_edge,) = ctx.saved_tensors
        return grad * per_edge, None, None, None, None, None
