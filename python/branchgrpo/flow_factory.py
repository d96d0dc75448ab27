"""BranchGRPO trees in Flow-Factory (github X-GenGroup/Flow-Factory): a trainer, ``branchgrpo``, for its registries.

Flow-Factory trains diffusion and flow models with GRPO-style RL through model adapters; it samples groups of
independent trajectories. The trainer here, ``BranchGRPOTrainer``, is Flow-Factory's ``GRPOTrainer`` whose sampling
is the engine's tree rollout (``branchgrpo.rollout``: the adapter's ``forward`` gives each node's velocity, the
engine draws the keyed noise) and whose advantages are the engine's credit (``branchgrpo.credit``: the method's
fusion up the tree and its per-depth normalization); Flow-Factory's own ``optimize()`` then trains the tree's edges,
one Flow-Factory sample per trained edge (docs/flow_factory.md).

This module imports without Flow-Factory (its doctests run in the project's venv): the helpers below need only the
engine. Where ``flow_factory`` is importable, importing the module registers the trainer in Flow-Factory's trainer
and training-arguments registries, as ``branchgrpo`` and as ``TRAINER_TYPE`` (the name a YAML config gives to
Flow-Factory's own CLI, which has not imported this module); elsewhere ``BranchGRPOTrainer`` and the other
Flow-Factory names raise a one-line ``ImportError`` saying what to install.

>>> from branchgrpo import flow_factory
>>> flow_factory.TRAINER_NAME, flow_factory.TRAINER_TYPE
('branchgrpo', 'branchgrpo.flow_factory.BranchGRPO')
>>> m = flow_factory.tree_method("branch", steps=4, split_steps=[0, 2], branching=[2])
>>> m.components["stepper"], m.plan(4).leaf_count, m.plan(4).branching_steps
('flow_grpo_sde', 4, [0, 2])
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

import branchgrpo
from branchgrpo import _core
from branchgrpo.method import Method

__all__ = [
    "DYNAMICS",
    "TRAINER_NAME",
    "TRAINER_TYPE",
    "available",
    "register",
    "stepper_for",
    "tree_method",
]

TRAINER_NAME = "branchgrpo"
"""The trainer's name in Flow-Factory's registries once this module is imported (``trainer_type: branchgrpo``)."""

TRAINER_TYPE = "branchgrpo.flow_factory.BranchGRPO"
"""The ``trainer_type`` for Flow-Factory's own CLI: resolving its training arguments imports this module, which
registers the trainer under this name as well (Flow-Factory has no plugin entry points)."""

DYNAMICS = {"Flow-SDE": ("flow_grpo_sde", "noise_level"), "Dance-SDE": ("dance_sde", "eta"), "CPS": ("cps", "eta")}
"""Flow-Factory's SDE ``dynamics_type`` -> the engine's stepper and the parameter its ``noise_level`` sets: the same
transition (mean, std; for CPS the log-prob up to a constant), docs/steppers.md."""

_SECTIONS = ("topology", "correlator", "fusion", "advantage", "pruning")
_INSTALL = (
    "branchgrpo.flow_factory needs Flow-Factory (github X-GenGroup/Flow-Factory) and its dependencies (datasets, "
    "imageio, einops, ...): pip install its checkout, or put its src/ on PYTHONPATH in an environment that has them "
    "(scripts/flow_factory_env.sh CHECKOUT makes one)"
)


def stepper_for(dynamics_type: str, noise_level: float) -> dict[str, Any]:
    """The Method ``rollout`` section whose stepper is Flow-Factory's SDE ``dynamics_type`` at ``noise_level``.

    >>> stepper_for("Flow-SDE", 0.7)
    {'stepper': 'flow_grpo_sde', 'noise_level': 0.7}
    >>> stepper_for("Dance-SDE", 0.3)
    {'stepper': 'dance_sde', 'eta': 0.3}
    >>> stepper_for("ODE", 0.0)
    Traceback (most recent call last):
    ValueError: scheduler.dynamics_type = 'ODE': the branchgrpo trainer samples SDE trees (one of Flow-SDE, ...)
    """
    if dynamics_type not in DYNAMICS:
        raise ValueError(
            f"scheduler.dynamics_type = {dynamics_type!r}: the branchgrpo trainer samples SDE trees "
            f"(one of {', '.join(DYNAMICS)})"
        )
    if isinstance(noise_level, bool) or not isinstance(noise_level, (int, float)) or not noise_level > 0:
        raise ValueError(f"scheduler.noise_level = {noise_level!r}: must be a positive number for an SDE tree")
    stepper, key = DYNAMICS[dynamics_type]
    return {"stepper": stepper, key: float(noise_level)}


def tree_method(
    name: str = "branch",
    *,
    steps: int,
    split_steps: Sequence[int] | None = None,
    branching: Sequence[int] | None = None,
    sections: dict[str, Any] | None = None,
    dynamics_type: str = "Flow-SDE",
    noise_level: float = 0.7,
) -> Method:
    """The engine's ``Method`` for the trainer's options (the ``train.tree_*`` keys): method ``name``
    (``branchgrpo.methods()``), the topology's ``split_steps`` and ``branching`` where given, the run config's other
    ``sections`` (topology, correlator, fusion, advantage, pruning; docs/config.md) and the stepper of Flow-Factory's
    scheduler. Its plan over ``steps`` (``num_inference_steps``) is checked. Refused, each with one line naming the
    value: an unknown method or key, an objective other than PPO (Flow-Factory's GRPO ``optimize`` is the update), the
    ``scaled`` correlator (its split edges are drawn wider than the stepper's std, which Flow-Factory's log-prob uses)
    and a ``rollout`` or ``objective`` section.

    >>> tree_method("dance", steps=10).plan(10).leaf_count
    16
    >>> tree_method("branch", steps=4, split_steps=[0, 9])
    Traceback (most recent call last):
    ValueError: train.tree_method = 'branch' over num_inference_steps = 4: ...
    >>> tree_method("grpo", steps=4)
    Traceback (most recent call last):
    ValueError: train.tree_method = 'grpo': unknown (one of dance, branch, branch-widpru, ...)
    >>> tree_method("branch-nft", steps=4)
    Traceback (most recent call last):
    ValueError: train.tree_method = 'branch-nft': its objective is nft; ...
    >>> tree_method("branch", steps=4, sections={"correlator": {"kind": "scaled"}})
    Traceback (most recent call last):
    ValueError: train.tree_sections.correlator = {'kind': 'scaled'}: ...
    >>> tree_method("branch", steps=4, sections={"rollout": {"eta": 0.5}})
    Traceback (most recent call last):
    ValueError: train.tree_sections.rollout: ...
    """
    known = branchgrpo.methods()
    if not isinstance(name, str) or name not in known:
        raise ValueError(f"train.tree_method = {name!r}: unknown (one of {', '.join(known)})")
    given = {} if sections is None else sections
    if not isinstance(given, dict):
        raise ValueError(f"train.tree_sections = {given!r}: must be a mapping of sections ({', '.join(_SECTIONS)})")
    for key, value in given.items():
        if key not in _SECTIONS:
            why = (
                "set by scheduler.dynamics_type and scheduler.noise_level"
                if key == "rollout"
                else "Flow-Factory's GRPO optimize is the objective"
                if key == "objective"
                else "unknown section"
            )
            raise ValueError(f"train.tree_sections.{key}: {why} (the sections here: {', '.join(_SECTIONS)})")
        if not isinstance(value, dict):
            raise ValueError(f"train.tree_sections.{key} = {value!r}: must be a mapping (a config table)")
    chosen = {key: dict(value) for key, value in given.items()}
    topology = chosen.setdefault("topology", {})
    for key, value in (("split_steps", split_steps), ("branching", branching)):
        if value is not None:
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ValueError(f"train.tree_{key} = {value!r}: must be a list of integers")
            topology[key] = list(value)
    if not topology:
        del chosen["topology"]
    chosen["rollout"] = stepper_for(dynamics_type, noise_level)
    try:
        method = Method(name, **chosen)
    except (TypeError, ValueError) as error:
        shown = "" if not given and split_steps is None and branching is None else " with its options"
        raise ValueError(f"train.tree_method = {name!r}{shown}: {error}") from None
    objective = method.components["objective"]
    if objective != "ppo":
        ppo = [m for m in known if Method(m).components["objective"] == "ppo"]
        raise ValueError(
            f"train.tree_method = {name!r}: its objective is {objective}; the branchgrpo trainer reuses "
            f"Flow-Factory's GRPO (PPO-clip) optimize, so use one of {', '.join(ppo)}"
        )
    if method.components["correlator"] == "scaled":
        raise ValueError(
            f"train.tree_sections.correlator = {given.get('correlator')!r}: scaled draws split edges at a wider "
            "std than the stepper's, which Flow-Factory's log-prob assumes (use correlated, independent, antithetic "
            "or orthogonal)"
        )
    try:
        method.plan(steps)
    except (TypeError, ValueError) as error:
        raise ValueError(f"train.tree_method = {name!r} over num_inference_steps = {steps!r}: {error}") from None
    return method


def available() -> bool:
    """Whether ``flow_factory`` can be found on this interpreter's path (the trainer is then registered on import)."""
    return importlib.util.find_spec("flow_factory") is not None


# --- The trainer: built on first use, where Flow-Factory imports ---

_BUILT: dict[str, Any] = {}


def register() -> tuple[type, type]:
    """Builds the trainer and its training arguments on Flow-Factory's classes and registers both in its two
    registries (``TRAINER_NAME`` and ``TRAINER_TYPE``); returns (BranchGRPOTrainer, BranchGRPOTrainingArguments).
    Without Flow-Factory: a one-line ``ImportError`` saying what to install. Idempotent."""
    if not _BUILT:
        _BUILT.update(_build())
    return _BUILT["BranchGRPOTrainer"], _BUILT["BranchGRPOTrainingArguments"]


def __getattr__(name: str) -> Any:
    if name in ("BranchGRPOTrainer", "BranchGRPOTrainingArguments", "BranchGRPO"):
        register()
        return _BUILT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build() -> dict[str, Any]:
    try:
        from flow_factory.hparams.training_args import _TRAINING_ARGS_REGISTRY, GRPOTrainingArguments
        from flow_factory.samples import BaseSample, T2ISample
        from flow_factory.scheduler import set_scheduler_timesteps
        from flow_factory.trainers.grpo import GRPOTrainer
        from flow_factory.trainers.registry import _TRAINER_REGISTRY, register_trainer
        from flow_factory.utils.base import filter_kwargs
    except ImportError as error:
        raise ImportError(f"{_INSTALL}; the import failed with: {error}") from None

    ff = _FlowFactory(BaseSample, T2ISample, set_scheduler_timesteps, filter_kwargs)

    @dataclasses.dataclass
    class BranchGRPOTrainingArguments(GRPOTrainingArguments):
        """Flow-Factory's GRPO training arguments and the tree's: ``tree_method`` (``branchgrpo.methods()``, one
        with the PPO objective), ``tree_split_steps`` and ``tree_branching`` (its split_schedule topology),
        ``tree_sections`` (the run config's topology, correlator, fusion, advantage and pruning tables) and
        ``tree_max_batch`` (rows per model call in the rollout). ``group_size`` must be 1: a prompt's group is its
        tree's leaves. Each bad value is one ``ValueError`` naming it."""

        tree_method: str = dataclasses.field(
            default="branch", metadata={"help": "BranchGRPO method (branchgrpo.methods(), PPO objective)."}
        )
        tree_split_steps: list[int] | None = dataclasses.field(
            default=None, metadata={"help": "Steps where the tree splits (split_schedule topology)."}
        )
        tree_branching: list[int] | None = dataclasses.field(
            default=None, metadata={"help": "Children per split, one value or one per split step."}
        )
        tree_sections: dict[str, Any] = dataclasses.field(
            default_factory=dict,
            metadata={"help": "Method sections (topology, correlator, fusion, advantage, pruning)."},
        )
        tree_max_batch: int = dataclasses.field(
            default=16, metadata={"help": "Rows per model call in the tree rollout and the leaves' decoding."}
        )

        def __post_init__(self) -> None:
            super().__post_init__()
            unknown = sorted(k for k in self.extra_kwargs if str(k).startswith("tree_"))
            if unknown:
                names = ", ".join(f.name for f in dataclasses.fields(self) if f.name.startswith("tree_"))
                raise ValueError(f"train.{unknown[0]}: unknown key (the tree's keys: {names})")
            if self.group_size != 1:
                raise ValueError(
                    f"train.group_size = {self.group_size!r}: must be 1 with trainer_type {TRAINER_NAME} "
                    "(a prompt's group is its tree's leaves, tree_method's leaf count)"
                )
            max_batch = self.tree_max_batch
            if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
                raise ValueError(f"train.tree_max_batch = {max_batch!r}: must be a positive integer")
            tree_method(
                self.tree_method,
                steps=self.num_inference_steps,
                split_steps=self.tree_split_steps,
                branching=self.tree_branching,
                sections=self.tree_sections,
            )

        def get_num_train_timesteps(self, args: Any) -> int:
            """1: the trainer sets the gradient accumulation per epoch from its edge count (``optimize``)."""
            return 1

    class BranchGRPOTrainer(_TreeTrainer, GRPOTrainer):
        __doc__ = _TreeTrainer.__doc__

    BranchGRPOTrainer.__module__ = __name__
    BranchGRPOTrainingArguments.__module__ = __name__
    BranchGRPOTrainer._ff = ff
    register_trainer(TRAINER_NAME)(BranchGRPOTrainer)
    trainer_path = f"{__name__}.{BranchGRPOTrainer.__name__}"
    _TRAINER_REGISTRY[TRAINER_TYPE.lower()] = trainer_path
    _TRAINING_ARGS_REGISTRY[TRAINER_NAME] = BranchGRPOTrainingArguments
    _TRAINING_ARGS_REGISTRY[TRAINER_TYPE.lower()] = BranchGRPOTrainingArguments
    return {
        "BranchGRPOTrainer": BranchGRPOTrainer,
        "BranchGRPOTrainingArguments": BranchGRPOTrainingArguments,
        "BranchGRPO": BranchGRPOTrainingArguments,
    }


@dataclasses.dataclass(frozen=True)
class _FlowFactory:
    """The Flow-Factory names the trainer calls (imported by ``_build``)."""

    BaseSample: Any
    Sample: Any
    set_scheduler_timesteps: Any
    filter_kwargs: Any


@dataclasses.dataclass
class TreeGeometry:
    """What the rollout needs from the adapter at a resolution: one row's ``latent_shape`` in the adapter's own latent
    layout (the one its ``forward`` and ``decode_latents`` take), the scheduler's ``timesteps`` (steps values, each
    1000 sigma) and ``sigmas`` (steps + 1, ending at 0), both as Flow-Factory's scheduler set them, and the inputs
    of ``forward`` that every row shares (``shared``: FLUX's ``img_ids``), which the edge samples carry too."""

    latent_shape: list[int]
    timesteps: torch.Tensor
    sigmas: list[float]
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)


