"""The C++ trainer driving a Python policy (update way (a) of docs/python.md): ``Trainer.step`` runs one
``train_iteration`` of the engine (rollout, rewards, credit, the objective's update) with the user's velocity,
optimizer, optional reference model and torch.distributed process group.

The engine computes what each objective asks (PPO clip, GRPO-Guard's RatioNorm, step weights, the KL term,
DiffusionNFT, AWM) and hands the policy, per batch of rows, the weights d loss / d log-prob; the policy recomputes
the rows' log-probs with gradients and calls backward on their weighted sum. So every objective of the C++ library
trains a torch model, with no second implementation of it in Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from branchgrpo import _core, _distributed, _torch_ops
from branchgrpo._checks import integer, integers, rollout_arguments
from branchgrpo.method import Method, as_method

GRADIENT_MODES = ("sum", "averaged")
# Where a Trainer step's time goes outside the engine: the model's calls, the optimizer and the reward (seconds).
TIMED_PARTS = ("sample", "reference", "forward", "backward", "optimizer", "score")


class Policy:
    """A trainable velocity for ``Trainer``: ``velocity(latents, sigma, step, prompts, trees)`` with gradients,
    stepped by ``optimizer``.

    ``reference`` (same signature, no gradients needed) is the frozen model of the loss's KL term
    (``loss={"kl_beta": ...}``); ``sample_velocity`` the one the rollout calls (default ``velocity``; with DDP,
    the unwrapped module, so that ranks with fewer trees make no extra collective). ``gradients`` says what the
    backward pass leaves in the parameters' ``.grad`` on several processes: ``"sum"`` (a plain model: the trainer
    sums them over the ranks) or ``"averaged"`` (a DDP- or FSDP2-wrapped model, which averaged them: the trainer
    scales them back to the sum, and pads the ranks with fewer rows with empty backward passes so that every rank
    makes the same number). ``max_grad_norm`` clips the gradient before each optimizer step.

    >>> model = torch.nn.Linear(1, 1, bias=False, dtype=torch.float64)
    >>> policy = Policy(lambda x, *rest: model(x), torch.optim.SGD(model.parameters(), lr=0.1))
    >>> policy.has_reference, len(policy.parameters)
    (False, 1)
    >>> Policy(model, torch.optim.SGD(model.parameters(), lr=0.1), gradients="mean")
    Traceback (most recent call last):
    ValueError: Policy: gradients = 'mean': must be 'sum' or 'averaged'
    """

    def __init__(
        self,
        velocity: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        *,
        reference: Callable[..., torch.Tensor] | None = None,
        sample_velocity: Callable[..., torch.Tensor] | None = None,
        parameters: Iterable[torch.nn.Parameter] | None = None,
        gradients: str = "sum",
        max_grad_norm: float | None = None,
    ) -> None:
        for name, fn in (("velocity", velocity), ("reference", reference), ("sample_velocity", sample_velocity)):
            if fn is not None and not callable(fn):
                raise TypeError(f"Policy: {name} = {fn!r}: must be callable")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"Policy: optimizer = {optimizer!r}: must be a torch.optim.Optimizer")
        if gradients not in GRADIENT_MODES:
            raise ValueError(f"Policy: gradients = {gradients!r}: must be 'sum' or 'averaged'")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"Policy: max_grad_norm = {max_grad_norm!r}: must be positive (or None)")
        self.velocity = velocity
        self.optimizer = optimizer
        self.reference = reference
        self.sample_velocity = sample_velocity or velocity
        if parameters is None:
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
        self.parameters = [p for p in parameters if p.requires_grad]
        self.gradients = gradients
        self.max_grad_norm = max_grad_norm
        self.template: torch.Tensor | None = None  # one row of latents, for padding calls (set by Trainer)
        self.seconds = dict.fromkeys(TIMED_PARTS, 0.0)  # the current step's time in each part (reset by Trainer)

    @property
    def has_reference(self) -> bool:
        return self.reference is not None

    # --- What the engine calls (python/src/trainer.hpp: python_policy) ---

    def _sample(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        start = time.perf_counter()
        with torch.no_grad():
            v = self.sample_velocity(x, *rest)
        self.seconds["sample"] += time.perf_counter() - start
        return v

    def _reference(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        if self.reference is None:
            raise ValueError("Policy: the loss's KL term needs a reference velocity (Policy(..., reference=...))")
        start = time.perf_counter()
        with torch.no_grad():
            v = self.reference(x, *rest)
        self.seconds["reference"] += time.perf_counter() - start
        return v

    def _accumulate(
        self,
        x: torch.Tensor,
        next_: torch.Tensor,
        sigma: float,
        step: int,
        x_coeff: float,
        velocity_coeff: float,
        std: np.ndarray,
        prompts: np.ndarray,
        trees: np.ndarray,
        weights: Callable[[np.ndarray], np.ndarray],
        iteration: int,
    ) -> np.ndarray:
        """The rows' log-probs under the current parameters; adds the gradient of sum_r w_r log-prob_r, with w the
        objective's weights for those log-probs (``weights``, computed by the engine)."""
        rows = x.shape[0]
        if rows == 0:
            self._pad_accumulate()
            return np.zeros(0)
        where = f"policy velocity at iteration {iteration}, step {step} ({rows} rows)"
        with torch.enable_grad():
            rows_prompts, rows_trees = torch.from_numpy(prompts).to(x.device), torch.from_numpy(trees).to(x.device)
            start = time.perf_counter()
            v = self.velocity(x, sigma, step, rows_prompts, rows_trees)
            self.seconds["forward"] += time.perf_counter() - start
            v = _torch_ops.checked_velocity(v, x, where)
            mean = _torch_ops.affine(x_coeff, x, velocity_coeff, v, x.dtype)  # as the rollout computed it
            log_probs = _torch_ops.row_log_probs(next_, mean, torch.from_numpy(std))
            values = log_probs.detach().cpu().numpy()
            w = torch.from_numpy(np.asarray(weights(values), dtype=np.float64)).to(log_probs.device)
            loss = (w * log_probs).sum()
            start = time.perf_counter()
            loss.backward()
            self.seconds["backward"] += time.perf_counter() - start
        return values

    def _pad_accumulate(self) -> None:
        """With gradients = "averaged", an empty backward pass (the wrapper's collectives, with zeros)."""
        if self.gradients != "averaged":
            return
        if self.template is None:
            raise ValueError("Policy: a padding call needs the latents' shape (use the policy through a Trainer)")
        x = self.template
        rows = torch.zeros(1, dtype=torch.int64, device=x.device)
        with torch.enable_grad():
            (self.velocity(x, 1.0, 0, rows, rows).sum() * 0.0).backward()

    def _all_reduce_gradients(self, size: int, group: object | None) -> None:
        if size > 1:
            _distributed.sum_gradients(self.parameters, group, float(size) if self.gradients == "averaged" else 1.0)

    def _apply_update(self) -> None:
        start = time.perf_counter()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.seconds["optimizer"] += time.perf_counter() - start


