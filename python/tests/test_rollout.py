"""rollout(): the C++ engine on torch latents, held to the core's host engine (python/src/module.cpp,
_linear_reference: the same rollout on host_backend with v = a x computed in C++)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import branchgrpo
from branchgrpo import _core


def reference(method, a: float, prompts, latent, steps=20, seed=0, iteration=0, max_batch=64, sigmas=()):
    return _core._linear_reference(
        branchgrpo.Method(method) if isinstance(method, str) else method,
        a,
        list(prompts),
        list(latent),
        steps,
        3.0,
        seed,
        iteration,
        max_batch,
        list(sigmas),
    )


@pytest.mark.parametrize("method", ["dance", "branch", "branch-widpru", "branch-mix", "branch-mix-flash"])
def test_float64_rollout_is_the_host_engine_bit_for_bit(method: str) -> None:
    def velocity(x, sigma, step, prompts, trees):
        return -0.5 * x

    got = branchgrpo.rollout(
        velocity,
        method=method,
        prompts=[3, 1],
        latent_shape=[2, 3, 3],
        seed=7,
        iteration=5,
        max_batch=5,
        dtype=torch.float64,
    )
    want = reference(method, -0.5, [3, 1], [2, 3, 3], seed=7, iteration=5, max_batch=5)
    assert len(got.latents) == len(want) == 21
    for step, (latents, expected) in enumerate(zip(got.latents, want, strict=True)):
        assert latents.dtype == torch.float64
        assert np.array_equal(latents.numpy().reshape(-1), np.array(expected)), (method, step)


# A schedule of a diffusers pipeline's kind: FLUX's dynamic shift (mu 0.8) of linspace(1, 1/8, 8), then 0.
PIPELINE_SIGMAS = [float(np.exp(0.8) / (np.exp(0.8) + 1 / s - 1)) for s in np.linspace(1.0, 1 / 8, 8)] + [0.0]


def test_given_sigmas_are_the_schedule_of_the_rollout() -> None:
    def velocity(x, sigma, step, prompts, trees):
        seen.append((step, sigma))
        return -0.5 * x

    seen: list[tuple[int, float]] = []
    method = branchgrpo.Method("branch-mix", topology={"split_steps": [0, 2, 5], "branching": [2]})
    options = {"prompts": [3, 1], "latent_shape": [2, 3], "seed": 7, "steps": 8, "dtype": torch.float64}
    got = branchgrpo.rollout(velocity, method=method, sigmas=PIPELINE_SIGMAS, **options)
    want = reference(method, -0.5, [3, 1], [2, 3], steps=8, seed=7, sigmas=PIPELINE_SIGMAS)
    for latents, expected in zip(got.latents, want, strict=True):  # the host engine on the same schedule
        assert np.array_equal(latents.numpy().reshape(-1), np.array(expected))
    assert got.sigmas.tolist() == PIPELINE_SIGMAS
    assert {sigma for step, sigma in seen} == set(PIPELINE_SIGMAS[:-1]) and all(
        sigma == PIPELINE_SIGMAS[step] for step, sigma in seen
    )
    linear = branchgrpo.rollout(lambda x, *_: -0.5 * x, method=method, **options)
    same = branchgrpo.rollout(lambda x, *_: -0.5 * x, method=method, sigmas=linear.sigmas, **options)
    assert all(torch.equal(a, b) for a, b in zip(linear.latents, same.latents, strict=True))
    assert not torch.equal(linear.latents[-1], got.latents[-1])


@pytest.mark.parametrize(
    ("sigmas", "error", "message"),
    [
        ([1.0, 0.5], ValueError, "rollout: sigmas has 2 values: must have steps + 1 = 3"),
        ([1.0, 0.5, 0.1], ValueError, "rollout: sigmas[2] = 0.1: the schedule must end at 0"),
        ([1.5, 0.5, 0.0], ValueError, "rollout: sigmas[0] = 1.5: must be in [0, 1]"),
        ([1.0, 1.0, 0.0], ValueError, "rollout: sigmas[1] = 1.0: must be below sigmas[0] = 1.0"),
        ([1.0, float("nan"), 0.0], ValueError, "rollout: sigmas[1] = nan: must be in [0, 1]"),
        ("1, 0", TypeError, "rollout: sigmas = '1, 0': must be a sequence of numbers"),
        ([[1.0, 0.5, 0.0]], TypeError, "rollout: sigmas = [[1.0, 0.5, 0.0]]: must be a sequence of numbers"),
    ],
)
def test_bad_sigmas_are_one_exception_naming_the_value(sigmas, error, message) -> None:
    with pytest.raises(error) as raised:
        branchgrpo.rollout(lambda x, *_: x, prompts=[0], latent_shape=[2], method="dance", steps=2, sigmas=sigmas)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value), str(raised.value)


def test_float32_rollout_agrees_to_float_rounding() -> None:
    got = branchgrpo.rollout(lambda x, *_: 0.25 * x, prompts=[0, 1, 2], latent_shape=[4, 2, 2])
    want = reference("branch", 0.25, [0, 1, 2], [4, 2, 2])
    leaves = got.latents[-1].to(torch.float64).numpy().reshape(-1)
    assert got.latents[-1].dtype == torch.float32
    assert np.allclose(leaves, want[-1], rtol=1e-5, atol=1e-6)


def test_frontier_batches_rows_prompts_and_keys() -> None:
    calls = []

    def velocity(x, sigma, step, prompts, trees):
        calls.append((step, x.shape[0], prompts.tolist(), trees.tolist(), sigma))
        return torch.zeros_like(x)

    plan = branchgrpo.method_plan("branch", 20)
    got = branchgrpo.rollout(velocity, prompts=[4, 9], latent_shape=[2], max_batch=6)
    assert got.evaluations == 2 * plan.evaluations == sum(rows for _, rows, *_ in calls)
    assert got.denoiser_calls == len(calls)
    assert all(rows <= 6 for _, rows, *_ in calls)
    # Step 0: the two roots in one call, tree 0 with prompt 4 and tree 1 with prompt 9, at sigma 1.
    assert calls[0] == (0, 2, [4, 9], [0, 1], 1.0)
    # Step 10: 16 nodes per tree, 32 rows, in calls of 6 at most (6 + 6 + 6 + 6 + 6 + 2).
    assert [rows for step, rows, *_ in calls if step == 10] == [6, 6, 6, 6, 6, 2]
    tree = got.tree
    assert got.log_probs.shape == (tree.node_count,)
    sde = tree.parent >= 0
    assert np.all(np.isfinite(got.log_probs)) and np.all(got.log_probs[~sde] == 0) and np.all(got.edge_std[sde] > 0)


def test_same_key_same_noise_other_iteration_other_noise() -> None:
    def run(iteration: int) -> torch.Tensor:
        return branchgrpo.rollout(lambda x, *_: -x, prompts=[0], latent_shape=[3], iteration=iteration).latents[-1]

    assert torch.equal(run(2), run(2))
    assert not torch.equal(run(2), run(3))


def nan_rows(x, sigma, step, prompts, trees):
    v = torch.zeros_like(x)
    if step == 3:
        v[1] = float("nan")
    return v


@pytest.mark.parametrize(
    ("velocity", "error", "message"),
    [
        (lambda x, *_: x[:1], ValueError, "velocity at iteration 0, step 0 (2 rows): returned shape (1, 2)"),
        (lambda x, *_: x.double(), ValueError, "returned dtype torch.float64, the latents are torch.float32"),
        (lambda x, *_: x.numpy(), TypeError, "returned ndarray, not a torch.Tensor"),
        (lambda x, *_: torch.zeros_like(x, device="meta"), ValueError, "returned a tensor on meta"),
        (nan_rows, ValueError, "velocity at iteration 0, step 3 (4 rows): NaN or inf in rows 1"),
    ],
)
def test_a_bad_velocity_is_one_exception_naming_the_step(velocity, error, message) -> None:
    with pytest.raises(error) as raised:
        branchgrpo.rollout(velocity, prompts=[0, 1], latent_shape=[2])
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"prompts": [-1]}, ValueError, "rollout: prompts = [-1]: every value must be at least 0"),
        ({"prompts": [0], "latent_shape": [0]}, ValueError, "latent_shape = [0]"),
        ({"prompts": [0], "steps": 0}, ValueError, "rollout: steps = 0: must be in [1, 255]"),
        ({"prompts": [0], "max_batch": 0}, ValueError, "rollout: max_batch = 0"),
        ({"prompts": [0], "dtype": torch.int64}, TypeError, "rollout: dtype = torch.int64"),
        ({"prompts": [0], "method": "grpo"}, ValueError, "grpo"),
        ({"prompts": [], "method": "branch"}, ValueError, "rollout: prompts is empty"),
        ({"prompts": [0], "steps": 5}, ValueError, "split step 6 is not in [0, 5)"),
        ({"prompts": [0], "device": "meta"}, ValueError, "rollout: device = 'meta': the engine reads the latents'"),
    ],
)
def test_bad_arguments_are_one_exception_naming_the_value(arguments, error, message) -> None:
    arguments.setdefault("latent_shape", [2])
    with pytest.raises(error) as raised:
        branchgrpo.rollout(lambda x, *_: x, **arguments)
    assert message in str(raised.value)


def test_an_exception_in_the_velocity_reaches_the_caller_and_never_crashes() -> None:
    code = """
import branchgrpo, torch
def velocity(x, sigma, step, prompts, trees):
    if step == 4:
        raise KeyError("the user's own error")
    return -x
try:
    branchgrpo.rollout(velocity, prompts=[0, 1], latent_shape=[2, 2])
except KeyError as e:
    print("caught", e)
r = branchgrpo.rollout(lambda x, *_: -x, prompts=[0], latent_shape=[2])
print(r.evaluations)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["caught", '"the', "user's", "own", 'error"', "203"]