class _VelocityCache:
    """Each rollout step's velocities (the adapter's ``noise_pred``, as its forward returned them) in the rows'
    order, with a checksum of each call's latents so that they can be matched to the rollout's latents."""

    def __init__(self) -> None:
        self.calls: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def add(self, step: int, latents: torch.Tensor, velocity: torch.Tensor) -> None:
        self.calls.setdefault(step, []).append((_row_sums(latents), velocity.detach()))

    def aligned(self, latents: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Step -> velocities of every row of ``latents[step]``, for the steps whose calls cover those rows in
        order (the engine's frontier batches); a step whose calls do not match is left out."""
        out = {}
        for step, calls in self.calls.items():
            sums = torch.cat([c[0] for c in calls])
            rows = latents[step]
            if sums.shape[0] == rows.shape[0] and torch.equal(sums, _row_sums(rows)):
                out[step] = torch.cat([c[1] for c in calls])
        return out


def _row_sums(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(x.shape[0], -1).to(torch.float64).sum(1).cpu()


class _TreeTrainer:
    """BranchGRPO trees in Flow-Factory: its ``GRPOTrainer`` with the sampling, the rewards' credit and the samples
    of the update taken from the engine.

    Per epoch (Flow-Factory's ``start()``: sample, prepare_feedback, optimize):

    - ``sample()``: the prompts of ``num_batches_per_epoch`` batches of Flow-Factory's dataloader, one tree each of
      ``train.tree_method`` (``branchgrpo.rollout`` keyed by seed, epoch, tree and node), where each node's velocity
      is the adapter's ``forward`` (its ``noise_pred``) and the stepper is Flow-Factory's scheduler's SDE. Returns
      one Flow-Factory sample per leaf (the decoded image, the prompt), in ``tree.leaves`` order, added to the reward
      buffer.
    - ``prepare_feedback(leaves)``: Flow-Factory's rewards of the leaves, then its ``compute_advantages`` with the
      engine's credit as the aggregation: the reward models' weighted sum (their parts kept for a per-reward
      normalizer), the method's fusion up the tree and normalization; each leaf gets its edge's advantage. Then one
      sample per trained edge (``branchgrpo.edges``): latents [parent, child], timesteps [t, t_next], the advantage,
      and the log-prob Flow-Factory's scheduler gives the child (the engine's keyed sample) as ``next_latents``.
    - ``optimize(leaves)``: Flow-Factory's GRPO ``optimize`` itself on the edge samples, with the scheduler's
      ``train_timesteps`` [0] (each edge sample is a one-step trajectory) and, unless set by hand, the gradient
      accumulation that makes ``gradient_step_per_epoch`` optimizer steps (at most) of the edges' micro-batches.

    The last epoch's ``tree_rollout``, ``tree_rewards``, ``tree_credit``, ``leaf_samples`` and ``edge_samples`` are
    kept on the trainer.
    """

    _ff: _FlowFactory

    def __init__(self, **kwargs: Any) -> None:
        config = kwargs["config"]
        scheduler = config.scheduler_args
        args = config.training_args
        self.method: Method = tree_method(
            args.tree_method,
            steps=args.num_inference_steps,
            split_steps=args.tree_split_steps,
            branching=args.tree_branching,
            sections=args.tree_sections,
            dynamics_type=scheduler.dynamics_type,
            noise_level=scheduler.noise_level,
        )
        super().__init__(**kwargs)
        # The reward buffer's groups (groupwise and async rewards) are a tree's leaves.
        self.reward_buffer.group_size = self.method.plan(args.num_inference_steps).leaf_count
        self._prompt_ids: dict[str, int] = {}
        self.tree_rollout: Any = None
        self.tree_rewards: Any = None
        self.tree_credit: Any = None
        self.tree_prompts: dict[str, Any] = {}
        self.leaf_samples: list[Any] = []
        self.edge_samples: list[Any] = []
        self._timesteps: torch.Tensor | None = None
        self._velocities: dict[int, torch.Tensor] = {}
        self._shared: dict[str, Any] = {}
        self._sample_class = _sample_class(self.adapter, self._ff.BaseSample, self._ff.Sample)

    # --- Geometry ---

    def tree_geometry(self) -> TreeGeometry:
        """The latent shape, schedule and shared forward inputs of ``train.resolution`` for this adapter, by the
        adapter's own rules. Known: Flow-Factory's ``sd3-5`` adapter (latents [C, H / f, W / f]) and ``flux1``
        adapter (packed latents [(H / 2f)(W / 2f), 4C] and their ``img_ids``), each with the scheduler's timesteps
        for its token count, as their ``inference`` sets them. Another adapter is a ``ValueError`` naming it:
        subclass the trainer and override this method."""
        adapter, args = self.adapter, self.training_args
        name = type(adapter).__name__
        config = adapter.transformer_config
        device = self.accelerator.device
        if name == "SD3_5Adapter":
            factor, patch = adapter.pipeline.vae_scale_factor, config.patch_size
            if args.height % (factor * patch) or args.width % (factor * patch):
                raise ValueError(
                    f"train.resolution = {(args.height, args.width)!r}: each must be a multiple of {factor * patch} "
                    f"(the VAE's factor {factor} times the patch size {patch})"
                )
            shape = [int(config.in_channels), args.height // factor, args.width // factor]
            tokens, shared = (shape[1] // patch) * (shape[2] // patch), {}
        elif name == "Flux1Adapter":
            factor = adapter.pipeline.vae_scale_factor
            if args.height % (2 * factor) or args.width % (2 * factor):
                raise ValueError(
                    f"train.resolution = {(args.height, args.width)!r}: each must be a multiple of {2 * factor} "
                    f"(the VAE's factor {factor} times FLUX's 2 x 2 packing)"
                )
            with torch.random.fork_rng(devices=[]):
                latents, image_ids = adapter.pipeline.prepare_latents(
                    batch_size=1,
                    num_channels_latents=int(config.in_channels) // 4,
                    height=args.height,
                    width=args.width,
                    dtype=torch.float32,
                    device=device,
                    generator=None,
                )
            shape, tokens, shared = [int(d) for d in latents.shape[1:]], int(latents.shape[1]), {"img_ids": image_ids}
        else:
            raise ValueError(
                f"model.model_type = {self.model_args.model_type!r} ({name}): the branchgrpo trainer knows the latent "
                "layouts of sd3-5 and flux1; subclass BranchGRPOTrainer and override tree_geometry for another adapter"
            )
        timesteps = self._ff.set_scheduler_timesteps(
            scheduler=adapter.scheduler, num_inference_steps=args.num_inference_steps, seq_len=tokens, device=device
        )
        sigmas = [float(s) for s in adapter.scheduler.sigmas]
        return TreeGeometry(shape, timesteps, sigmas, shared)

    # --- Stage 1: the tree rollout ---

    def sample(self) -> list[Any]:
        """One tree per prompt of this epoch's batches; returns the leaves' samples (see the class)."""
        adapter, args = self.adapter, self.training_args
        adapter.rollout()
        self.reward_buffer.clear()
        data_iter = iter(self.dataloader)
        prompts = _concat_batches([next(data_iter) for _ in range(args.num_batches_per_epoch)])
        count = _prompt_count(prompts)
        device = self.accelerator.device
        if prompts.get("prompt_embeds") is None and "prompt" in prompts:
            encode = self._ff.filter_kwargs(
                adapter.encode_prompt, **{**args, **prompts, "prompt": list(prompts["prompt"]), "device": device}
            )
            prompts.update(adapter.encode_prompt(**encode))
        prompts = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in prompts.items()}
        geometry = self.tree_geometry()
        prompts.update(geometry.shared)
        self.tree_prompts = prompts
        self._shared = dict(geometry.shared)
        steps = args.num_inference_steps
        timesteps = geometry.timesteps.to(device)
        self._timesteps = timesteps
        cache = _VelocityCache()
        noise_level = float(adapter.scheduler.noise_level)

        def velocity(latents: torch.Tensor, sigma: float, step: int, prompt: torch.Tensor, trees: torch.Tensor):
            out = self._forward(prompts, trees, latents, step, noise_level, next_latents=None)
            cache.add(step, latents, out.noise_pred)
            return out.noise_pred.to(latents.dtype)

        ids = [self._prompt_id(prompts, p) for p in range(count)]
        dtype = adapter.latent_storage_dtype or adapter.pipeline.transformer.dtype
        seed = int(args.seed) + int(self.accelerator.process_index)
        with torch.no_grad(), self.autocast():
            result = branchgrpo.rollout(
                velocity,
                prompts=ids,
                latent_shape=geometry.latent_shape,
                method=self.method,
                steps=steps,
                sigmas=geometry.sigmas,
                seed=seed,
                iteration=int(self.epoch),
                max_batch=int(args.tree_max_batch),
                device=device,
                dtype=dtype,
            )
        self.tree_rollout = result
        self._velocities = cache.aligned(result.latents)
        leaves = self._leaf_samples(result, prompts)
        self.reward_buffer.group_size = result.tree.leaves.shape[0] // max(1, result.tree.tree_count)
        self._maybe_offload_samples_to_cpu(leaves)
        self.reward_buffer.add_samples(leaves)
        self.leaf_samples = leaves
        return leaves

    def _prompt_id(self, prompts: dict[str, Any], row: int) -> int:
        """A stable integer per prompt string (the engine's prompt key: its per-prompt normalizer state)."""
        text = prompts["prompt"][row] if "prompt" in prompts else str(row)
        return self._prompt_ids.setdefault(str(text), len(self._prompt_ids))

    def _forward(
        self,
        prompts: dict[str, Any],
        rows: torch.Tensor,
        latents: torch.Tensor,
        step: int | torch.Tensor,
        noise_level: float,
        next_latents: torch.Tensor | None,
    ) -> Any:
        """The adapter's ``forward`` on ``latents`` at step ``step`` (per row where a tensor), each row conditioned on
        its prompt's row of ``prompts``; with ``next_latents``, its log-prob too."""
        timesteps = self._timesteps
        assert timesteps is not None
        n = latents.shape[0]
        index = torch.as_tensor(step, dtype=torch.int64, device=timesteps.device).expand(n)
        padded = torch.cat([timesteps, timesteps.new_zeros(1)])
        conditions = _rows(prompts, rows.to(torch.int64), _prompt_count(prompts), set(self._shared))
        inputs = {
            **self.training_args,
            **conditions,
            "t": timesteps[index],
            "t_next": padded[index + 1],
            "latents": latents,
            # Without a log-prob the step's sample is not used: the rows themselves stand in for it (no draw).
            "next_latents": latents if next_latents is None else next_latents,
            "compute_log_prob": next_latents is not None,
            "noise_level": noise_level,
            "return_kwargs": ["noise_pred", "log_prob"] if next_latents is not None else ["noise_pred"],
        }
        return self.adapter.forward(**self._ff.filter_kwargs(self.adapter.forward, **inputs))

    def _leaf_samples(self, result: Any, prompts: dict[str, Any]) -> list[Any]:
        """One Flow-Factory sample per leaf, in ``tree.leaves`` order: the decoded image, the prompt's strings and
        ids, the tree and node."""
        tree, args = result.tree, self.training_args
        leaves = result.latents[-1]
        decode = self.adapter.decode_latents
        images = []
        with torch.no_grad():
            for begin in range(0, leaves.shape[0], int(args.tree_max_batch)):
                chunk = leaves[begin : begin + int(args.tree_max_batch)]
                images.append(
                    decode(
                        **self._ff.filter_kwargs(
                            decode, latents=chunk, output_type="pt", height=args.height, width=args.width
                        )
                    )
                )
        images = torch.cat(images)
        count = _prompt_count(prompts)
        samples = []
        for i, node in enumerate(tree.leaves.tolist()):
            position = node // tree.nodes_per_tree
            fields = {
                key: prompts[key][position]
                for key in ("prompt", "prompt_ids", "negative_prompt", "negative_prompt_ids")
                if _per_prompt(prompts.get(key), count)
            }
            samples.append(
                self._sample_class.from_dict(
                    {
                        **fields,
                        "height": args.height,
                        "width": args.width,
                        "image": images[i],
                        "branchgrpo_tree": position,
                        "branchgrpo_node": node,
                    }
                )
            )
        return samples

    # --- Stages 2 and 3: rewards and the tree's credit ---

    def prepare_feedback(self, samples: list[Any]) -> None:
        """Flow-Factory's rewards of the leaves and ``compute_advantages`` with the tree's credit; builds the edge
        samples (see the class)."""
        rewards = self.reward_buffer.finalize(store_to_samples=True, split="all")
        self.compute_advantages(samples, rewards, store_to_samples=True, aggregation_func=self._tree_credit)
        metrics = self.advantage_processor.pop_advantage_metrics()
        total = np.asarray(self.tree_rewards, dtype=np.float64)
        metrics.update(
            {
                "train/reward_mean": float(np.nanmean(total)) if total.size else 0.0,
                "train/tree_leaves": int(total.size),
                "train/tree_edges": len(self.edge_samples),
                "train/tree_evaluations": int(self.tree_rollout.evaluations),
            }
        )
        self.log_data(metrics, step=self.step)

    def _tree_credit(self, processor: Any, samples: list[Any], rewards: dict[str, Any], store: bool) -> torch.Tensor:
        """AdvantageProcessor's custom aggregation: the engine's credit of the leaves' rewards."""
        result = self.tree_rollout
        if len(samples) != result.tree.leaves.shape[0]:
            raise ValueError(
                f"branchgrpo trainer: {len(samples)} samples for {result.tree.leaves.shape[0]} leaves: "
                "prepare_feedback takes the samples sample() returned"
            )
        parts = {}
        for name, values in rewards.items():
            scores = torch.as_tensor(values).detach().to("cpu", torch.float64).reshape(-1).numpy()
            parts[name] = (float(processor.reward_weights[name]), scores)
        total = sum((weight * scores for weight, scores in parts.values()), np.zeros(len(samples)))
        self.tree_rewards = branchgrpo.Scores(total, parts)
        total_iterations = max(int(self.training_args.max_epochs or 0), int(self.epoch) + 1)
        self.tree_credit = branchgrpo.credit(
            result, self.tree_rewards, iteration=int(self.epoch), total_iterations=total_iterations
        )
        self.edge_samples = self._edge_samples(result, self.tree_credit)
        edge_advantage = self.tree_credit.edge_advantage
        advantages = torch.as_tensor(edge_advantage[result.tree.leaves], dtype=torch.float64)
        if store:
            for sample, advantage in zip(samples, advantages, strict=True):
                sample.extra_kwargs["advantage"] = advantage
        return advantages.to(self.accelerator.device)

    def _edge_samples(self, result: Any, credit: Any) -> list[Any]:
        """One Flow-Factory sample per trained edge, in the credit's order (see the class)."""
        if len(credit.trained) == 0:
            return []
        edges = branchgrpo.edges(result, credit)
        parent_row = np.asarray(_core.trained_edges(result, credit, "none").parent_row, dtype=np.int64)
        tree = result.tree
        timesteps = self._timesteps
        assert timesteps is not None
        padded = torch.cat([timesteps, timesteps.new_zeros(1)])
        noise_level = float(self.adapter.scheduler.noise_level)
        log_prob = self._edge_log_probs(edges, parent_row, noise_level)
        prompts = self.tree_prompts
        count = _prompt_count(prompts)
        per_prompt = {k: v for k, v in prompts.items() if _per_prompt(v, count) and k not in self._shared}
        args = self.training_args
        latent_map = torch.tensor([0, 1], dtype=torch.int64)
        log_prob_map = torch.tensor([0], dtype=torch.int64)
        samples = []
        for i in range(len(edges)):
            node, step, position = int(edges.node[i]), int(edges.step[i]), int(edges.tree[i])
            fields = {**self._shared, **{key: value[position] for key, value in per_prompt.items()}}
            samples.append(
                self._sample_class.from_dict(
                    {
                        **fields,
                        "timesteps": padded[step : step + 2].clone(),
                        "all_latents": torch.stack([edges.latent[i], edges.next_latent[i]]),
                        "latent_index_map": latent_map,
                        "log_probs": log_prob[i : i + 1].clone(),
                        "log_prob_index_map": log_prob_map,
                        "height": args.height,
                        "width": args.width,
                        "advantage": edges.advantage[i].clone(),
                        "branchgrpo_tree": position,
                        "branchgrpo_node": node,
                        "branchgrpo_parent": int(tree.parent[node]),
                        "branchgrpo_step": step,
                        "branchgrpo_log_prob": float(edges.old_log_prob[i]),
                    }
                )
            )
        return samples

    def _edge_log_probs(self, edges: Any, parent_row: np.ndarray, noise_level: float) -> torch.Tensor:
        """Each edge's log-prob by Flow-Factory: its scheduler's ``step`` with the rollout's velocity of the parent
        and the child as ``next_latents`` (what its ``forward`` computes in ``optimize``); an edge whose velocity the
        rollout's calls did not line up with is given the adapter's ``forward`` again."""
        timesteps = self._timesteps
        assert timesteps is not None
        padded = torch.cat([timesteps, timesteps.new_zeros(1)])
        out = torch.empty(len(edges), dtype=torch.float32)
        chunk = int(self.training_args.tree_max_batch)
        steps = edges.step.numpy()
        scheduler = self.adapter.scheduler
        with torch.no_grad(), self.autocast():
            for step in np.unique(steps):
                rows = np.flatnonzero(steps == step)
                for begin in range(0, rows.size, chunk):
                    part = rows[begin : begin + chunk]
                    index = torch.from_numpy(part)
                    x, nxt = edges.latent[index], edges.next_latent[index]
                    if int(step) in self._velocities:
                        velocity = self._velocities[int(step)]
                        noise = velocity[torch.from_numpy(parent_row[part]).to(velocity.device)]
                        t = timesteps[int(step)].expand(len(part))
                        output = scheduler.step(
                            noise_pred=noise,
                            timestep=t,
                            latents=x,
                            timestep_next=padded[int(step) + 1].expand(len(part)),
                            next_latents=nxt,
                            compute_log_prob=True,
                            return_dict=True,
                            return_kwargs=["log_prob"],
                            noise_level=noise_level,
                        )
                    else:
                        output = self._forward(
                            self.tree_prompts, edges.tree[index], x, int(step), noise_level, next_latents=nxt
                        )
                    out[index] = output.log_prob.detach().float().cpu()
        return out

    # --- Stage 4: Flow-Factory's update on the edges ---

    def optimize(self, samples: list[Any]) -> None:
        """Flow-Factory's GRPO ``optimize`` on the edge samples of the leaves ``samples`` (see the class)."""
        edges = self.edge_samples
        with self._edge_schedule(len(edges)):
            super().optimize(edges)

    @contextlib.contextmanager
    def _edge_schedule(self, count: int) -> Iterator[None]:
        """The scheduler's ``train_timesteps`` [0] and the edges' gradient accumulation for the update; restored
        after it."""
        scheduler, args = self.adapter.scheduler, self.training_args
        saved = (scheduler._sde_steps, scheduler._num_sde_steps)
        accumulation = self.accelerator.gradient_accumulation_steps
        scheduler._sde_steps, scheduler._num_sde_steps = torch.tensor([0], dtype=torch.int64), 1
        try:
            if scheduler.train_timesteps.tolist() != [0]:
                raise RuntimeError(
                    f"branchgrpo trainer: {type(scheduler).__name__}.train_timesteps is "
                    f"{scheduler.train_timesteps.tolist()} with sde_steps [0]: the edge samples need [0]"
                )
            if not args._manual_gradient_accumulation_steps and count:
                self.accelerator.gradient_accumulation_steps = _accumulation(
                    math.ceil(count / int(args.per_device_batch_size)), int(args.gradient_step_per_epoch)
                )
            yield
        finally:
            scheduler._sde_steps, scheduler._num_sde_steps = saved
            self.accelerator.gradient_accumulation_steps = accumulation


def _accumulation(micro_batches: int, steps: int) -> int:
    """Micro-batches per optimizer step: micro_batches / k for the largest divisor k of micro_batches that is at most
    ``steps`` (so each epoch ends on an optimizer step).

    >>> _accumulation(12, 2), _accumulation(7, 2), _accumulation(3, 8)
    (6, 7, 1)
    """
    best = 1
    for k in range(1, max(1, min(steps, micro_batches)) + 1):
        if micro_batches % k == 0:
            best = k
    return micro_batches // best


def _sample_class(adapter: Any, base: type, default: type) -> type:
    """The sample class of the adapter's ``inference`` (a ``base`` subclass in its return annotation, e.g.
    ``List[SD3_5Sample]``: its shared fields are the adapter's), else ``default``."""
    import typing

    try:
        hints = typing.get_type_hints(type(adapter).inference)
    except Exception:  # an annotation that does not evaluate: the generic sample
        return default
    for candidate in typing.get_args(hints.get("return")):
        if isinstance(candidate, type) and issubclass(candidate, base):
            return candidate
    return default


def _concat_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Flow-Factory's collated batches as one: tensors concatenated, lists joined, anything else the first's.

    >>> out = _concat_batches([{"prompt": ["a"], "e": torch.ones(1, 2)}, {"prompt": ["b"], "e": torch.zeros(1, 2)}])
    >>> out["prompt"], tuple(out["e"].shape)
    (['a', 'b'], (2, 2))
    """
    out: dict[str, Any] = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        if all(isinstance(v, torch.Tensor) for v in values):
            out[key] = torch.cat(values) if all(v.dim() > 0 for v in values) else values[0]
        elif all(isinstance(v, list) for v in values):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = values[0]
    return out


def _prompt_count(prompts: dict[str, Any]) -> int:
    """The number of prompts in a batch: its ``prompt`` list's length, else the first tensor's rows."""
    if isinstance(prompts.get("prompt"), list):
        return len(prompts["prompt"])
    for value in prompts.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ValueError(f"branchgrpo trainer: a batch with no prompts (keys: {sorted(prompts)})")


def _per_prompt(value: Any, count: int) -> bool:
    """Whether ``value`` holds one entry per prompt (a tensor of ``count`` rows or a list of ``count`` items)."""
    if isinstance(value, torch.Tensor):
        return value.dim() > 0 and value.shape[0] == count
    return isinstance(value, list) and len(value) == count


def _rows(prompts: dict[str, Any], rows: torch.Tensor, count: int, shared: set[str]) -> dict[str, Any]:
    """Each per-prompt value of ``prompts`` at ``rows`` (tensors indexed on their device, lists picked); the others
    (and those named in ``shared``) as they are."""
    out = {}
    for key, value in prompts.items():
        if key in shared:
            out[key] = value
        elif isinstance(value, torch.Tensor) and _per_prompt(value, count):
            out[key] = value.index_select(0, rows.to(value.device))
        elif isinstance(value, list) and _per_prompt(value, count):
            out[key] = [value[i] for i in rows.tolist()]
        else:
            out[key] = value
    return out


# Registered on import where Flow-Factory can be found (its CLI resolves TRAINER_TYPE by importing this module);
# where it cannot, or its own imports fail, the first use of a Flow-Factory name raises the one-line ImportError.
if available():
    with contextlib.suppress(ImportError):
        register()
