"""branchgrpo.diffusers: each family's adapter against the pipeline itself. On a tiny random-weight model of the
family (built from a diffusers config, seeded; nothing downloaded), the engine's deterministic rollout driven by the
adapter, from the engine's own initial noise and on the adapter's sigmas, ends where the pipeline's own sampling loop
(``output_type="latent"``) ends from the same latents with the same steps, within 1e-5 relative. Then the registry's
and the adapters' one-line errors, and one Trainer iteration on an adapter's velocity and sigmas."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import branchgrpo
from branchgrpo.diffusers import adapter_for, families, flux, qwenimage, sd3, wan

STEPS, HEIGHT, WIDTH, PROMPTS = 4, 64, 48, 2


def ode_method(steps: int) -> branchgrpo.Method:
    """Every step an Euler ODE step, one chain per prompt: flow_grpo_fast with one sample whose one SDE step is the
    last, where cps draws no noise (sigma next = 0), so the engine makes it ODE like the others."""
    return branchgrpo.Method(
        "dance",
        topology={"kind": "flow_grpo_fast", "group_size": 1, "split_step": steps - 1},
        rollout={"stepper": "cps"},
    )


def embeddings(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Random embeddings of these shapes; a ``*_mask`` masks the last two tokens of the first prompt."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("_mask"):
            out[name] = torch.ones(shape, dtype=torch.int64)
            out[name][0, -2:] = 0
        else:
            out[name] = torch.randn(*shape, generator=generator)
    return out


@dataclass
class Case:
    family: str
    pipeline: Callable[[], Any]
    embeds: dict[str, tuple[int, ...]]  # the pipeline's prompt-embedding arguments and their shapes
    options: dict[str, Any]  # for both the adapter and the pipeline
    shape: dict[str, Any] = field(default_factory=dict)  # for latent_shape and the pipeline (a clip's frames)


CASES = {
    "flux": Case(
        "flux", flux.tiny_pipeline, {"prompt_embeds": (PROMPTS, 5, 32), "pooled_prompt_embeds": (PROMPTS, 32)}, {}
    ),
    "sd3-cfg": Case(
        "sd3",
        sd3.tiny_pipeline,
        {
            "prompt_embeds": (PROMPTS, 6, 32),
            "pooled_prompt_embeds": (PROMPTS, 64),
            "negative_prompt_embeds": (PROMPTS, 6, 32),
            "negative_pooled_prompt_embeds": (PROMPTS, 64),
        },
        {"guidance_scale": 4.5},
    ),
    "wan-cfg": Case(
        "wan",
        wan.tiny_pipeline,
        {"prompt_embeds": (PROMPTS, 6, 32), "negative_prompt_embeds": (PROMPTS, 6, 32)},
        {"guidance_scale": 5.0},
        {"num_frames": 5},
    ),
    "qwenimage-cfg": Case(
        "qwenimage",
        qwenimage.tiny_pipeline,
        {
            "prompt_embeds": (PROMPTS, 6, 16),
            "prompt_embeds_mask": (PROMPTS, 6),
            "negative_prompt_embeds": (PROMPTS, 6, 16),
        },
        {"true_cfg_scale": 4.0},
    ),
    "sd3-no-cfg": Case(
        "sd3",
        sd3.tiny_pipeline,
        {"prompt_embeds": (PROMPTS, 6, 32), "pooled_prompt_embeds": (PROMPTS, 64)},
        {"guidance_scale": 1.0},
    ),
}


def relative_gap(case: Case) -> tuple[float, float]:
    """(max |engine - pipeline| / max |pipeline| of the final latents, how far the pipeline moved them, relative)."""
    pipe = case.pipeline()
    embeds = embeddings(case.embeds, seed=1)
    adapter = adapter_for(pipe, **embeds, **case.options)
    sigmas = adapter.sigmas(STEPS, HEIGHT, WIDTH)
    result = branchgrpo.rollout(
        adapter.velocity,
        prompts=list(range(PROMPTS)),
        latent_shape=adapter.latent_shape(HEIGHT, WIDTH, **case.shape),
        method=ode_method(STEPS),
        steps=STEPS,
        sigmas=sigmas,
        seed=5,
    )
    assert (result.tree.kind[result.tree.step > 0] == 1).all() and not result.log_probs.any()  # all ODE
    start = adapter.to_pipeline(result.latents[0])
    out = pipe(
        latents=start.clone(),
        num_inference_steps=STEPS,
        height=HEIGHT,
        width=WIDTH,
        output_type="latent",
        **embeds,
        **case.options,
        **case.shape,
    )
    out = out.frames if hasattr(out, "frames") else out.images
    assert pipe.scheduler.sigmas.tolist() == sigmas  # the pipeline ran the adapter's schedule
    ours = adapter.to_pipeline(result.latents[-1])
    assert ours.shape == out.shape
    scale = float(out.abs().max())
    return float((ours - out).abs().max()) / scale, float((out - start).abs().max()) / scale


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_engine_with_the_adapter_is_the_pipeline(name: str) -> None:
    gap, moved = relative_gap(CASES[name])
    assert gap < 1e-5, (name, gap)
    assert moved > 0.1, (name, moved)  # the model did move the latents: the equality is not a trivial one


def test_every_family_is_checked() -> None:
    assert sorted({case.family for case in CASES.values()}) == sorted(families())


def test_the_registry_refuses_a_pipeline_without_an_adapter_in_one_line() -> None:
    class CogView4Pipeline:  # a family without an adapter, by its class name
        transformer = None

    with pytest.raises(
        ValueError, match=r"^no diffusers adapter for a CogView4Pipeline: the known families are flux \("
    ):
        adapter_for(CogView4Pipeline())

    class MyFluxPipeline(type(flux.tiny_pipeline())):  # a subclass is its base's family
        pass

    pipe = flux.tiny_pipeline()
    pipe.__class__ = MyFluxPipeline
    embeds = embeddings(CASES["flux"].embeds, seed=0)
    assert adapter_for(pipe, **embeds).family == "flux"


def test_adapter_errors_are_one_line() -> None:
    pipe = flux.tiny_pipeline()
    embeds = embeddings(CASES["flux"].embeds, seed=0)
    adapter = adapter_for(pipe, **embeds)
    for call, message in [
        (lambda: adapter.latent_shape(64, 40), "flux: width = 40: must be a positive multiple of 16"),
        (lambda: adapter.latent_shape(0, 64), "flux: height = 0: must be a positive multiple of 16"),
        (lambda: adapter.sigmas(0, 64, 64), r"flux: steps = 0: must be an integer in \[1, 255\]"),
        (lambda: adapter_for(pipe, negative_prompt="x", **embeds), "flux: a negative prompt was given, but FLUX.1"),
        (lambda: adapter_for(pipe, prompt_embeds=embeds["prompt_embeds"]), "flux: give prompts"),
        (
            lambda: adapter.velocity(torch.zeros(1, 4, 8, 8), 1.0, 0, torch.tensor([2]), None),
            r"flux velocity: prompts \[2\]: the adapter holds 2 prompts",
        ),
    ]:
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
    sd3_embeds = embeddings(CASES["sd3-no-cfg"].embeds, seed=0)
    with pytest.raises(ValueError, match="sd3: CFG .* needs negative_prompt_embeds"):
        adapter_for(sd3.tiny_pipeline(), **sd3_embeds)


def test_a_trainer_iteration_on_an_adapter() -> None:
    pipe = flux.tiny_pipeline()
    adapter = adapter_for(pipe, gradients=True, **embeddings(CASES["flux"].embeds, seed=0))
    calls: list[float] = []

    def velocity(latents, sigma, step, prompts, trees):
        calls.append(sigma)
        return adapter.velocity(latents, sigma, step, prompts, trees)

    sigmas = adapter.sigmas(STEPS, 32, 32)
    policy = branchgrpo.Policy(velocity, torch.optim.SGD(pipe.transformer.parameters(), lr=1e-3))
    trainer = branchgrpo.Trainer(
        policy,
        lambda leaves, prompts: -leaves.square().mean((1, 2, 3)),
        latent_shape=adapter.latent_shape(32, 32),
        method=branchgrpo.Method("dance", topology={"group_size": 2}),
        steps=STEPS,
        sigmas=sigmas,
    )
    before = [p.detach().clone() for p in pipe.transformer.parameters()]
    stats = trainer.step([0, 1])
    assert stats["edges_trained"] == 2 * 2 * STEPS
    assert set(calls) == set(sigmas[:-1])  # the rollout and the update ran on the pipeline's schedule
    assert any(not torch.equal(b, p) for b, p in zip(before, pipe.transformer.parameters(), strict=True))
    assert np.isfinite(stats["loss"])
