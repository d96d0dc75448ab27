"""Method: a named recipe with the run config's sections overriding its components (python/src/method.hpp), and
its normalizer's state saved and restored."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import branchgrpo
from branchgrpo import Method


def pull(x, sigma, step, prompts, trees):
    return -0.5 * x


def run(method, seed=3, iteration=0):
    return branchgrpo.rollout(
        pull, method=method, prompts=[0, 1], latent_shape=[3], seed=seed, iteration=iteration, dtype=torch.float64
    )


def test_a_section_with_the_methods_own_values_changes_nothing() -> None:
    plain = run("branch")
    same = run(Method("branch", correlator={"kind": "correlated", "s": 4.0}, rollout={"stepper": "dance_sde"}))
    for a, b in zip(plain.latents, same.latents, strict=True):
        assert torch.equal(a, b)


def test_overrides_reach_the_rollout_and_the_plan() -> None:
    plain = run("branch")
    weaker = run(Method("branch", correlator={"s": 1.0}))
    assert not torch.equal(plain.latents[-1], weaker.latents[-1])
    assert torch.equal(plain.latents[0], weaker.latents[0])  # the initial noise is keyed alike
    wide = Method("branch", topology={"split_steps": [0, 5], "branching": [4]})
    assert wide.plan(20).leaf_count == 16 and wide.plan(20).branching_steps == [0, 5]
    assert run(wide).tree.node_count == 2 * wide.plan(20).node_count
    pruned = Method("branch", pruning={"pruners": [{"kind": "parent_top_k", "k": 1}]})
    assert pruned.components["pruners"] == ["parent_top_k"]
    result = run(pruned)
    rewards = branchgrpo.score(result, lambda leaves, prompts: leaves.sum(1))
    assert len(branchgrpo.credit(result, rewards).trained) == 2 * 130  # test_trainer.cpp's Parent-Top1 count


@pytest.mark.parametrize(
    ("sections", "error", "message"),
    [
        ({"corelator": {"s": 1.0}}, ValueError, "corelator: unknown section (a Method has: topology, rollout,"),
        ({"correlator": {"s": 0.0, "t": 1}}, ValueError, "correlator.t: unknown key (correlated has: s)"),
        ({"correlator": {"kind": "scaled", "s": 2.0}}, ValueError, "correlator.s: unknown key (scaled has: scale)"),
        ({"correlator": {"kind": "gaussian"}}, ValueError, "correlator.kind = 'gaussian': must be "),
        ({"correlator": {"s": "big"}}, TypeError, "correlator.s = 'big': must be a number"),
        ({"correlator": 4.0}, TypeError, "correlator = 4.0: must be a dict of its keys"),
        ({"topology": {"branching": [0]}}, ValueError, "topology.branching"),
        ({"pruning": {"pruners": [{"k": 1}]}}, ValueError, "pruning.pruners[0]: needs a kind (keep_all, parent_top_k"),
        ({"pruning": {"active_fraction": 1.5}}, ValueError, "pruning.active_fraction = 1.5: must be in [0, 1]"),
        ({"pruning": {"window": 2}}, ValueError, "pruning.window: unknown key (pruning has: active_fraction, pruners)"),
        ({"rollout": {"shift": 2.0}}, ValueError, "rollout.shift: is rollout()'s argument, not a Method key"),
        ({"objective": {"kind": "nft", "beta": -1.0}}, ValueError, "objective.beta = -1"),
        ({"objective": {"kind": "dppo", "kl_threshold": 0.0}}, ValueError, "objective.kl_threshold = 0"),
        ({"advantage": {"per_reward": 1}}, TypeError, "advantage.per_reward = 1: must be True or False"),
    ],
)
def test_a_bad_section_is_one_error_naming_the_key(sections, error, message) -> None:
    with pytest.raises(error) as raised:
        Method("branch", **sections)
    assert str(raised.value).startswith(message), str(raised.value)


def test_an_unknown_method_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown method 'grpo'"):
        Method("grpo")
    with pytest.raises(TypeError, match="method = 3: must be a method name or a Method"):
        run(3)


def iterate(method: Method, iteration: int) -> np.ndarray:
    result = run(method, iteration=iteration)
    rewards = branchgrpo.score(result, lambda leaves, prompts: leaves.square().sum(1) + iteration)
    return branchgrpo.credit(result, rewards, iteration=iteration, total_iterations=4).advantages


def test_a_restored_normalizer_state_continues_as_an_uninterrupted_run() -> None:
    sections = {"advantage": {"kind": "per_prompt_running", "history": 40}}
    straight = Method("dance", **sections)
    expected = [iterate(straight, i) for i in range(3)]

    first = Method("dance", **sections)
    iterate(first, 0)
    iterate(first, 1)
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    assert sorted(state["normalizer"]) == ["prompt.0", "prompt.1"]
    assert state["normalizer"]["prompt.0"].shape == (32,)  # two iterations of 16 leaves, within the history of 40

    resumed = Method("dance", **sections)
    resumed.load_state_dict(state)
    assert np.array_equal(iterate(resumed, 2), expected[2])
    assert not np.array_equal(iterate(Method("dance", **sections), 2), expected[2])  # the state matters


def test_a_state_of_another_method_is_refused() -> None:
    state = Method("dance", advantage={"kind": "per_prompt_running"}).state_dict()
    with pytest.raises(ValueError, match="the state is of Method\\('dance', advantage="):
        Method("dance").load_state_dict(state)
    with pytest.raises(ValueError, match="the state has no 'normalizer'"):
        Method("dance").load_state_dict({"name": "dance", "sections": {}})
    bad = Method("dance", advantage={"kind": "per_prompt_running"})
    with pytest.raises(ValueError, match="prompt"):
        bad.load_state({"p0": [1.0]})
