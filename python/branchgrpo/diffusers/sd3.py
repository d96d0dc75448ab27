"""Stable Diffusion 3 and 3.5 (diffusers' ``StableDiffusion3Pipeline``): latents [C, H, W] as the pipeline's own,
time 1000 sigma, classifier-free guidance by batch concatenation (negative rows first, as the pipeline stacks
them), and the scheduler's static shift (or the dynamic mu of the token count where its config asks for it).

>>> adapter = SD3Adapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32), pooled_prompt_embeds=torch.ones(1, 64),
...                      negative_prompt_embeds=torch.zeros(1, 6, 32), negative_pooled_prompt_embeds=torch.zeros(1, 64))
>>> adapter.latent_shape(64, 64), adapter.guidance_scale
([4, 8, 8], 7.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from branchgrpo.diffusers._adapter import Adapter, tiny

__all__ = ["SD3Adapter", "tiny_pipeline"]


class SD3Adapter(Adapter):
    """A ``StableDiffusion3Pipeline`` (SD3, SD3.5) for the engine. Prompts are encoded once with the pipeline's
    ``encode_prompt`` (``prompts``: strings, with its text encoders; the negative prompt defaults to "" as the
    pipeline's does), or given as ``prompt_embeds`` [N, L, D] and ``pooled_prompt_embeds`` [N, V] with, for CFG,
    ``negative_prompt_embeds`` and ``negative_pooled_prompt_embeds`` of the same shapes; prompt index p is row p.
    CFG runs where ``guidance_scale`` > 1 (the pipeline's rule; default 7.0): one transformer call on the rows twice,
    negative then positive, v = v_neg + g (v_pos - v_neg). A negative prompt with guidance_scale <= 1 is refused.

    >>> pipe = tiny_pipeline()
    >>> embeds = dict(prompt_embeds=torch.ones(2, 6, 32), pooled_prompt_embeds=torch.ones(2, 64))
    >>> plain = SD3Adapter(pipe, guidance_scale=1.0, **embeds)
    >>> v = plain.velocity(torch.ones(3, 4, 8, 8), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), plain.cfg
    ((3, 4, 8, 8), False)
    >>> SD3Adapter(pipe, guidance_scale=1.0, negative_prompt_embeds=torch.zeros(2, 6, 32), **embeds)
    Traceback (most recent call last):
    ValueError: sd3: a negative prompt was given, but guidance_scale = 1.0 runs no CFG (it needs guidance_scale > 1)
    """

    family = "sd3"
    pipelines = ("StableDiffusion3Pipeline",)
    _negative_names = ("negative_prompt_embeds", "negative_pooled_prompt_embeds")

    def __init__(
        self,
        pipeline: Any,
        prompts: Sequence[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        pooled_prompt_embeds: torch.Tensor | None = None,
        negative_prompt: str | Sequence[str] | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        negative_pooled_prompt_embeds: torch.Tensor | None = None,
        guidance_scale: float = 7.0,
        max_sequence_length: int = 256,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        self._check_prompts(prompts, (prompt_embeds, pooled_prompt_embeds), "prompt_embeds and pooled_prompt_embeds")
        negative_embeds = (negative_prompt_embeds, negative_pooled_prompt_embeds)
        self.cfg = self._classifier_free(guidance_scale, (negative_prompt,), negative_embeds)
        context, negative_context, pooled, negative_pooled = pipeline.encode_prompt(
            prompt=None if prompts is None else list(prompts),
            prompt_2=None,
            prompt_3=None,
            device=next(self.transformer.parameters()).device,
            do_classifier_free_guidance=self.cfg,
            negative_prompt=negative_prompt,
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative_prompt_embeds,
            pooled_prompt_embeds=pooled_prompt_embeds,
            negative_pooled_prompt_embeds=negative_pooled_prompt_embeds,
            max_sequence_length=max_sequence_length,
        )
        self.context, self.pooled, self.negative_context, self.negative_pooled = self._embeddings(
            context, pooled, negative_context if self.cfg else None, negative_pooled if self.cfg else None
        )

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        context, pooled = self.context[rows], self.pooled[rows]
        if self.cfg:
            x = torch.cat([x, x])
            context = torch.cat([self.negative_context[rows], context])
            pooled = torch.cat([self.negative_pooled[rows], pooled])
        v = self.transformer(
            hidden_states=x,
            timestep=torch.full((x.shape[0],), 1000.0 * sigma, dtype=x.dtype, device=x.device),
            encoder_hidden_states=context,
            pooled_projections=pooled,
            return_dict=False,
        )[0]
        if not self.cfg:
            return v
        negative, positive = v.chunk(2)
        return negative + self.guidance_scale * (positive - negative)

    def latent_shape(self, height: int, width: int) -> list[int]:
        """[C, H / f, W / f] for an image of ``height`` x ``width`` pixels, f the VAE's scale factor (8); the
        transformer's patches need both to be multiples of f times its patch size.

        >>> adapter = SD3Adapter(tiny_pipeline(), guidance_scale=1.0, prompt_embeds=torch.ones(1, 6, 32),
        ...                      pooled_prompt_embeds=torch.ones(1, 64))
        >>> adapter.latent_shape(64, 32)
        [4, 8, 4]
        >>> adapter.latent_shape(64, 40)
        Traceback (most recent call last):
        ValueError: sd3: width = 40: must be a positive multiple of 16 (the VAE's factor 8 times the patch size 2)
        """
        factor, patch = self.pipeline.vae_scale_factor, self.transformer.config.patch_size
        why = f"the VAE's factor {factor} times the patch size {patch}"
        height, width = self._check_resolution(height, width, factor * patch, why)
        return [self.transformer.config.in_channels, height // factor, width // factor]

    def sigmas(self, steps: int, height: int, width: int) -> list[float]:
        """The pipeline's schedule: its scheduler's ``set_timesteps(steps)`` (linear in t from its shifted sigma_max
        to sigma_min, then its static shift; with ``use_dynamic_shifting``, mu = ``calculate_shift`` of the token
        count), then 0.

        >>> adapter = SD3Adapter(tiny_pipeline(), guidance_scale=1.0, prompt_embeds=torch.ones(1, 6, 32),
        ...                      pooled_prompt_embeds=torch.ones(1, 64))
        >>> [round(s, 4) for s in adapter.sigmas(4, 64, 64)]
        [1.0, 0.8577, 0.6022, 0.0089, 0.0]
        """
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
            retrieve_timesteps,
        )

        steps = self._check_steps(steps)
        _, rows, cols = self.latent_shape(height, width)
        config, patch = self.pipeline.scheduler.config, self.transformer.config.patch_size
        options = {}
        if config.get("use_dynamic_shifting", None):
            options["mu"] = calculate_shift(
                (rows // patch) * (cols // patch),
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.16),
            )
        return self._scheduler_sigmas(retrieve_timesteps, steps, None, **options)


def tiny_pipeline(seed: int = 0) -> Any:
    """A ``StableDiffusion3Pipeline`` with a random-weight SD3.5-style transformer small enough for a CPU test (two
    layers, the first with dual attention, RMS q/k norms, width 32, 4 latent channels, patch 2), seeded by ``seed``,
    SD3's scheduler config (static shift 3) and no VAE or text encoders (pass prompt embeddings: context width 32,
    pooled 64). Nothing is downloaded.

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.qk_norm, pipe.scheduler.config.shift
    ('StableDiffusion3Pipeline', 'rms_norm', 3.0)
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    def transformer() -> Any:
        return SD3Transformer2DModel(
            sample_size=32, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4,
            pos_embed_max_size=32, dual_attention_layers=(0,), qk_norm="rms_norm",
        )  # fmt: skip

    return tiny(StableDiffusion3Pipeline, transformer, FlowMatchEulerDiscreteScheduler(shift=3.0), seed)
