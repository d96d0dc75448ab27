"""diffusers pipelines as the engine's model: one adapter per model family (docs/python.md, "diffusers models").

``adapter_for(pipeline, ...)`` picks the family by the pipeline's class and returns its ``Adapter``: the velocity
``branchgrpo.rollout`` and ``Policy`` call (the pipeline's transformer with its timestep scale, packing, ids, guidance
and CFG, conditioned on the prompt rows the adapter holds), the latent shape and the pipeline's sigmas for a
resolution, and the pipeline's latent layout. Each family's module holds its adapter and a ``tiny_pipeline`` (random
weights, for tests); adding a family is one module and one entry in ``ADAPTERS`` (docs/extending.md).

>>> import torch
>>> families()
['flux', 'sd3', 'wan', 'qwenimage', 'flux2']
>>> pipe = flux.tiny_pipeline()
>>> adapter = adapter_for(pipe, prompt_embeds=torch.ones(2, 5, 32), pooled_prompt_embeds=torch.ones(2, 32))
>>> adapter.family, adapter.latent_shape(64, 64)
('flux', [4, 8, 8])
"""

from __future__ import annotations

from typing import Any

from branchgrpo.diffusers import flux, flux2, qwenimage, sd3, wan
from branchgrpo.diffusers._adapter import Adapter

__all__ = ["ADAPTERS", "Adapter", "adapter_for", "families", "flux", "flux2", "qwenimage", "sd3", "wan"]

# The registry: each family's adapter, which names the pipeline classes it adapts.
ADAPTERS: tuple[type[Adapter], ...] = (
    flux.FluxAdapter,
    sd3.SD3Adapter,
    wan.WanAdapter,
    qwenimage.QwenImageAdapter,
    flux2.Flux2Adapter,
)


def families() -> list[str]:
    """The model families with an adapter, in registry order.

    >>> families()
    ['flux', 'sd3', 'wan', 'qwenimage', 'flux2']
    """
    return [adapter.family for adapter in ADAPTERS]


def adapter_for(pipeline: Any, *args: Any, **options: Any) -> Adapter:
    """The adapter of ``pipeline``'s family (chosen by its class or a base class of it), built with ``options``
    (the family's: prompts or prompt embeddings, guidance_scale, negative prompt ...). A pipeline of a family without
    an adapter is one ``ValueError`` listing the known ones.

    >>> import torch
    >>> pipe = sd3.tiny_pipeline()
    >>> adapter_for(pipe, prompt_embeds=torch.ones(1, 6, 32), pooled_prompt_embeds=torch.ones(1, 64),
    ...             guidance_scale=1.0)
    <sd3 adapter of StableDiffusion3Pipeline: 1 prompts>
    >>> adapter_for(torch.nn.Linear(2, 2))
    Traceback (most recent call last):
    ValueError: no diffusers adapter for a Linear: the known families are flux (FluxPipeline), sd3 (...)
    """
    by_class = {name: adapter for adapter in ADAPTERS for name in adapter.pipelines}
    for cls in type(pipeline).__mro__:
        if cls.__name__ in by_class:
            return by_class[cls.__name__](pipeline, *args, **options)
    known = ", ".join(f"{a.family} ({', '.join(a.pipelines)})" for a in ADAPTERS)
    raise ValueError(f"no diffusers adapter for a {type(pipeline).__name__}: the known families are {known}")
