"""FLUX.1 (diffusers' ``FluxPipeline``): packed latents, image and text ids, embedded guidance, no CFG.

The engine's rows are latents [C, H, W] (the C++ tool's FLUX layout); the transformer sees them packed 2 x 2 into
tokens [H/2 W/2, 4C] with image ids (0, row, col), text ids 0 and time sigma (diffusers embeds 1000 sigma); the
pipeline's own latents are the packed tokens. The schedule is the pipeline's: ``linspace(1, 1/steps, steps)``
shifted by the dynamic mu of the image's token count (``calculate_shift``), then 0.

This module holds FLUX's packing, ids and velocity once: ``branchgrpo.flux`` (FLUX model directories) calls them.
It imports diffusers only where a pipeline is built or scheduled, so it imports without it.

>>> adapter = FluxAdapter(tiny_pipeline(), prompt_embeds=torch.ones(2, 5, 32), pooled_prompt_embeds=torch.ones(2, 32))
>>> adapter.latent_shape(64, 64), len(adapter.sigmas(4, 64, 64))
([4, 8, 8], 5)
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy
import torch

from branchgrpo.diffusers._adapter import Adapter, tiny

__all__ = ["FluxAdapter", "PackedAdapter", "image_ids", "pack", "tiny_pipeline", "transformer_velocity", "unpack"]


def pack(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 W/2, 4C]: token (i, j) is the 2 x 2 patch at rows 2i, 2i+1, columns 2j, 2j+1,
    channel-major (pack_latents of flux/transformer.hpp, diffusers' ``_pack_latents``).

    >>> pack(torch.arange(4.0).view(1, 1, 2, 2)).tolist()
    [[[0.0, 1.0, 2.0, 3.0]]]
    """
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), 4 * c)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of ``pack``: [B, H/2 W/2, 4C] -> [B, C, H, W] (``height``, ``width`` in latent rows, columns).

    >>> unpack(pack(torch.arange(8.0).view(1, 2, 2, 2)), 2, 2).flatten().tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    """
    b, _, f = tokens.shape
    grid = tokens.reshape(b, height // 2, width // 2, f // 4, 2, 2)
    return grid.permute(0, 3, 1, 4, 2, 5).reshape(b, f // 4, height, width)


def image_ids(rows: int, cols: int) -> torch.Tensor:
    """Position ids (0, i, j) of the packed tokens, row-major, [rows cols, 3] (flux_image_ids; diffusers'
    ``_prepare_latent_image_ids``).

    >>> image_ids(1, 2).tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]
    """
    i, j = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.stack([torch.zeros_like(i), i, j], -1).reshape(rows * cols, 3).double()


def transformer_velocity(
    model: Any,
    latents: torch.Tensor,
    sigma: float,
    context: torch.Tensor,
    pooled: torch.Tensor,
    text_ids: torch.Tensor,
    guidance: float | None,
) -> torch.Tensor:
    """A ``FluxTransformer2DModel``'s velocity for latent rows [B, C, H, W] (odd H or W zero-padded at the bottom /
    right and cropped back, as the C++ denoiser does) at time ``sigma``, conditioned on ``context`` [B, L, D] and
    ``pooled`` [B, V] with text ids [L, 3] and the embedded ``guidance`` (None for a model without a guidance
    embedding); computed on the model's device and dtype under the caller's grad mode, returned there.

    >>> model = tiny_pipeline().transformer
    >>> v = transformer_velocity(model, torch.ones(2, 4, 6, 6), 0.5, torch.ones(2, 5, 32), torch.ones(2, 32),
    ...                          torch.zeros(5, 3), 3.5)
    >>> tuple(v.shape)
    (2, 4, 6, 6)
    >>> transformer_velocity(model, torch.ones(2, 3, 6, 6), 0.5, torch.ones(2, 5, 32), torch.ones(2, 32),
    ...                      torch.zeros(5, 3), 3.5)
    Traceback (most recent call last):
    ValueError: velocity: latents (2, 3, 6, 6): must be [rows, 4, H, W]
    """
    channels = model.config.in_channels // 4
    if latents.dim() != 4 or latents.shape[1] != channels:
        raise ValueError(f"velocity: latents {tuple(latents.shape)}: must be [rows, {channels}, H, W]")
    parameter = next(model.parameters())
    b, _, height, width = latents.shape
    x = torch.nn.functional.pad(latents, (0, width % 2, 0, height % 2)).to(parameter.device, parameter.dtype)
    full = torch.full((b,), float(sigma), dtype=parameter.dtype, device=parameter.device)
    tokens = model(
        hidden_states=pack(x),
        encoder_hidden_states=context.to(parameter.device, parameter.dtype),
        pooled_projections=pooled.to(parameter.device, parameter.dtype),
        timestep=full,
        img_ids=image_ids(x.shape[2] // 2, x.shape[3] // 2).to(parameter.device),
        txt_ids=text_ids.to(parameter.device),
        guidance=torch.full_like(full, guidance) if guidance is not None else None,
        return_dict=False,
    )[0]
    return unpack(tokens, x.shape[2], x.shape[3])[:, :, :height, :width]


class PackedAdapter(Adapter):
    """What FLUX.1 and Qwen-Image share: engine rows [C, H/f, W/f] that the pipeline packs 2 x 2 into tokens
    [H/2f W/2f, 4C] (its latents), and its schedule ``linspace(1, 1/steps, steps)`` shifted by the dynamic mu of the
    token count, with the ``calculate_shift`` and ``retrieve_timesteps`` of the pipeline's module
    (``_pipeline_module``). A family's adapter subclasses it and writes its constructor and ``_velocity``.

    >>> from branchgrpo.diffusers.qwenimage import QwenImageAdapter
    >>> [a.__name__ for a in PackedAdapter.__subclasses__()], QwenImageAdapter._pipeline_module.split(".")[-1]
    (['FluxAdapter', 'QwenImageAdapter'], 'pipeline_qwenimage')
    """

    _pipeline_module: ClassVar[str] = "diffusers.pipelines.flux.pipeline_flux"

    def latent_shape(self, height: int, width: int) -> list[int]:
        """[C, H / f, W / f] for an image of ``height`` x ``width`` pixels, f the VAE's scale factor (8); the
        packing needs even latent sizes, so both must be multiples of 2 f.

        >>> adapter = FluxAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32),
        ...                       pooled_prompt_embeds=torch.ones(1, 32))
        >>> adapter.latent_shape(64, 128)
        [4, 8, 16]
        >>> adapter.latent_shape(64, 72)
        Traceback (most recent call last):
        ValueError: flux: width = 72: must be a positive multiple of 16 (the VAE's factor 8 times the 2 x 2 packing)
        """
        factor = self.pipeline.vae_scale_factor
        why = f"the VAE's factor {factor} times the 2 x 2 packing"
        height, width = self._check_resolution(height, width, 2 * factor, why)
        return [self.transformer.config.in_channels // 4, height // factor, width // factor]

    def sigmas(self, steps: int, height: int, width: int) -> list[float]:
        """The pipeline's schedule: ``linspace(1, 1/steps, steps)`` through its scheduler with mu =
        ``calculate_shift`` of the image's token count (H/2f x W/2f) and the scheduler's config, then 0.

        >>> adapter = FluxAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32),
        ...                       pooled_prompt_embeds=torch.ones(1, 32))
        >>> [round(s, 4) for s in adapter.sigmas(4, 64, 64)]
        [1.0, 0.8261, 0.6129, 0.3454, 0.0]
        """
        pipeline_module = importlib.import_module(self._pipeline_module)
        calculate_shift, retrieve_timesteps = pipeline_module.calculate_shift, pipeline_module.retrieve_timesteps
        steps = self._check_steps(steps)
        _, rows, cols = self.latent_shape(height, width)
        config = self.pipeline.scheduler.config
        mu = calculate_shift(
            (rows // 2) * (cols // 2),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        default = None if config.get("use_flow_sigmas", False) else numpy.linspace(1.0, 1 / steps, steps)
        return self._scheduler_sigmas(retrieve_timesteps, steps, default, mu=mu)

    def to_pipeline(self, latents: torch.Tensor) -> torch.Tensor:
        """Engine rows [B, C, H, W] packed as the pipeline's latents [B, H/2 W/2, 4C].

        >>> adapter = FluxAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32),
        ...                       pooled_prompt_embeds=torch.ones(1, 32))
        >>> x = torch.randn(2, 4, 8, 8)
        >>> packed = adapter.to_pipeline(x)
        >>> tuple(packed.shape), bool(torch.equal(adapter.from_pipeline(packed, 64, 64), x))
        ((2, 16, 16), True)
        """
        return pack(latents)

    def from_pipeline(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The pipeline's packed latents of an image of ``height`` x ``width`` pixels as engine rows.

        >>> adapter = FluxAdapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32),
        ...                       pooled_prompt_embeds=torch.ones(1, 32))
        >>> tuple(adapter.from_pipeline(torch.ones(2, 8, 16), 32, 64).shape)
        (2, 4, 4, 8)
        """
        _, rows, cols = self.latent_shape(height, width)
        return unpack(latents, rows, cols)