class Trainer:
    """Runs iterations of ``method`` on ``policy`` with ``reward`` by the C++ trainer (``train_iteration``).

    ``step(prompts)`` rolls out one tree per prompt (with several processes, each rank its share of them: every
    rank passes the same prompts), scores the leaves with ``reward(leaves, prompts)`` (``groupwise``:
    ``reward(leaves, prompts, groups)``, each leaf's tree; a mapping of named parts as ``score`` takes it; with
    ``win_rate``, each score's win rate within its tree), assigns the credit on the whole forest and runs the
    method's objective on this rank's rows, ``updates_per_iteration`` optimizer steps. The schedule is the shifted
    linear one (``shift``) or ``sigmas`` (steps + 1 values from at most 1 to 0, as ``rollout`` takes them; e.g. a
    diffusers pipeline's, ``branchgrpo.diffusers``). ``loss`` takes the run
    config's [loss] keys (clip_range, advantage_clip, kl_beta, ratio_norm, step_weight) with their rules.
    ``group`` is a torch.distributed process group (None: the default one when initialized, else one process).

    The trainer's state (iteration, the method's normalizer state) is ``state_dict()``; save it beside the model's
    and the optimizer's, and a resumed run continues as an uninterrupted one (the noise is keyed by seed and
    iteration).

    >>> model = torch.nn.Linear(2, 2, bias=False, dtype=torch.float64)
    >>> policy = Policy(lambda x, *rest: model(x), torch.optim.SGD(model.parameters(), lr=0.01))
    >>> trainer = Trainer(policy, lambda leaves, prompts: -leaves.square().sum(1), latent_shape=[2], steps=8,
    ...                   method=Method("branch", topology={"split_steps": [0, 2], "branching": [2]}),
    ...                   dtype=torch.float64)
    >>> stats = trainer.step([0, 1])
    >>> stats["edges_trained"], trainer.iteration
    (56, 1)
    """

    def __init__(
        self,
        policy: Policy,
        reward: Callable[..., Any],
        *,
        latent_shape: Sequence[int],
        method: str | Method = "branch",
        steps: int = 20,
        shift: float = 3.0,
        sigmas: Sequence[float] | None = None,
        seed: int = 0,
        max_batch: int = 64,
        updates_per_iteration: int = 1,
        total_iterations: int = 1,
        loss: dict[str, Any] | None = None,
        groupwise: bool = False,
        win_rate: bool = False,
        device: Any = "cpu",
        dtype: torch.dtype | None = None,
        group: object | None = None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"Trainer: policy = {policy!r}: must be a branchgrpo.Policy")
        if not callable(reward):
            raise TypeError(f"Trainer: reward = {reward!r}: must be callable")
        self.policy = policy
        self.reward = reward
        self.method = as_method(method)
        self.groupwise = bool(groupwise)
        self.win_rate = bool(win_rate)
        self.group = group
        self.rank, self.size = _distributed.rank_and_size(group)
        self.iteration = 0
        self.rollout_arguments = rollout_arguments(
            "Trainer", latent_shape, steps, shift, seed, max_batch, device, dtype, sigmas
        )
        self.options = _core.training_options(
            max_batch,
            seed,
            integer("Trainer", "updates_per_iteration", updates_per_iteration, 1, 2**31 - 1),
            integer("Trainer", "total_iterations", total_iterations, 1, 2**31 - 1),
            dict(loss or {}),
        )
        latent, _, _, _, _, _, torch_device, torch_dtype = self.rollout_arguments
        policy.template = torch.zeros([1, *latent], device=torch_device, dtype=torch_dtype)

    def step(self, prompts: Sequence[int]) -> dict[str, float]:
        """One iteration on ``prompts`` (one tree each); returns its statistics (reward_mean, edges_trained, loss,
        clip_fraction, kl, seconds, ...), equal on every rank, and where this rank's time went: ``<part>_seconds``
        for the model's sampling, reference, forward (update) and backward calls, the optimizer and the reward
        (``score_seconds``), and ``engine_seconds``, the rest (the package's own time; host clock, so on CUDA it
        counts launches, not kernels).
        """
        prompt_list = integers("Trainer.step", "prompts", prompts, 0)
        latent, steps, shift, sigma_list, _, _, device, dtype = self.rollout_arguments
        seconds = self.policy.seconds
        seconds.update(dict.fromkeys(TIMED_PARTS, 0.0))

        def reward(*arguments: Any) -> Any:
            start = time.perf_counter()
            out = self.reward(*arguments)
            seconds["score"] += time.perf_counter() - start
            return out

        stats = _core.train_step(
            self.method,
            self.policy,
            reward,
            self.groupwise,
            self.win_rate,
            prompt_list,
            latent,
            steps,
            shift,
            sigma_list,
            self.iteration,
            self.options,
            device,
            dtype,
            self.group,
        )
        self.iteration += 1
        for part in TIMED_PARTS:
            stats[f"{part}_seconds"] = seconds[part]
        stats["engine_seconds"] = stats["seconds"] - sum(seconds.values())
        return stats

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state: the next iteration, the seed and the method's (its normalizer's buffers).

        >>> model = torch.nn.Linear(2, 2, bias=False)
        >>> policy = Policy(model, torch.optim.SGD(model.parameters(), lr=0.01))
        >>> Trainer(policy, lambda leaves, prompts: leaves.sum(1), latent_shape=[2]).state_dict()["iteration"]
        0
        """
        return {"iteration": self.iteration, "seed": self.options.seed, "method": self.method.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()``; the seed and the method must be this trainer's."""
        for key in ("iteration", "seed", "method"):
            if key not in state:
                raise ValueError(f"Trainer.load_state_dict: the state has no {key!r} (keys: {sorted(state)})")
        if state["seed"] != self.options.seed:
            raise ValueError(
                f"Trainer.load_state_dict: the state's seed = {state['seed']}, this trainer's is "
                f"{self.options.seed}: a resumed run keeps its seed"
            )
        self.method.load_state_dict(state["method"])
        self.iteration = integer("Trainer.load_state_dict", "iteration", state["iteration"], 0, 2**31 - 1)
