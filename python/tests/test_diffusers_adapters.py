"""branchgrpo.diffusers: each family's adapter against the pipeline itself. On a tiny random-weight model of the
family (built from a diffusers config, seeded; nothing downloaded), the engine's deterministic rollout driven by the
adapter, from the engine's own initial noise and on the adapter's sigmas, ends where the pipeline's own sampling loop
(``output_type="latent"``) ends from the same latents with the same steps, within 1e-5 relative. Then the registry's
and the adapters' one-line errors (``BAD_INPUT``), one Trainer iteration on an adapter's velocity and sigmas, and one
that trains both of Wan2.2 A14B's experts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import branchgrpo
from branchgrpo.diffusers import adapter_for, families, flux, flux2, qwenimage, sd3, wan

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
    size: tuple[int, int] = (HEIGHT, WIDTH)  # height and width in pixels
    experts: int = 1  # how many of the adapter's transformers the schedule selects (Wan2.2 A14B: both)


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
    # Wan2.2 A14B: the boundary 0.875 falls between steps 1 and 2 (timesteps 1000, 910 | 717, 24): both experts run,
    # each with its guidance scale.
    "wan2.2-a14b-cfg": Case(
        "wan",
        lambda: wan.tiny_pipeline(variant="a14b"),
        {"prompt_embeds": (PROMPTS, 6, 32), "negative_prompt_embeds": (PROMPTS, 6, 32)},
        {"guidance_scale": 4.0, "guidance_scale_2": 3.0},
        {"num_frames": 5},
        experts=2,
    ),
    # The boundary on step 2's own timestep (its float32 sigma, of the 4 steps): the pipeline's >= gives that step to
    # the high-noise expert.
    "wan2.2-a14b-boundary-on-a-step": Case(
        "wan",
        lambda: wan.tiny_pipeline(variant="a14b", boundary_ratio=0.7173174619674683),
        {"prompt_embeds": (PROMPTS, 6, 32)},
        {"guidance_scale": 1.0},
        {"num_frames": 5},
        experts=2,
    ),
    "wan2.2-ti2v-cfg": Case(
        "wan",
        lambda: wan.tiny_pipeline(variant="ti2v"),
        {"prompt_embeds": (PROMPTS, 6, 32), "negative_prompt_embeds": (PROMPTS, 6, 32)},
        {"guidance_scale": 5.0},
        {"num_frames": 5},
        size=(64, 96),
    ),
    "flux2": Case("flux2", flux2.tiny_pipeline, {"prompt_embeds": (PROMPTS, 5, 32)}, {"guidance_scale": 4.0}),
    "flux2-klein-base-cfg": Case(
        "flux2",
        lambda: flux2.tiny_pipeline(variant="klein-base"),
        {"prompt_embeds": (PROMPTS, 5, 32), "negative_prompt_embeds": (PROMPTS, 3, 32)},
        {"guidance_scale": 4.0},
    ),
    "flux2-klein": Case("flux2", lambda: flux2.tiny_pipeline(variant="klein"), {"prompt_embeds": (PROMPTS, 5, 32)}, {}),
}


def relative_gap(case: Case) -> tuple[float, float]:
    """(max |engine - pipeline| / max |pipeline| of the final latents, how far the pipeline moved them, relative),
    compared in the engine's layout (``from_pipeline``: FLUX.2's pipeline takes its latents in one layout and returns
    them in another)."""
    pipe = case.pipeline()
    embeds = embeddings(case.embeds, seed=1)
    adapter = adapter_for(pipe, **embeds, **case.options)
    height, width = case.size
    sigmas = adapter.sigmas(STEPS, height, width)
    experts = {adapter.expert(s) for s in sigmas[:-1]} if hasattr(adapter, "expert") else {0}
    assert len(experts) == case.experts
    result = branchgrpo.rollout(
        adapter.velocity,
        prompts=list(range(PROMPTS)),
        latent_shape=adapter.latent_shape(height, width, **case.shape),
        method=ode_method(STEPS),
        steps=STEPS,
        sigmas=sigmas,
        seed=5,
    )
    assert (result.tree.kind[result.tree.step > 0] == 1).all() and not result.log_probs.any()  # all ODE
    start = result.latents[0]
    out = pipe(
        latents=adapter.to_pipeline(start).clone(),
        num_inference_steps=STEPS,
        height=height,
        width=width,
        output_type="latent",
        **embeds,
        **case.options,
        **case.shape,
    )
    out = adapter.from_pipeline(out.frames if hasattr(out, "frames") else out.images, height, width)
    assert pipe.scheduler.sigmas.tolist() == sigmas  # the pipeline ran the adapter's schedule
    ours = result.latents[-1]
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


def adapter_of(case: str, pipeline: Callable[[], Any] | None = None, **options: Any) -> Any:
    """The adapter of a case's pipeline (or ``pipeline()``) on its embeddings and options, updated by ``options``
    (one set to None dropped)."""
    merged = {**embeddings(CASES[case].embeds, seed=0), **CASES[case].options, **options}
    return adapter_for((pipeline or CASES[case].pipeline)(), **{k: v for k, v in merged.items() if v is not None})


def wan_with(**components: Any) -> Any:
    """The tiny Wan2.2 A14B pipeline with these components or config values replaced."""
    pipe = wan.tiny_pipeline(variant="a14b")
    for name, value in components.items():
        if name == "transformer_2":
            pipe.register_modules(transformer_2=value)
        else:
            pipe.register_to_config(**{name: value})
    return pipe


# Bad input: (the call, the start of its one-line ValueError, which names the value).
BAD_INPUT: dict[str, tuple[Callable[[], Any], str]] = {
    "flux-resolution": (
        lambda: adapter_of("flux").latent_shape(64, 40),
        "flux: width = 40: must be a positive multiple of 16",
    ),
    "flux-height": (
        lambda: adapter_of("flux").latent_shape(0, 64),
        "flux: height = 0: must be a positive multiple of 16",
    ),
    "flux-steps": (lambda: adapter_of("flux").sigmas(0, 64, 64), r"flux: steps = 0: must be an integer in \[1, 255\]"),
    "flux-negative": (
        lambda: adapter_of("flux", negative_prompt="x"),
        "flux: a negative prompt was given, but FLUX.1 has no classifier-free guidance",
    ),
    "flux-prompts": (
        lambda: adapter_for(flux.tiny_pipeline(), prompt_embeds=torch.ones(2, 5, 32)),
        "flux: give prompts",
    ),
    "flux-prompt-index": (
        lambda: adapter_of("flux").velocity(torch.zeros(1, 4, 8, 8), 1.0, 0, torch.tensor([2]), None),
        r"flux velocity: prompts \[2\]: the adapter holds 2 prompts",
    ),
    "sd3-cfg-without-negative": (
        lambda: adapter_of("sd3-no-cfg", guidance_scale=7.0),
        "sd3: CFG .* needs negative_prompt_embeds",
    ),
    "wan-ti2v-resolution": (
        lambda: adapter_of("wan2.2-ti2v-cfg").latent_shape(64, 48, num_frames=5),
        r"wan: width = 48: must be a positive multiple of 32 \(the pipeline's 16 and the VAE's factor 16",
    ),
    "wan-negative-without-cfg": (
        lambda: adapter_of("wan2.2-a14b-cfg", guidance_scale=1.0, guidance_scale_2=None),
        r"wan: a negative prompt was given, but guidance_scale = 1.0 runs no CFG",
    ),
    "wan-boundary-above-1": (
        lambda: adapter_of("wan2.2-a14b-cfg", lambda: wan_with(boundary_ratio=1.5)),
        r"wan: boundary_ratio = 1.5: must be in \(0, 1\)",
    ),
    "wan-boundary-0": (
        lambda: adapter_of("wan2.2-a14b-cfg", lambda: wan_with(boundary_ratio=0.0)),
        r"wan: boundary_ratio = 0.0: must be in \(0, 1\)",
    ),
    "wan-boundary-without-transformer_2": (
        lambda: adapter_of("wan2.2-a14b-cfg", lambda: wan_with(transformer_2=None)),
        "wan: boundary_ratio = 0.875 needs transformer_2",
    ),
    "wan-guidance_scale_2-without-boundary": (
        lambda: adapter_of("wan-cfg", guidance_scale_2=3.0),
        "wan: guidance_scale_2 = 3.0: only a pipeline with a boundary_ratio",
    ),
    "wan-guidance_scale_2-without-cfg": (
        lambda: adapter_of("wan2.2-a14b-boundary-on-a-step", guidance_scale_2=3.0),
        "wan: guidance_scale_2 = 3.0 with guidance_scale = 1.0: the pipeline runs CFG",
    ),
    "flux2-resolution": (
        lambda: adapter_of("flux2").latent_shape(64, 40),
        "flux2: width = 40: must be a positive multiple of 16",
    ),
    "flux2-dev-negative": (
        lambda: adapter_of("flux2", negative_prompt_embeds=torch.zeros(PROMPTS, 3, 32)),
        r"flux2: a negative prompt was given, but FLUX.2 \[dev\] has no classifier-free guidance",
    ),
    "flux2-klein-distilled-negative": (
        lambda: adapter_of("flux2-klein", negative_prompt="blurry"),
        r"flux2: a negative prompt was given, but a step-wise distilled FLUX.2 \[klein\]",
    ),
    "flux2-klein-negative-without-cfg": (
        lambda: adapter_of("flux2-klein-base-cfg", guidance_scale=1.0),
        "flux2: a negative prompt was given, but guidance_scale = 1.0 runs no CFG",
    ),
    "flux2-klein-cfg-without-negative": (
        lambda: adapter_of("flux2-klein-base-cfg", negative_prompt_embeds=None),
        r"flux2: CFG \(guidance_scale = 4.0\) needs negative_prompt_embeds",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_bad_input_is_one_line_naming_the_value(name: str) -> None:
    call, message = BAD_INPUT[name]
    with pytest.raises(ValueError, match=f"^{message}") as error:
        call()
    assert "\n" not in str(error.value)


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


def test_a_trainer_iteration_trains_both_wan22_experts() -> None:
    pipe = wan.tiny_pipeline(variant="a14b")
    adapter = adapter_for(
        pipe, gradients=True, guidance_scale=1.0, **embeddings({"prompt_embeds": (PROMPTS, 6, 32)}, 0)
    )
    sigmas = adapter.sigmas(STEPS, 32, 32)
    assert [adapter.expert(s) for s in sigmas[:-1]] == [0, 0, 1, 1]
    parameters = [p for model in adapter.transformers for p in model.parameters()]  # both experts trained
    trainer = branchgrpo.Trainer(
        branchgrpo.Policy(adapter.velocity, torch.optim.SGD(parameters, lr=1e-3)),
        lambda leaves, prompts: -leaves.square().flatten(1).mean(1),
        latent_shape=adapter.latent_shape(32, 32, num_frames=1),
        method=branchgrpo.Method("dance", topology={"group_size": 2}),
        steps=STEPS,
        sigmas=sigmas,
    )
    before = [[p.detach().clone() for p in model.parameters()] for model in adapter.transformers]
    stats = trainer.step([0, 1])
    assert np.isfinite(stats["loss"])
    for model, old in zip(adapter.transformers, before, strict=True):
        assert any(not torch.equal(b, p) for b, p in zip(old, model.parameters(), strict=True))