class FluxAdapter(PackedAdapter):
    """A ``FluxPipeline`` (FLUX.1 dev or schnell) for the engine. Prompts are encoded once with the pipeline's
    ``encode_prompt`` (``prompts``: strings, needs its text encoders), or given as ``prompt_embeds`` [N, L, D] and
    ``pooled_prompt_embeds`` [N, V]; prompt index p is row p. ``guidance_scale`` is the embedded guidance (the
    pipeline's default 3.5; ignored by a model without a guidance embedding). FLUX.1 is guidance-distilled: a
    ``negative_prompt`` is refused.

    >>> pipe = tiny_pipeline()
    >>> adapter = FluxAdapter(pipe, prompt_embeds=torch.ones(2, 5, 32), pooled_prompt_embeds=torch.ones(2, 32))
    >>> v = adapter.velocity(torch.ones(3, 4, 8, 8), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), bool(torch.equal(v[0], v[2])), adapter.prompt_count
    ((3, 4, 8, 8), True, 2)
    >>> FluxAdapter(pipe, prompt_embeds=torch.ones(2, 5, 32), pooled_prompt_embeds=torch.ones(2, 32),
    ...             negative_prompt="blurry")
    Traceback (most recent call last):
    ValueError: flux: a negative prompt was given, but FLUX.1 has no classifier-free guidance (its guidance is ...)
    """

    family = "flux"
    pipelines = ("FluxPipeline",)

    def __init__(
        self,
        pipeline: Any,
        prompts: Sequence[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        pooled_prompt_embeds: torch.Tensor | None = None,
        guidance_scale: float = 3.5,
        negative_prompt: str | Sequence[str] | None = None,
        max_sequence_length: int = 512,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        self._refuse_negative(
            negative_prompt, "FLUX.1 has no classifier-free guidance (its guidance is embedded: guidance_scale)"
        )
        self._check_prompts(prompts, (prompt_embeds, pooled_prompt_embeds), "prompt_embeds and pooled_prompt_embeds")
        context, pooled, text_ids = pipeline.encode_prompt(
            prompt=None if prompts is None else list(prompts),
            prompt_embeds=prompt_embeds,
            pooled_prompt_embeds=pooled_prompt_embeds,
            device=next(self.transformer.parameters()).device,
            max_sequence_length=max_sequence_length,
        )
        self.context, self.pooled = self._embeddings(context, pooled)
        self.text_ids = text_ids
        self.guidance = float(guidance_scale) if self.transformer.config.guidance_embeds else None

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        return transformer_velocity(
            self.transformer, x, sigma, self.context[rows], self.pooled[rows], self.text_ids, self.guidance
        )


def tiny_pipeline(seed: int = 0) -> Any:
    """A ``FluxPipeline`` with a random-weight transformer small enough for a CPU test (one double and one single
    block, width 32, 4 latent channels, a guidance embedding), seeded by ``seed``, FLUX.1-dev's scheduler config
    and no VAE or text encoders (pass prompt embeddings: context width 32, pooled 32). Nothing is downloaded.

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.in_channels, pipe.scheduler.config.use_dynamic_shifting
    ('FluxPipeline', 16, True)
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    def transformer() -> Any:
        return FluxTransformer2DModel(
            in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 6, 6),
        )  # fmt: skip

    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096,
    )  # fmt: skip
    return tiny(FluxPipeline, transformer, scheduler, seed)
