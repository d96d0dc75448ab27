"""FLUX.2 (diffusers' ``Flux2Pipeline``, FLUX.2 [dev], and ``Flux2KleinPipeline``, FLUX.2 [klein]).

The pipeline's latents are the VAE's latents patchified 2 x 2 into channels and batch-normalized by the VAE's running
statistics, [4C, H/2f, W/2f] (f the VAE's factor 8; C = 32, so [128, H/16, W/16]): the engine's rows are these, the
pipeline's ``latents=`` argument as they are. The transformer sees them flattened row-major into tokens [H/2f W/2f, 4C]
(the pipeline's ``_pack_latents``; its ``output_type="latent"`` result) with 4-D position ids (t, h, w, l): image
tokens (0, i, j, 0), text tokens (0, 0, 0, l). Time is sigma (the pipeline passes its timestep / 1000; the model
embeds 1000 sigma). The schedule is the pipeline's: ``linspace(1, 1/steps, steps)`` through its scheduler with mu =
``compute_empirical_mu`` of the token count and the step count, then 0.

- FLUX.2 [dev]: embedded guidance (``guidance_scale``, 4.0), no CFG: a negative prompt is refused.
- FLUX.2 [klein]: no guidance embedding; CFG with a negative prompt (two calls, v = v_neg + g (v_pos - v_neg)) where
  ``guidance_scale`` > 1 and the model is not step-wise distilled (the pipeline's ``is_distilled``).

>>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(2, 5, 32))
>>> adapter.latent_shape(64, 48), adapter.guidance, [round(s, 4) for s in adapter.sigmas(4, 64, 48)]
([16, 4, 3], 4.0, [1.0, 0.9545, 0.8749, 0.6998, 0.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch

from branchgrpo.diffusers._adapter import Adapter, tiny

__all__ = [
    "VARIANTS",
    "Flux2Adapter",
    "latent_ids",
    "pack",
    "patchify",
    "text_ids",
    "tiny_pipeline",
    "unpack",
    "unpatchify",
]

# tiny_pipeline's variants: FLUX.2 [dev], FLUX.2 [klein] base (CFG), FLUX.2 [klein] (step-wise distilled).
VARIANTS = ("dev", "klein-base", "klein")


def pack(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H W, C]: token i W + j is position (i, j) (diffusers' ``Flux2Pipeline._pack_latents``).

    >>> pack(torch.arange(8.0).view(1, 2, 2, 2))[0].tolist()
    [[0.0, 4.0], [1.0, 5.0], [2.0, 6.0], [3.0, 7.0]]
    """
    b, c, h, w = x.shape
    return x.reshape(b, c, h * w).permute(0, 2, 1)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of ``pack``: [B, H W, C] -> [B, C, H, W] (``height``, ``width`` in tokens).

    >>> x = torch.randn(2, 3, 4, 5)
    >>> bool(torch.equal(unpack(pack(x), 4, 5), x))
    True
    """
    b, _, c = tokens.shape
    return tokens.permute(0, 2, 1).reshape(b, c, height, width)


def patchify(x: torch.Tensor) -> torch.Tensor:
    """VAE latents [B, C, H, W] -> [B, 4C, H/2, W/2]: channel 4c + 2p + q is channel c at row offset p, column
    offset q of each 2 x 2 patch (diffusers' ``Flux2Pipeline._patchify_latents``).

    >>> patchify(torch.arange(4.0).view(1, 1, 2, 2)).flatten().tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, 4 * c, h // 2, w // 2)


def unpatchify(x: torch.Tensor) -> torch.Tensor:
    """The inverse of ``patchify``: [B, 4C, H, W] -> [B, C, 2H, 2W] (diffusers' ``_unpatchify_latents``).

    >>> x = torch.randn(2, 3, 4, 6)
    >>> bool(torch.equal(unpatchify(patchify(x)), x))
    True
    """
    b, c, h, w = x.shape
    return x.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, 2 * h, 2 * w)


def latent_ids(height: int, width: int) -> torch.Tensor:
    """The image tokens' position ids (t, h, w, l) = (0, i, j, 0), row-major, [H W, 4] int64 (diffusers'
    ``_prepare_latent_ids``, one row of it: the model reads the first).

    >>> latent_ids(1, 2).tolist()
    [[0, 0, 0, 0], [0, 0, 1, 0]]
    """
    return torch.cartesian_prod(torch.arange(1), torch.arange(height), torch.arange(width), torch.arange(1))


