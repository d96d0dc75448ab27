"""Wan2.1 text-to-video (diffusers' ``WanPipeline`` with one transformer): latents [C, F, H, W] as the pipeline's
own, time 1000 sigma, classifier-free guidance with a negative prompt (two transformer calls, positive then negative,
as the pipeline makes them), and the schedule its scheduler's ``set_timesteps(steps)`` makes (Wan's static shift).

Wan2.2's second transformer (``transformer_2``, ``boundary_ratio``) and per-token timesteps (``expand_timesteps``)
are not adapted: such a pipeline is refused in one line.

>>> embeds = dict(prompt_embeds=torch.ones(1, 6, 32), negative_prompt_embeds=torch.zeros(1, 6, 32))
>>> adapter = WanAdapter(tiny_pipeline(), **embeds)
>>> adapter.latent_shape(32, 48, num_frames=5), adapter.guidance_scale
([4, 2, 4, 6], 5.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from branchgrpo.diffusers._adapter import Adapter, tiny

__all__ = ["WanAdapter", "tiny_pipeline"]


class WanAdapter(Adapter):
    """A Wan2.1 ``WanPipeline`` for the engine. Prompts are encoded once with the pipeline's ``encode_prompt``
    (``prompts``: strings, with its text encoder; the negative prompt defaults to "" as the pipeline's does), or given
    as ``prompt_embeds`` [N, L, D] and, for CFG, ``negative_prompt_embeds`` of the same shape; prompt index p is row
    p. CFG runs where ``guidance_scale`` > 1 (default 5.0, the pipeline's): v = v_neg + g (v_pos - v_neg). A negative
    prompt with guidance_scale <= 1 is refused.

    >>> pipe = tiny_pipeline()
    >>> adapter = WanAdapter(pipe, prompt_embeds=torch.ones(2, 6, 32), guidance_scale=1.0)
    >>> v = adapter.velocity(torch.ones(3, 4, 2, 4, 4), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), adapter.cfg
    ((3, 4, 2, 4, 4), False)
    >>> WanAdapter(pipe, prompt_embeds=torch.ones(2, 6, 32))
    Traceback (most recent call last):
    ValueError: wan: CFG (guidance_scale = 5.0) needs negative_prompt_embeds, or the pipeline's text encoders to ...
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
        max_sequence_length: int = 512,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        config = pipeline.config
        if config.get("boundary_ratio") is not None or config.get("expand_timesteps") or pipeline.transformer_2:
            raise ValueError(
                "wan: a Wan2.2 pipeline (transformer_2, boundary_ratio or expand_timesteps): only Wan2.1's one "
                "transformer with one timestep per row is adapted"
            )
        self._check_prompts(prompts, (prompt_embeds,), "prompt_embeds")
        self.cfg = self._classifier_free(guidance_scale, (negative_prompt,), (negative_prompt_embeds,))
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

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        timestep = torch.full((x.shape[0],), 1000.0 * sigma, dtype=torch.float32, device=x.device)
        positive = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=self.context[rows], return_dict=False
        )[0]
        if not self.cfg:
            return positive
        negative = self.transformer(
            hidden_states=x, timestep=timestep, encoder_hidden_states=self.negative_context[rows], return_dict=False
        )[0]
        return negative + self.guidance_scale * (positive - negative)

    def latent_shape(self, height: int, width: int, num_frames: int = 81) -> list[int]:
        """[C, F, H / s, W / s] for a clip of ``num_frames`` frames of ``height`` x ``width`` pixels: F = (frames
        - 1) / t + 1 latent frames, s and t the VAE's spatial and temporal factors (8, 4). Both sizes must be multiples
        of 16 (the pipeline's rule) and of s times the patch size, and frames - 1 of t.

        >>> adapter = WanAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 6, 32), guidance_scale=1.0)
        >>> adapter.latent_shape(32, 64, num_frames=9)
        [4, 3, 4, 8]
        >>> adapter.latent_shape(32, 64, num_frames=8)
        Traceback (most recent call last):
        ValueError: wan: num_frames = 8: must be 1 + a multiple of 4 (the VAE's temporal factor)
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


def tiny_pipeline(seed: int = 0) -> Any:
    """A Wan2.1 ``WanPipeline`` with a random-weight transformer small enough for a CPU test (two layers, width 24,
    4 latent channels, patch (1, 2, 2)), seeded by ``seed``, a ``FlowMatchEulerDiscreteScheduler`` with Wan's
    text-to-video shift 5 and no VAE or text encoder (pass prompt embeddings: width 32). Nothing is downloaded.

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.patch_size, pipe.scheduler.config.shift
    ('WanPipeline', (1, 2, 2), 5.0)
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    def transformer() -> Any:
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )  # fmt: skip

    return tiny(WanPipeline, transformer, FlowMatchEulerDiscreteScheduler(shift=5.0), seed)
