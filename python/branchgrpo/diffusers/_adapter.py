"""What every model family's adapter shares (``Adapter``): the prompt rows it holds, the velocity's casts and grad
mode, and the sigmas of the pipeline's own scheduler. A family's module (flux.py, sd3.py) writes the rest:
its transformer call, its latent layout and its shift rule."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch


class Adapter:
    """A loaded diffusers pipeline of one model family as the engine's model: ``velocity`` (the callable
    ``branchgrpo.rollout`` and ``Policy`` take), ``latent_shape`` and ``sigmas`` for a resolution, and the
    pipeline's latent layout (``to_pipeline``, ``from_pipeline``). Prompt index p selects row p of the prompt
    embeddings the adapter holds. Build one with ``branchgrpo.diffusers.adapter_for``.

    A family's subclass sets ``family`` (its registry name), ``pipelines`` (the diffusers pipeline class names it
    adapts) and writes ``_velocity(x, sigma, rows)`` (x on the transformer's device and dtype, rows an int64 index
    of prompt rows), ``latent_shape``, ``sigmas`` and, where its layout differs from the engine's, ``to_pipeline``
    and ``from_pipeline``.
    """

    family: ClassVar[str] = ""
    pipelines: ClassVar[tuple[str, ...]] = ()

    def __init__(self, pipeline: Any, *, gradients: bool = False) -> None:
        self.pipeline = pipeline
        self.transformer = pipeline.transformer
        self.gradients = bool(gradients)
        self.prompt_count = 0  # rows of the prompt embeddings (set by the family's constructor)

    def __repr__(self) -> str:
        return f"<{self.family} adapter of {type(self.pipeline).__name__}: {self.prompt_count} prompts>"

    def velocity(
        self, latents: torch.Tensor, sigma: float, step: int, prompts: torch.Tensor, trees: Any
    ) -> torch.Tensor:
        """The model's velocity for the engine: rows of latents (the engine's layout, ``latent_shape``) at noise
        level ``sigma``, each conditioned on its prompt's embeddings (``prompts``: a prompt index per row), computed on
        the transformer's device and dtype and returned like ``latents``; without gradients unless the adapter was
        built with ``gradients=True`` (then under the caller's grad mode: a ``Policy``'s velocity). ``step`` and
        ``trees`` are the engine's and unused.

        >>> from branchgrpo.diffusers import sd3
        >>> adapter = sd3.SD3Adapter(sd3.tiny_pipeline(), prompt_embeds=torch.ones(2, 6, 32),
        ...                          pooled_prompt_embeds=torch.ones(2, 64), guidance_scale=1.0)
        >>> v = adapter.velocity(torch.ones(3, 4, 8, 8, dtype=torch.float64), 0.5, 0, torch.tensor([0, 1, 1]), None)
        >>> v.dtype, v.requires_grad, bool(torch.equal(v[1], v[2]))
        (torch.float64, False, True)
        >>> adapter.velocity(torch.ones(1, 4, 8, 8), 0.5, 0, torch.tensor([2]), None)
        Traceback (most recent call last):
        ValueError: sd3 velocity: prompts [2]: the adapter holds 2 prompts (indices 0 to 1)
        """
        index = torch.as_tensor(prompts, dtype=torch.int64).cpu()
        if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < self.prompt_count:
            raise ValueError(
                f"{self.family} velocity: prompts {index.tolist()}: the adapter holds {self.prompt_count} prompts "
                f"(indices 0 to {self.prompt_count - 1})"
            )
        parameter = next(self.transformer.parameters())
        with contextlib.nullcontext() if self.gradients else torch.no_grad():
            out = self._velocity(latents.to(parameter.device, parameter.dtype), float(sigma), index)
        return out.to(latents.device, latents.dtype)

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def latent_shape(self, height: int, width: int) -> list[int]:
        """One row's latent shape in the engine for an image of ``height`` x ``width`` pixels; a resolution the
        family cannot pack is a ``ValueError`` naming it (each family's ``latent_shape`` has its rule).

        >>> from branchgrpo.diffusers import sd3
        >>> sd3.SD3Adapter(sd3.tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32),
        ...                pooled_prompt_embeds=torch.ones(1, 64), guidance_scale=1.0).latent_shape(32, 64)
        [4, 4, 8]
        """
        raise NotImplementedError

    def sigmas(self, steps: int, height: int, width: int) -> list[float]:
        """The pipeline's sigmas for ``steps`` steps at this resolution, by its own scheduler and shift rule, its
        terminal 0 included (steps + 1 values: ``rollout``'s and ``Trainer``'s ``sigmas``).

        >>> from branchgrpo.diffusers import flux
        >>> adapter = flux.FluxAdapter(flux.tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32),
        ...                            pooled_prompt_embeds=torch.ones(1, 32))
        >>> [round(s, 3) for s in adapter.sigmas(2, 64, 64)], round(adapter.sigmas(2, 1024, 1024)[1], 3)
        ([1.0, 0.613, 0.0], 0.76)
        """
        raise NotImplementedError

    def to_pipeline(self, latents: torch.Tensor) -> torch.Tensor:
        """Engine rows (``latent_shape``) as the pipeline's ``latents`` (its ``latents=`` argument, its
        ``output_type="latent"`` result); the same tensor where the layouts agree.

        >>> from branchgrpo.diffusers import sd3
        >>> adapter = sd3.SD3Adapter(sd3.tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32),
        ...                          pooled_prompt_embeds=torch.ones(1, 64), guidance_scale=1.0)
        >>> x = torch.ones(2, 4, 8, 8)
        >>> adapter.to_pipeline(x) is x
        True
        """
        return latents

    def from_pipeline(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The inverse of ``to_pipeline`` for a resolution of ``height`` x ``width`` pixels.

        >>> from branchgrpo.diffusers import sd3
        >>> adapter = sd3.SD3Adapter(sd3.tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32),
        ...                          pooled_prompt_embeds=torch.ones(1, 64), guidance_scale=1.0)
        >>> x = torch.ones(2, 4, 8, 8)
        >>> adapter.from_pipeline(x, 64, 64) is x
        True
        """
        return latents

    # --- Shared by the families ---

    def _embeddings(self, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Prompt embeddings on the transformer's device and dtype, each with one row per prompt (the first's
        count); sets ``prompt_count``."""
        parameter = next(self.transformer.parameters())
        out = [None if t is None else t.detach().to(parameter.device, parameter.dtype) for t in tensors]
        self.prompt_count = int(out[0].shape[0])
        for t in out[1:]:
            if t is not None and t.shape[0] != self.prompt_count:
                raise ValueError(
                    f"{self.family}: prompt embeddings of {self.prompt_count} and {t.shape[0]} rows: "
                    "each needs one row per prompt"
                )
        return out

    def _check_resolution(self, height: int, width: int, multiple: int, why: str) -> tuple[int, int]:
        """(height, width) if both are positive multiples of ``multiple``, else a ValueError naming them."""
        for name, value in (("height", height), ("width", width)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % multiple:
                raise ValueError(
                    f"{self.family}: {name} = {value!r}: must be a positive multiple of {multiple} ({why})"
                )
        return height, width

    def _scheduler_sigmas(
        self, retrieve_timesteps: Callable[..., Any], steps: int, sigmas: Sequence[float] | None, **kwargs: Any
    ) -> list[float]:
        """The sigmas a fresh copy of the pipeline's scheduler makes when the pipeline sets it up with its own
        ``retrieve_timesteps`` (steps, its default ``sigmas``, ``mu`` ...): steps + 1 values ending at 0."""
        scheduler = type(self.pipeline.scheduler).from_config(self.pipeline.scheduler.config)
        retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, **kwargs)
        values = [float(s) for s in getattr(scheduler, "sigmas", [])]
        if len(values) != steps + 1 or values[-1] != 0.0:
            raise ValueError(
                f"{self.family}: the pipeline's {type(scheduler).__name__} made {len(values)} sigmas for {steps} "
                "steps: the engine needs steps + 1 ending at 0 (a FlowMatchEulerDiscreteScheduler makes them)"
            )
        return values

    def _check_steps(self, steps: int) -> int:
        """``steps`` if it is an integer in [1, 255] (the engine's range), else a ValueError naming it."""
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 255:
            raise ValueError(f"{self.family}: steps = {steps!r}: must be an integer in [1, 255]")
        return steps

    def _refuse_negative(self, negative: Any, why: str) -> None:
        """A ValueError when a negative prompt is given to a model or setting without CFG."""
        if negative is not None:
            raise ValueError(f"{self.family}: a negative prompt was given, but {why}")

    def _check_prompts(self, prompts: Any, embeds: Sequence[torch.Tensor | None], names: str) -> None:
        """A ValueError unless exactly one of ``prompts`` (strings) and the embeddings (all of them) is given."""
        given = [e is not None for e in embeds]
        if (prompts is None) != all(given) or any(given) != all(given):
            raise ValueError(f"{self.family}: give prompts (strings) or {names}, not both")

    def _classifier_free(
        self, guidance_scale: float, negative: Sequence[Any], negative_embeds: Sequence[torch.Tensor | None]
    ) -> bool:
        """Whether CFG runs: guidance_scale > 1, the pipelines' rule (sets ``guidance_scale``). A negative prompt or
        its embeddings without CFG is a ValueError, so is CFG with neither all the negative embeddings nor the
        pipeline's text encoder to encode the negative prompt."""
        self.guidance_scale = float(guidance_scale)
        given = [n for n in (*negative, *negative_embeds) if n is not None]
        if self.guidance_scale <= 1:
            why = f"guidance_scale = {self.guidance_scale} runs no CFG (it needs guidance_scale > 1)"
            self._refuse_negative(given[0] if given else None, why)
            return False
        if any(e is None for e in negative_embeds) and getattr(self.pipeline, "text_encoder", None) is None:
            raise ValueError(
                f"{self.family}: CFG (guidance_scale = {self.guidance_scale}) needs "
                f"{' and '.join(self._negative_names)}, or the pipeline's text encoders to encode the negative prompt"
            )
        return True

    _negative_names: ClassVar[tuple[str, ...]] = ("negative_prompt_embeds",)


def tiny(pipeline_class: type, transformer: Callable[[], Any], scheduler: Any, seed: int) -> Any:
    """A pipeline of ``pipeline_class`` with the transformer ``transformer()`` builds under ``torch.manual_seed(seed)``
    (the global generator's state kept), ``scheduler``, every other component None (no VAE, text encoder or tokenizer)
    and no progress bar: each family's ``tiny_pipeline``.

    >>> from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    >>> pipe = tiny(FluxPipeline, lambda: FluxTransformer2DModel(in_channels=4, num_layers=1, num_single_layers=0,
    ...     attention_head_dim=8, num_attention_heads=1, joint_attention_dim=8, pooled_projection_dim=8,
    ...     axes_dims_rope=(2, 2, 4)), FlowMatchEulerDiscreteScheduler(), seed=0)
    >>> pipe.vae is None, pipe.transformer.training
    (True, False)
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformer().eval()
    parameters = inspect.signature(pipeline_class.__init__).parameters.items()
    required = [n for n, p in parameters if p.default is inspect.Parameter.empty and n not in ("self", "transformer")]
    pipeline = pipeline_class(**{**dict.fromkeys(required), "transformer": model, "scheduler": scheduler})
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