def text_ids(length: int) -> torch.Tensor:
    """The text tokens' position ids (0, 0, 0, l), [L, 4] int64 (diffusers' ``_prepare_text_ids``, one row of it).

    >>> text_ids(2).tolist()
    [[0, 0, 0, 0], [0, 0, 0, 1]]
    """
    return torch.stack([torch.zeros(length, dtype=torch.int64)] * 3 + [torch.arange(length)], -1)


class Flux2Adapter(Adapter):
    """A ``Flux2Pipeline`` (FLUX.2 [dev]) or ``Flux2KleinPipeline`` (FLUX.2 [klein]) for the engine. Prompts are
    encoded once with the pipeline's ``encode_prompt`` (``prompts``: strings, with its text encoder; Mistral for
    [dev], Qwen3 for [klein]), or given as ``prompt_embeds`` [N, L, D]; prompt index p is row p.

    [dev]: ``guidance_scale`` is the embedded guidance (the pipeline's 4.0; none for a model without a guidance
    embedding); a negative prompt is refused. [klein]: CFG runs where ``guidance_scale`` > 1 (4.0) and the pipeline
    is not ``is_distilled``, with ``negative_prompt_embeds`` [N, L', D] or the ``negative_prompt`` (default "", the
    pipeline's) encoded by its text encoder; a negative prompt where CFG does not run is refused.

    >>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(2, 5, 32))
    >>> v = adapter.velocity(torch.ones(3, 16, 4, 3), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), bool(torch.equal(v[0], v[2])), adapter.cfg
    ((3, 16, 4, 3), True, False)
    >>> klein = Flux2Adapter(tiny_pipeline(variant="klein-base"), prompt_embeds=torch.ones(2, 5, 32),
    ...                      negative_prompt_embeds=torch.zeros(2, 3, 32))
    >>> klein.cfg, klein.guidance, klein.guidance_scale
    (True, None, 4.0)
    >>> Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(2, 5, 32), negative_prompt="blurry")
    Traceback (most recent call last):
    ValueError: flux2: a negative prompt was given, but FLUX.2 [dev] has no classifier-free guidance (its guidance ...)
    """

    family = "flux2"
    pipelines = ("Flux2Pipeline", "Flux2KleinPipeline")

    def __init__(
        self,
        pipeline: Any,
        prompts: Sequence[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt: str | Sequence[str] | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        guidance_scale: float = 4.0,
        max_sequence_length: int = 512,
        text_encoder_out_layers: Sequence[int] | None = None,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        self._check_prompts(prompts, (prompt_embeds,), "prompt_embeds")
        self.cfg = self._guidance(guidance_scale, negative_prompt, negative_prompt_embeds)
        encode = dict(device=next(self.transformer.parameters()).device, max_sequence_length=max_sequence_length)
        if text_encoder_out_layers is not None:
            encode["text_encoder_out_layers"] = tuple(text_encoder_out_layers)
        context, ids = pipeline.encode_prompt(
            prompt=None if prompts is None else list(prompts), prompt_embeds=prompt_embeds, **encode
        )
        negative_context = negative_ids = None
        if self.cfg:
            count = len(prompts) if prompts is not None else prompt_embeds.shape[0]
            if negative_prompt_embeds is None and not isinstance(negative_prompt, (list, tuple)):
                negative_prompt = [negative_prompt or ""] * count
            negative_context, negative_ids = pipeline.encode_prompt(
                prompt=None if negative_prompt is None else list(negative_prompt),
                prompt_embeds=negative_prompt_embeds,
                **encode,
            )
        self.context, self.negative_context = self._embeddings(context, negative_context)
        self.text_ids = ids[0]
        self.negative_text_ids = None if negative_ids is None else negative_ids[0]

    def _guidance(self, guidance_scale: float, negative: Any, negative_embeds: torch.Tensor | None) -> bool:
        """Whether CFG runs ([klein], not distilled, guidance_scale > 1); sets ``guidance`` (the embedded guidance:
        [dev] with a guidance embedding, else None) and ``guidance_scale``. A negative prompt where CFG does not run
        is a ValueError."""
        self.guidance_scale = float(guidance_scale)
        given = negative if negative is not None else negative_embeds
        klein = any(cls.__name__ == "Flux2KleinPipeline" for cls in type(self.pipeline).__mro__)
        embedded = not klein and bool(self.transformer.config.guidance_embeds)
        self.guidance = self.guidance_scale if embedded else None
        if not klein:
            why = "FLUX.2 [dev] has no classifier-free guidance (its guidance is embedded: guidance_scale)"
            self._refuse_negative(given, why)
            return False
        if self.pipeline.config.get("is_distilled", False):
            self._refuse_negative(given, "a step-wise distilled FLUX.2 [klein] (is_distilled) runs no CFG")
            return False
        return self._classifier_free(guidance_scale, (negative,), (negative_embeds,))

    def _call(
        self,
        tokens: torch.Tensor,
        timestep: torch.Tensor,
        context: torch.Tensor,
        ids: torch.Tensor,
        image: torch.Tensor,
    ) -> torch.Tensor:
        guidance = None if self.guidance is None else torch.full_like(timestep, self.guidance, dtype=torch.float32)
        return self.transformer(
            hidden_states=tokens,
            timestep=timestep,
            guidance=guidance,
            encoder_hidden_states=context,
            txt_ids=ids.to(tokens.device),
            img_ids=image,
            return_dict=False,
        )[0]

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        _, _, height, width = x.shape
        tokens, image = pack(x), latent_ids(height, width).to(x.device)
        # The pipeline's timestep / 1000: its scheduler's float32 sigma x num_train_timesteps, then / 1000.
        t = torch.tensor(sigma, dtype=torch.float32) * self.pipeline.scheduler.config.num_train_timesteps
        timestep = t.to(x.device).expand(x.shape[0]).to(x.dtype) / 1000
        v = self._call(tokens, timestep, self.context[rows], self.text_ids, image)
        if self.cfg:
            negative = self._call(tokens, timestep, self.negative_context[rows], self.negative_text_ids, image)
            v = negative + self.guidance_scale * (v - negative)
        return unpack(v, height, width)

    def latent_shape(self, height: int, width: int) -> list[int]:
        """[4C, H / 2f, W / 2f] for an image of ``height`` x ``width`` pixels (the pipeline's latents: C = the
        transformer's in_channels / 4, f the VAE's factor 8): both must be multiples of 2 f.

        >>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32))
        >>> adapter.latent_shape(64, 128)
        [16, 4, 8]
        >>> adapter.latent_shape(64, 40)
        Traceback (most recent call last):
        ValueError: flux2: width = 40: must be a positive multiple of 16 (the VAE's factor 8 times the 2 x 2 patchify)
        """
        factor = self.pipeline.vae_scale_factor
        why = f"the VAE's factor {factor} times the 2 x 2 patchify"
        height, width = self._check_resolution(height, width, 2 * factor, why)
        return [self.transformer.config.in_channels, height // (2 * factor), width // (2 * factor)]

    def sigmas(self, steps: int, height: int, width: int) -> list[float]:
        """The pipeline's schedule: ``linspace(1, 1/steps, steps)`` through its scheduler with mu =
        ``compute_empirical_mu`` of the image's token count (H/2f x W/2f) and ``steps``, then 0.

        >>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32))
        >>> [round(s, 4) for s in adapter.sigmas(2, 1024, 1024)]
        [1.0, 0.9091, 0.0]
        """
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, retrieve_timesteps

        steps = self._check_steps(steps)
        _, rows, cols = self.latent_shape(height, width)
        mu = compute_empirical_mu(image_seq_len=rows * cols, num_steps=steps)
        flow = self.pipeline.scheduler.config.get("use_flow_sigmas", False)
        default = None if flow else numpy.linspace(1.0, 1 / steps, steps)
        return self._scheduler_sigmas(retrieve_timesteps, steps, default, mu=mu)

    def to_pipeline(self, latents: torch.Tensor) -> torch.Tensor:
        """Engine rows [B, 4C, H, W] as the pipeline's ``latents=`` argument: the same tensor. Its
        ``output_type="latent"`` result is their tokens (``pack``) for [dev] and their VAE latents
        (``vae_latents``) for [klein]; ``from_pipeline`` takes any of the three.

        >>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32))
        >>> x = torch.randn(2, 16, 4, 3)
        >>> adapter.to_pipeline(x) is x
        True
        """
        return latents

    def from_pipeline(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The pipeline's latents of an image of ``height`` x ``width`` pixels as engine rows: tokens [B, H W, 4C]
        (the [dev] pipeline's ``output_type="latent"`` result) unpacked, its ``latents=`` form [B, 4C, H, W] as it
        is, VAE latents [B, C, 2H, 2W] (the [klein] pipeline's result) patchified and normalized by the VAE's batch
        norm; another shape is a ValueError naming it.

        >>> adapter = Flux2Adapter(tiny_pipeline(), prompt_embeds=torch.ones(1, 5, 32))
        >>> x = torch.randn(2, 16, 4, 3)
        >>> bool(torch.equal(adapter.from_pipeline(pack(x), 64, 48), x)), adapter.from_pipeline(x, 64, 48) is x
        (True, True)
        >>> adapter.from_pipeline(torch.ones(2, 8, 4, 3), 64, 48)
        Traceback (most recent call last):
        ValueError: flux2: latents (2, 8, 4, 3): for 64 x 48 pixels, must be tokens [B, 12, 16], rows [B, 16, 4, 3] ...
        """
        channels, rows, cols = self.latent_shape(height, width)
        shape = tuple(latents.shape[1:])
        if shape == (rows * cols, channels):
            return unpack(latents, rows, cols)
        if shape == (channels, rows, cols):
            return latents
        if shape == (channels // 4, 2 * rows, 2 * cols):
            mean, std = self._batch_norm(latents)
            return (patchify(latents) - mean) / std
        raise ValueError(
            f"flux2: latents {tuple(latents.shape)}: for {height} x {width} pixels, must be tokens [B, {rows * cols}, "
            f"{channels}], rows [B, {channels}, {rows}, {cols}] or VAE latents [B, {channels // 4}, {2 * rows}, "
            f"{2 * cols}]"
        )

    def vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Engine rows [B, 4C, H, W] as the VAE's latents [B, C, 2H, 2W], what its ``decode`` takes: de-normalized
        by its batch norm and unpatchified, as the pipeline does before decoding.

        >>> adapter = Flux2Adapter(tiny_pipeline(variant="klein"), prompt_embeds=torch.ones(1, 5, 32))
        >>> x = torch.randn(2, 16, 4, 3)
        >>> vae = adapter.vae_latents(x)
        >>> tuple(vae.shape), bool(torch.allclose(adapter.from_pipeline(vae, 64, 48), x, atol=1e-6))
        ((2, 4, 8, 6), True)
        """
        mean, std = self._batch_norm(latents)
        return unpatchify(latents * std + mean)

    def _batch_norm(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm mean and std [1, 4C, 1, 1] on ``latents``' device and dtype, as the pipeline takes
        them; a pipeline without a VAE is a ValueError."""
        vae = getattr(self.pipeline, "vae", None)
        if vae is None:
            raise ValueError("flux2: the pipeline has no VAE: its batch norm maps the latents to the VAE's")
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        return mean, std.to(latents.device, latents.dtype)


def tiny_pipeline(seed: int = 0, variant: str = "dev") -> Any:
    """A FLUX.2 pipeline with a random-weight ``Flux2Transformer2DModel`` small enough for a CPU test (one double and
    one single block, width 32, 4 latent channels patchified to 16), seeded by ``seed``, FLUX.2's scheduler config
    (dynamic exponential shift) and no text encoder (pass prompt embeddings: width 32). Nothing is downloaded.
    ``variant``: "dev" (``Flux2Pipeline``, a guidance embedding, no VAE), "klein-base" (``Flux2KleinPipeline``, no
    guidance embedding, CFG) or "klein" (the same, ``is_distilled``: no CFG); [klein] has a tiny random
    ``AutoencoderKLFlux2`` (factor 8, seeded batch-norm statistics), as its pipeline de-normalizes even its
    ``output_type="latent"`` result with it.

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.in_channels, pipe.transformer.config.guidance_embeds
    ('Flux2Pipeline', 16, True)
    >>> pipe = tiny_pipeline(variant="klein")
    >>> type(pipe).__name__, pipe.transformer.config.guidance_embeds, pipe.config.is_distilled, pipe.vae_scale_factor
    ('Flux2KleinPipeline', False, True, 8)
    """
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )

    if variant not in VARIANTS:
        raise ValueError(f"flux2: variant = {variant!r}: must be one of {', '.join(VARIANTS)}")

    def transformer() -> Any:
        return Flux2Transformer2DModel(
            in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=variant == "dev",
        )  # fmt: skip

    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096, time_shift_type="exponential",
    )  # fmt: skip
    if variant == "dev":
        return tiny(Flux2Pipeline, transformer, scheduler, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformer().eval()
        vae = AutoencoderKLFlux2(
            block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4,
            mid_block_add_attention=False,
        ).eval()  # fmt: skip
        vae.bn.running_mean.copy_(torch.randn(16))
        vae.bn.running_var.copy_(torch.rand(16) + 0.5)
    pipeline = Flux2KleinPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=model,
        is_distilled=variant == "klein",
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
