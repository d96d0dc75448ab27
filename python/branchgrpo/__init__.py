"""BranchGRPO's C++ engine from Python: tree plans, trees, methods, the rollout, rewards and credit (docs/python.md).

The package binds the one engine the C++ library and the ``branchgrpo`` tool run; every name, rule and number comes
from the library's own descriptions.

>>> import branchgrpo
>>> branchgrpo.method_plan("branch", 20).leaf_count
16
>>> branchgrpo.method_plan("dance", 20).evaluations
305
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from branchgrpo import _core, _torch_ops
from branchgrpo._checks import integer, integers, rollout_arguments
from branchgrpo._core import Credit, Rollout, Tree, TreePlan
from branchgrpo.method import Method, as_method
from branchgrpo.trainer import Policy, Trainer
from branchgrpo.update import Edges, edges, ppo_loss, transition_log_prob

__version__ = "0.1.0"

__all__ = [
    "Credit",
    "Edges",
    "Method",
    "Policy",
    "Rollout",
    "Scores",
    "Tree",
    "Trainer",
    "TreePlan",
    "__version__",
    "credit",
    "edges",
    "method_plan",
    "methods",
    "plan",
    "ppo_loss",
    "rollout",
    "score",
    "topologies",
    "transition_log_prob",
]


def plan(kind: str, steps: int, **params: Any) -> TreePlan:
    """The tree plan of topology ``kind`` over ``steps`` denoising steps, with its parameters set by name.

    The parameters and their rules are the topology's own (``topologies()``), as a run config's ``[topology]``
    section takes them; a bad one raises ``ValueError`` naming it.

    >>> p = plan("split_schedule", 20, split_steps=[0, 3, 6, 9], branching=[2])
    >>> (p.node_count, p.leaf_count, p.evaluations, p.edge_count)
    (219, 16, 203, 218)
    >>> p.branching_steps
    [0, 3, 6, 9]
    >>> plan("sequential", 20, group_size=4).roots
    1
    >>> plan("split_schedule", 20, branchng=[2])
    Traceback (most recent call last):
    ValueError: topology.branchng: unknown key (split_schedule has: split_steps, branching)
    """
    return _core.plan(kind, steps, **params)


def topologies() -> list[dict[str, Any]]:
    """Every topology: its name, summary and parameters (name, default, rule, meaning).

    >>> [t["name"] for t in topologies()]
    ['split_schedule', 'sequential', 'flow_grpo_fast', 'adaptive_branching']
    >>> topologies()[1]["parameters"][0]["name"]
    'group_size'
    """
    return _core.topologies()


def methods() -> list[str]:
    """Every method name the engine knows (``with_method``), dance first.

    >>> methods()[:3]
    ['dance', 'branch', 'branch-widpru']
    """
    return _core.methods()


def method_plan(name: str, steps: int) -> TreePlan:
    """The tree plan of method ``name`` over ``steps`` steps.

    >>> method_plan("branch-mix-flash", 20).kinds[:3]
    ['sde', 'sde', 'sde']
    >>> method_plan("grpo", 20)
    Traceback (most recent call last):
    ValueError: unknown method 'grpo' ...
    """
    return _core.method_plan(name, steps)


def rollout(
    velocity: Callable[..., Any],
    *,
    prompts: Sequence[int],
    latent_shape: Sequence[int],
    method: str | Method = "branch",
    steps: int = 20,
    shift: float = 3.0,
    sigmas: Sequence[float] | None = None,
    seed: int = 0,
    iteration: int = 0,
    max_batch: int = 64,
    device: Any = "cpu",
    dtype: Any = None,
) -> Rollout:
    """One iteration's rollout of ``method``'s trees, one per prompt, by the C++ engine on torch latents.

    The engine batches each step's frontier (at most ``max_batch`` rows per call) and calls
    ``velocity(latents, sigma, step, prompts, trees)`` once per batch: ``latents`` is a tensor of rows on
    ``device`` in ``dtype`` (default float32), ``prompts`` and ``trees`` int64 tensors on that device with each
    row's prompt and tree key; it returns the velocity, a tensor like ``latents``. The noise is the engine's keyed
    draw (seed, iteration, tree, node), the same as the C++ tool's, and the schedule the shifted linear one
    (``shift``) or, given, ``sigmas``: steps + 1 values decreasing from at most 1 to 0 (e.g. a diffusers pipeline's,
    ``branchgrpo.diffusers``), which the Rollout keeps as ``sigmas``. ``method`` is a name (``methods()``) or a
    ``Method`` with overridden components; the Rollout keeps it as ``method``, whose normalizer ``credit`` then uses.

    >>> r = rollout(lambda x, sigma, step, prompts, trees: -x, prompts=[0, 1], latent_shape=[2, 4, 4], steps=20)
    >>> (r.tree.node_count, r.evaluations, len(r.latents), tuple(r.latents[-1].shape))
    (438, 406, 21, (32, 2, 4, 4))
    >>> r.sigmas[:3].round(4).tolist()
    [1.0, 0.9828, 0.9643]
    >>> two = dict(method="dance", prompts=[0], latent_shape=[2], steps=2)
    >>> rollout(lambda x, *rest: -x, sigmas=[0.9, 0.4, 0.0], **two).sigmas.tolist()
    [0.9, 0.4, 0.0]
    >>> rollout(lambda x, *rest: x[:1], prompts=[0, 1], latent_shape=[2], steps=20)
    Traceback (most recent call last):
    ValueError: velocity at iteration 0, step 0 (2 rows): returned shape (1, 2), the latents are (2, 2)
    >>> rollout(lambda x, *rest: -x, sigmas=[1.0, 0.5], **two)
    Traceback (most recent call last):
    ValueError: rollout: sigmas has 2 values: must have steps + 1 = 3
    """
    latent, steps, shift, sigma_list, seed, max_batch, torch_device, torch_dtype = rollout_arguments(
        "rollout", latent_shape, steps, shift, seed, max_batch, device, dtype, sigmas
    )
    prompt_list = integers("rollout", "prompts", prompts, 0)
    iteration = integer("rollout", "iteration", iteration, 0, 2**32 - 1)
    if not callable(velocity):
        raise TypeError(f"rollout: velocity = {velocity!r}: must be callable")
    return _core.rollout(
        as_method(method),
        velocity,
        prompt_list,
        latent,
        steps,
        shift,
        sigma_list,
        seed,
        iteration,
        max_batch,
        torch_device,
        torch_dtype,
    )


class Scores(np.ndarray):
    """Each leaf's reward in ``result.tree.leaves`` order (a float64 numpy array) with, for a reward of named parts,
    each part's weight and scores (``components``: name -> (weight, scores); the array is sum of weight x scores).
    ``credit`` takes it (a per-reward normalizer uses the parts)."""

    components: dict[str, tuple[float, np.ndarray]]

    def __new__(cls, total: np.ndarray, components: dict[str, tuple[float, np.ndarray]]) -> Scores:
        out = np.asarray(total, dtype=np.float64).view(cls)
        out.components = components
        return out

    def __array_finalize__(self, obj: Any) -> None:
        self.components = getattr(obj, "components", {})


def score(result: Rollout, reward: Callable[..., Any], *, groupwise: bool = False, win_rate: bool = False) -> Scores:
    """Each leaf's reward, in ``result.tree.leaves`` order: ``reward(leaves, prompts)`` (pointwise) or, with
    ``groupwise``, ``reward(leaves, prompts, groups)`` where ``groups[i]`` is leaf i's tree (GRPO-style scorers that
    rank a prompt's samples together). ``leaves`` is the last step's latents, ``prompts`` and ``groups`` int64
    tensors on their device. The reward returns one finite number per leaf, or a mapping of named parts (each scores
    or (weight, scores), as a run config's [[rewards]] entries), else a ``ValueError`` naming the leaves. With
    ``win_rate`` each score (each part's) becomes its win rate within its tree (Pref-GRPO; the config's
    ``win_rate = true``).

    >>> r = rollout(lambda x, *rest: -x, prompts=[0, 1], latent_shape=[2], method="dance")
    >>> s = score(r, lambda leaves, prompts: -leaves.square().sum(1))
    >>> s.shape
    (32,)
    >>> parts = score(r, lambda leaves, prompts: {"near": -leaves.square().sum(1), "x": (0.1, leaves[:, 0])})
    >>> sorted(parts.components), parts.components["x"][0]
    (['near', 'x'], 0.1)
    >>> score(r, lambda leaves, prompts: leaves[:, 0], win_rate=True).round(4).min()
    np.float64(0.0)
    >>> score(r, lambda leaves, prompts: leaves.sum(1)[:3])
    Traceback (most recent call last):
    ValueError: reward returned 3 scores for 32 leaves
    """
    tree = result.tree
    leaves = result.latents[-1]
    groups = tree.leaves.astype(np.int64) // tree.nodes_per_tree
    prompts = tree.prompts.astype(np.int64)[groups]
    total, parts = _torch_ops.call_reward(reward, leaves, prompts, groups, None, groupwise, win_rate)
    return Scores(total, {name: (weight, rows) for name, weight, rows in parts})


def credit(
    result: Rollout, rewards: Scores | Sequence[float] | np.ndarray, *, iteration: int = 0, total_iterations: int = 1
) -> Credit:
    """Stage 3 of an iteration on ``result``'s forest: its method's fusion, normalizer and pruner over the leaf
    ``rewards`` (``score``'s order; its parts, if any, for a per-reward normalizer). A tree with a NaN reward is left
    out, as the C++ trainer leaves it out.

    Returns a ``Credit``: ``kept_trees``, ``fused`` and ``advantages`` and ``mask`` per node of the kept trees,
    ``trained`` (the nodes of the whole forest whose SDE edges train, by step) and ``edge_advantage`` (per node of
    the whole forest: a trained edge's advantage, else 0).

    >>> r = rollout(lambda x, *rest: -x, prompts=[0, 1], latent_shape=[2])
    >>> c = credit(r, score(r, lambda leaves, prompts: -leaves.square().sum(1)))
    >>> (len(c.trained), c.edge_advantage.shape)
    (436, (438,))
    >>> abs(float(c.advantages[r.tree.leaves[:16]].mean())) < 1e-12  # depth-wise: each depth's mean is 0
    True
    """
    values = np.ascontiguousarray(np.asarray(rewards, dtype=np.float64).reshape(-1))
    parts = rewards.components if isinstance(rewards, Scores) else {}
    components = [(name, weight, rows.tolist()) for name, (weight, rows) in parts.items()]
    return _core.credit(result.method, result.tree, values.tolist(), components, iteration, total_iterations)
