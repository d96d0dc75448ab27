"""Qwen-Image (diffusers' ``QwenImagePipeline``): latents packed 2 x 2 as FLUX's (``flux.pack``), image shapes per
row, text masks, time sigma (diffusers embeds 1000 sigma), and true classifier-free guidance with a negative prompt
and norm rescale: v = c |v_pos| / |c| per token, c = v_neg + s (v_pos - v_neg). The schedule is the pipeline's:
``linspace(1, 1/steps, steps)`` shifted by the dynamic mu of the token count, then 0.

The engine's rows are latents [C, H, W]; the pipeline's own latents are the packed tokens [H/2 W/2, 4C].

>>> embeds = dict(prompt_embeds=torch.ones(1, 6, 16), negative_prompt_embeds=torch.zeros(1, 6, 16))
>>> adapter = QwenImageAdapter(tiny_pipeline(), **embeds)
>>> adapter.latent_shape(64, 32), adapter.cfg, adapter.true_cfg_scale
([4, 8, 4], True, 4.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from branchgrpo.diffusers._adapter import tiny
from branchgrpo.diffusers.flux import PackedAdapter, pack, unpack

__all__ = ["QwenImageAdapter", "tiny_pipeline"]


class QwenImageAdapter(PackedAdapter):
    """A ``QwenImagePipeline`` for the engine. Prompts are encoded once with the pipeline's ``encode_prompt``
    (``prompts``: strings, with its text encoder), or given as ``prompt_embeds`` [N, L, D] with an optional
    ``prompt_embeds_mask`` [N, L] and, for CFG, ``negative_prompt_embeds`` (and mask); prompt index p is row p. True
    CFG runs as the pipeline runs it: where a negative prompt is given and ``true_cfg_scale`` > 1 (default 4.0);
    a negative prompt with ``true_cfg_scale`` <= 1 is refused. ``guidance_scale`` is the embedded guidance of a
    guidance-distilled model (None otherwise, the pipeline's default).

    >>> pipe = tiny_pipeline()
    >>> adapter = QwenImageAdapter(pipe, prompt_embeds=torch.ones(2, 6, 16))
    >>> v = adapter.velocity(torch.ones(3, 4, 8, 8), 0.5, 0, torch.tensor([1, 0, 1]), None)
    >>> tuple(v.shape), adapter.cfg
    ((3, 4, 8, 8), False)
    >>> QwenImageAdapter(pipe, prompt_embeds=torch.ones(2, 6, 16), negative_prompt="blurry", true_cfg_scale=1.0)
    Traceback (most recent call last):
    ValueError: qwenimage: a negative prompt was given, but true_cfg_scale = 1.0 runs no CFG (it needs ...)
    """

    family = "qwenimage"
    pipelines = ("QwenImagePipeline",)
    _pipeline_module = "diffusers.pipelines.qwenimage.pipeline_qwenimage"

    def __init__(
        self,
        pipeline: Any,
        prompts: Sequence[str] | None = None,
        *,
        prompt_embeds: torch.Tensor | None = None,
        prompt_embeds_mask: torch.Tensor | None = None,
        negative_prompt: str | Sequence[str] | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds_mask: torch.Tensor | None = None,
        true_cfg_scale: float = 4.0,
        guidance_scale: float | None = None,
        max_sequence_length: int = 512,
        gradients: bool = False,
    ) -> None:
        super().__init__(pipeline, gradients=gradients)
        self._check_prompts(prompts, (prompt_embeds,), "prompt_embeds")
        self.true_cfg_scale = float(true_cfg_scale)
        negative = negative_prompt if negative_prompt is not None else negative_prompt_embeds
        if self.true_cfg_scale <= 1:
            why = f"true_cfg_scale = {self.true_cfg_scale} runs no CFG (it needs true_cfg_scale > 1)"
            self._refuse_negative(negative, why)
        self.cfg = negative is not None and self.true_cfg_scale > 1
        if self.transformer.config.guidance_embeds and guidance_scale is None:
            raise ValueError("qwenimage: a guidance-distilled model needs guidance_scale")
        self.guidance = float(guidance_scale) if self.transformer.config.guidance_embeds else None
        device = next(self.transformer.parameters()).device
        encode = dict(device=device, max_sequence_length=max_sequence_length)
        context, mask = pipeline.encode_prompt(
            prompt=None if prompts is None else list(prompts),
            prompt_embeds=prompt_embeds,
            prompt_embeds_mask=prompt_embeds_mask,
            **encode,
        )
        negative_context = negative_mask = None
        if self.cfg:
            if negative_prompt is not None and isinstance(negative_prompt, str) and prompts is not None:
                negative_prompt = [negative_prompt] * len(prompts)
            negative_context, negative_mask = pipeline.encode_prompt(
                prompt=negative_prompt,
                prompt_embeds=negative_prompt_embeds,
                prompt_embeds_mask=negative_prompt_embeds_mask,
                **encode,
            )
        self.context, self.negative_context = self._embeddings(context, negative_context)
        self.mask, self.negative_mask = mask, negative_mask

    def _call(self, tokens: torch.Tensor, sigma: float, context: torch.Tensor, mask: Any, shape: Any) -> torch.Tensor:
        timestep = torch.full((tokens.shape[0],), float(sigma), dtype=tokens.dtype, device=tokens.device)
        guidance = None if self.guidance is None else torch.full_like(timestep, self.guidance, dtype=torch.float32)
        return self.transformer(
            hidden_states=tokens,
            encoder_hidden_states=context,
            encoder_hidden_states_mask=mask,
            timestep=timestep,
            img_shapes=shape,
            guidance=guidance,
            return_dict=False,
        )[0]

    def _velocity(self, x: torch.Tensor, sigma: float, rows: torch.Tensor) -> torch.Tensor:
        _, _, height, width = x.shape
        tokens = pack(x)
        shape = [[(1, height // 2, width // 2)]] * x.shape[0]
        v = self._call(tokens, sigma, self.context[rows], None if self.mask is None else self.mask[rows], shape)
        if self.cfg:
            mask = None if self.negative_mask is None else self.negative_mask[rows]
            negative = self._call(tokens, sigma, self.negative_context[rows], mask, shape)
            combined = negative + self.true_cfg_scale * (v - negative)
            v = combined * (torch.norm(v, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))
        return unpack(v, height, width)


def tiny_pipeline(seed: int = 0) -> Any:
    """A ``QwenImagePipeline`` with a random-weight transformer small enough for a CPU test (two layers, width 48,
    4 latent channels), seeded by ``seed``, a dynamic-shift scheduler (tokens 256 to 8192, shifts 0.5 to 0.9, stretched
    to end at 0.02) and no VAE or text encoder (pass prompt embeddings: width 16). Nothing is downloaded.

    >>> pipe = tiny_pipeline()
    >>> type(pipe).__name__, pipe.transformer.config.in_channels, pipe.scheduler.config.use_dynamic_shifting
    ('QwenImagePipeline', 16, True)
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel

    def transformer() -> Any:
        return QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
            joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
        )  # fmt: skip

    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
        max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
    )  # fmt: skip
    return tiny(QwenImagePipeline, transformer, scheduler, seed)
