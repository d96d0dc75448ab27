"""Wan2.1 and Wan2.2 text-to-video (diffusers' ``WanPipeline``): latents [C, F, H, W] as the pipeline's own, time
1000 sigma, classifier-free guidance with a negative prompt (two transformer calls, positive then negative, as the
pipeline makes them), and the schedule its scheduler's ``set_timesteps(steps)`` makes (Wan's static shift).

One family for the three models, as one pipeline class runs them, told apart by the pipeline's config:

- Wan2.1: one transformer, one timestep per row.
- Wan2.2 A14B (``transformer_2`` and ``boundary_ratio``): two experts; ``transformer`` (high noise, ``guidance_scale``)
  where the timestep 1000 sigma >= boundary_ratio x 1000, ``transformer_2`` (low noise, ``guidance_scale_2``) below.
- Wan2.2 TI2V-5B (``expand_timesteps``): one timestep per token ([rows, tokens], the same for every token in
  text-to-video), and its VAE's 48 latent channels and spatial factor 16 (the pipeline's
  ``vae_scale_factor_spatial``).

>>> embeds = dict(prompt_embeds=torch.ones(1, 6, 32), negative_prompt_embeds=torch.zeros(1, 6, 32))
>>> adapter = WanAdapter(tiny_pipeline(), **embeds)
>>> adapter.latent_shape(32, 48, num_frames=5), adapter.guidance_scale
([4, 2, 4, 6], 5.0)
>>> experts = WanAdapter(tiny_pipeline(variant="a14b"), guidance_scale_2=3.0, **embeds)
>>> len(experts.transformers), [experts.expert(s) for s in experts.sigmas(4, 32, 32)[:-1]]
(2, [0, 0, 1, 1])
>>> WanAdapter(tiny_pipeline(variant="ti2v"), **embeds).latent_shape(64, 96, num_frames=5)
[48, 2, 4, 6]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from branchgrpo.diffusers._adapter import Adapter

__all__ = ["VARIANTS", "WanAdapter", "tiny_pipeline"]

# tiny_pipeline's variants: Wan2.1, Wan2.2 A14B (two experts), Wan2.2 TI2V-5B (per-token timesteps, its VAE).
VARIANTS = ("wan2.1", "a14b", "ti2v")


class WanAdapter(Adapter):
    """A ``WanPipeline`` (Wan2.1, Wan2.2 A14B or TI2V-5B) for the engine. Prompts are encoded once with the pipeline's
    ``encode_prompt`` (``prompts``: strings, with its text encoder; the negative prompt defaults to "" as the
    pipeline's does), or given as ``prompt_embeds`` [N, L, D] and, for CFG, ``negative_prompt_embeds`` of the same
    shape; prompt index p is row p. CFG runs where ``guidance_scale`` > 1 (default 5.0, the pipeline's), for both
    experts of a Wan2.2 A14B pipeline: v = v_neg + g (v_pos - v_neg), g = ``guidance_scale`` for ``transformer`` and
    ``guidance_scale_2`` (default: ``guidance_scale``, the pipeline's) for ``transformer_2``. A negative prompt with
    guidance_scale <= 1 is refused, as is ``guidance_scale_2`` without a ``boundary_ratio`` or > 1 where CFG is off.

    ``transformers`` holds the experts the velocity calls (one, or two for A14B); ``expert(sigma)`` says which one a
    noise level selects. With ``gradients=True`` the velocity at sigma carries the gradient of that expert's
    parameters only; which experts (or their LoRA) are trained is the optimizer's choice.

    >>> pipe = tiny_pipeline()
    >>> adapter = WanAdapter(pipe, prompt_embeds=torch.ones(2, 6, 32), guidance_scale=1.0)
    >>> v = adapter.velocity(torch.ones(3, 4, 2, 4, 4), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), adapter.cfg, len(adapter.transformers)
    ((3, 4, 2, 4, 4), False, 1)
    >>> WanAdapter(pipe, prompt_embeds=torch.ones(2, 6, 32))
    Traceback (most recent call last):
    ValueError: wan: CFG (guidance_scale = 5.0) needs negative_prompt_embeds, or the pipeline's text encoders to ...
    >>> WanAdapter(tiny_pipeline(variant="a14b", boundary_ratio=1.5), prompt_embeds=torch.ones(2, 6, 32))
    Traceback (most recent call last):
    ValueError: wan: boundary_ratio = 1.5: must be in (0, 1) (the fraction of the timesteps the high-noise ...)
    """

    family = "wan"
    pipelines = ("WanPipeline",)

    def __init__(
        self,
        pipeline: Any,
        prompts: Sequence[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt: str | Sequence[str] | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        guidance_scale: float = 5.0,
        guidance_scale_2: float | None = None,
        max_sequence_length: int = 512,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        self.transformers, self.boundary = self._experts()
        self._check_prompts(prompts, (prompt_embeds,), "prompt_embeds")
        self.cfg = self._classifier_free(guidance_scale, (negative_prompt,), (negative_prompt_embeds,))
        self.guidance_scale_2 = self._second_scale(guidance_scale_2)
        self.expand_timesteps = bool(pipeline.config.get("expand_timesteps", False))
        context, negative_context = pipeline.encode_prompt(
            prompt=None if prompts is None else list(prompts),
            negative_prompt=negative_prompt,
            do_classifier_free_guidance=self.cfg,
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative_prompt_embeds,
            max_sequence_length=max_sequence_length,
            device=next(self.transformer.parameters()).device,
        )
        self.context, self.negative_context = self._embeddings(context, negative_context if self.cfg else None)

    def _experts(self) -> tuple[tuple[Any, ...], float | None]:
        """(the transformers the velocity calls, the boundary timestep or None): ``transformer`` alone without a
        ``boundary_ratio``, else both experts and boundary_ratio x num_train_timesteps, the pipeline's boundary. A
        missing expert or a ratio outside (0, 1) is a ValueError naming it."""
        ratio = self.pipeline.config.get("boundary_ratio", None)
        if self.transformer is None:
            raise ValueError("wan: the pipeline has no transformer: the adapter needs it (the high-noise expert)")
        if ratio is None:
            return (self.transformer,), None
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
            raise ValueError(
                f"wan: boundary_ratio = {ratio!r}: must be in (0, 1) (the fraction of the timesteps the high-noise "
                "expert takes)"
            )
        if getattr(self.pipeline, "transformer_2", None) is None:
            raise ValueError(f"wan: boundary_ratio = {ratio!r} needs transformer_2 (the low-noise expert): it is None")
        experts = (self.transformer, self.pipeline.transformer_2)
        return experts, ratio * self.pipeline.scheduler.config.num_train_timesteps

    def _second_scale(self, guidance_scale_2: float | None) -> float | None:
        """The low-noise expert's guidance scale: ``guidance_scale_2``, defaulting to ``guidance_scale`` where there is
        a boundary (the pipeline's rule); None without one. Given without a boundary, or > 1 where CFG is off (the
        pipeline would ignore it), a ValueError naming it."""
        if guidance_scale_2 is None:
            return None if self.boundary is None else self.guidance_scale
        if self.boundary is None:
            raise ValueError(
                f"wan: guidance_scale_2 = {guidance_scale_2!r}: only a pipeline with a boundary_ratio (Wan2.2 A14B's "
                "two experts) uses it"
            )
        if float(guidance_scale_2) > 1 and not self.cfg:
            raise ValueError(
                f"wan: guidance_scale_2 = {guidance_scale_2!r} with guidance_scale = {self.guidance_scale}: the "
                "pipeline runs CFG (for both experts) only where guidance_scale > 1"
            )
        return float(guidance_scale_2)

    def _timestep(self, sigma: float) -> torch.Tensor:
        """The pipeline's timestep at noise level ``sigma``: its scheduler's float32 sigma x num_train_timesteps."""
        return torch.tensor(sigma, dtype=torch.float32) * self.pipeline.scheduler.config.num_train_timesteps

    def expert(self, sigma: float) -> int:
        """Which of ``transformers`` the velocity calls at noise level ``sigma``: 0 (``transformer``) where the timestep
        is >= the boundary or there is none, 1 (``transformer_2``) below it, as the pipeline compares them.

        >>> adapter = WanAdapter(tiny_pipeline(variant="a14b", boundary_ratio=0.5), prompt_embeds=torch.ones(1, 6, 32),
        ...                      guidance_scale=1.0)
        >>> adapter.expert(1.0), adapter.expert(0.5), adapter.expert(0.4999)
        (0, 0, 1)
        """
        if self.boundary is None:
            return 0
        return 0 if bool(self._timestep(sigma) >= self.boundary) else 1

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        index = self.expert(sigma)
        model, scale = self.transformers[index], (self.guidance_scale, self.guidance_scale_2)[index]
        t = self._timestep(sigma).to(x.device)
        if self.expand_timesteps:  # the pipeline's (mask[0][0][:, ::2, ::2] * t).flatten(), one per row
            frames, height, width = x.shape[2:]
            timestep = t.expand(frames * ((height + 1) // 2) * ((width + 1) // 2)).unsqueeze(0).expand(x.shape[0], -1)
        else:
            timestep = t.expand(x.shape[0])
        positive = model(
            hidden_states=x, timestep=timestep, encoder_hidden_states=self.context[rows], return_dict=False
        )[0]
        if not self.cfg:
            return positive
        negative = model(
            hidden_states=x, timestep=timestep, encoder_hidden_states=self.negative_context[rows], return_dict=False
        )[0]
        return negative + scale * (positive - negative)

    def latent_shape(self, height: int, width: int, num_frames: int = 81) -> list[int]:
        """[C, F, H / s, W / s] for a clip of ``num_frames`` frames of ``height`` x ``width`` pixels: F = (frames
        - 1) / t + 1 latent frames, s and t the pipeline's VAE factors (``vae_scale_factor_spatial`` and ``_temporal``:
        8 and 4, 16 and 4 for TI2V's VAE). Both sizes must be multiples of 16 (the pipeline's rule) and of s times the
        patch size, and frames - 1 of t.

        >>> adapter = WanAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32), guidance_scale=1.0)
        >>> adapter.latent_shape(32, 64, num_frames=9)
        [4, 3, 4, 8]
        >>> adapter.latent_shape(32, 64, num_frames=8)
        Traceback (most recent call last):
        ValueError: wan: num_frames = 8: must be 1 + a multiple of 4 (the VAE's temporal factor)
        >>> WanAdapter(tiny_pipeline(variant="ti2v"), prompt_embeds=torch.ones(1, 6, 32),
        ...            guidance_scale=1.0).latent_shape(64, 48)
        Traceback (most recent call last):
        ValueError: wan: width = 48: must be a positive multiple of 32 (the pipeline's 16 and the VAE's factor 16 ...)
        """
        spatial, temporal = self.pipeline.vae_scale_factor_spatial, self.pipeline.vae_scale_factor_temporal
        patch = self.transformer.config.patch_size
        multiple = max(16, spatial * patch[1], spatial * patch[2])
        why = f"the pipeline's 16 and the VAE's factor {spatial} times the patch size {patch[1]}"
        height, width = self._check_resolution(height, width, multiple, why)
        if not isinstance(num_frames, int) or num_frames < 1 or (num_frames - 1) % temporal:
            raise ValueError(
                f"wan: num_frames = {num_frames!r}: must be 1 + a multiple of {temporal} (the VAE's temporal factor)"
            )
        channels = self.transformer.config.in_channels
        return [channels, (num_frames - 1) // temporal + 1, height // spatial, width // spatial]

    def sigmas(self, steps: int, height: int, width: int) -> list[float]:
        """The pipeline's schedule: its scheduler's ``set_timesteps(steps)`` (Wan's static shift, the scheduler's
        ``shift``; the resolution does not enter), then 0.

        >>> adapter = WanAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32), guidance_scale=1.0)
        >>> [round(s, 4) for s in adapter.sigmas(4, 32, 32)]
        [1.0, 0.9097, 0.7173, 0.0244, 0.0]
        """
        steps = self._check_steps(steps)
        self.latent_shape(height, width, num_frames=1)

        def set_timesteps(scheduler: Any, steps: int, device: str, sigmas: None) -> None:
            scheduler.set_timesteps(steps, device=device)  # the pipeline's own call

        return self._scheduler_sigmas(set_timesteps, steps, None)


def tiny_pipeline(seed: int = 0, variant: str = "wan2.1", boundary_ratio: float = 0.875) -> Any:
    """A ``WanPipeline`` with random-weight transformers small enough for a CPU test (two layers, width 24, patch
    (1, 2, 2)), seeded by ``seed``, a ``FlowMatchEulerDiscreteScheduler`` with Wan's text-to-video shift 5 and no text
    encoder (pass prompt embeddings: width 32). Nothing is downloaded. ``variant``:

    - "wan2.1": one transformer, 4 latent channels, no VAE;
    - "a14b": Wan2.2 A14B's two experts (``transformer_2``, seeded after the first) split at ``boundary_ratio``
      (A14B text-to-video's 0.875), 4 latent channels, no VAE;
    - "ti2v": Wan2.2 TI2V-5B's ``expand_timesteps``, 48 latent channels and a tiny VAE of its config (z_dim 48,
      residual blocks, spatial factor 16, temporal 4).

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.patch_size, pipe.scheduler.config.shift
    ('WanPipeline', (1, 2, 2), 5.0)
    >>> pipe = tiny_pipeline(variant="ti2v")
    >>> pipe.config.expand_timesteps, pipe.transformer.config.in_channels, pipe.vae_scale_factor_spatial
    (True, 48, 16)
    >>> tiny_pipeline(variant="wan2.2")
    Traceback (most recent call last):
    ValueError: wan: variant = 'wan2.2': must be one of wan2.1, a14b, ti2v
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    if variant not in VARIANTS:
        raise ValueError(f"wan: variant = {variant!r}: must be one of {', '.join(VARIANTS)}")
    channels = 48 if variant == "ti2v" else 4

    def transformer() -> Any:
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=channels,
            out_channels=channels, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        ).eval()  # fmt: skip

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        first = transformer()
        second = transformer() if variant == "a14b" else None
        vae = None
        if variant == "ti2v":
            vae = AutoencoderKLWan(
                base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1], num_res_blocks=1, is_residual=True, in_channels=12,
                out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
                latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
            ).eval()  # fmt: skip
    pipeline = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        transformer=first,
        transformer_2=second,
        boundary_ratio=boundary_ratio if variant == "a14b" else None,
        expand_timesteps=variant == "ti2v",
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
