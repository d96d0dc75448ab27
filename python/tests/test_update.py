"""The update's stages (edges, transition_log_prob, ppo_loss) against the engine's own log-probs and by hand."""

from __future__ import annotations

import math

import pytest
import torch

import branchgrpo


def iteration(method: str, a: float, dtype=torch.float64):
    def velocity(x, sigma, step, prompts, trees):
        return a * x

    result = branchgrpo.rollout(velocity, method=method, prompts=[0, 1], latent_shape=[2, 3], seed=4, dtype=dtype)
    rewards = branchgrpo.score(result, lambda leaves, prompts: -leaves.square().flatten(1).sum(1))
    credit = branchgrpo.credit(result, rewards)
    return result, credit, branchgrpo.edges(result, credit)


@pytest.mark.parametrize("method", ["dance", "branch", "branch-deppru", "branch-mix"])
def test_recomputed_log_probs_are_the_rollouts(method: str) -> None:
    result, credit, edges = iteration(method, -0.7)
    assert len(edges) == len(credit.trained)
    log_prob = branchgrpo.transition_log_prob(edges, -0.7 * edges.latent)
    assert torch.allclose(log_prob, edges.old_log_prob, rtol=1e-12, atol=1e-12)
    assert torch.equal(edges.step, torch.sort(edges.step).values)  # by step


def test_the_first_steps_loss_is_minus_the_weighted_clipped_advantage_and_its_gradient_is_exact() -> None:
    _, _, edges = iteration("branch", -0.7)
    a = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    loss = branchgrpo.ppo_loss(branchgrpo.transition_log_prob(edges, a * edges.latent), edges)
    clipped = edges.advantage.clamp(-5.0, 5.0)
    assert math.isclose(float(loss.detach()), float(-(edges.weight * clipped).sum()), rel_tol=1e-12, abs_tol=1e-15)
    loss.backward()

    # d loss / d a = -sum w A d log p / d a at r = 1 (inside the clip), by central differences of the log-prob.
    def log_p(value: float) -> torch.Tensor:
        return branchgrpo.transition_log_prob(edges, value * edges.latent)

    h = 1e-6
    derivative = (log_p(-0.7 + h) - log_p(-0.7 - h)) / (2 * h)
    want = float(-(edges.weight * clipped * derivative).sum())
    assert math.isclose(float(a.grad), want, rel_tol=1e-6)


def test_ppo_loss_checks_its_options_by_ppo_options_rules() -> None:
    _, _, edges = iteration("branch", -0.7)
    log_prob = edges.old_log_prob.clone()
    with pytest.raises(ValueError, match=r"loss.clip_range = 1.5: must be in \(0, 1\)"):
        branchgrpo.ppo_loss(log_prob, edges, clip_range=1.5)
    with pytest.raises(ValueError, match="loss.advantage_clip = 0.0"):
        branchgrpo.ppo_loss(log_prob, edges, advantage_clip=0.0)


def test_float32_latents_recompute_within_float_rounding() -> None:
    _, _, edges = iteration("branch", -0.7, dtype=torch.float32)
    log_prob = branchgrpo.transition_log_prob(edges, (-0.7 * edges.latent.to(torch.float64)).to(torch.float32))
    assert torch.allclose(log_prob, edges.old_log_prob, rtol=1e-5, atol=1e-5)


def test_step_weights_are_the_engines() -> None:
    result, credit, plain = iteration("branch", -0.7)
    weighted = branchgrpo.edges(result, credit, step_weight="inverse_dt")

    def sigma(step: int, steps: int = 20, shift: float = 3.0) -> float:  # the shifted linear schedule
        t = 1.0 - step / steps
        return shift * t / (1.0 + (shift - 1.0) * t)

    inverse_dt = torch.tensor([1.0 / (sigma(s) - sigma(s + 1)) for s in weighted.step.tolist()], dtype=torch.float64)
    assert torch.allclose(weighted.weight, plain.weight * inverse_dt, rtol=1e-12, atol=0)
    equal = branchgrpo.edges(result, credit, step_weight="equal_steps")
    per_step = [float(equal.weight[equal.step == s].sum()) for s in range(20)]
    assert max(per_step) - min(per_step) < 1e-12  # every step carries the same total weight
    with pytest.raises(ValueError, match='ppo step_weight "dt" is not none, inverse_dt, noise_std or equal_steps'):
        branchgrpo.edges(result, credit, step_weight="dt")


def test_the_edges_take_the_rollouts_sigmas() -> None:
    sigmas = [1.0, 0.7, 0.45, 0.3, 0.2, 0.12, 0.06, 0.02, 0.0]
    method = branchgrpo.Method("branch", topology={"split_steps": [0, 2], "branching": [2]})
    options = {"prompts": [0, 1], "latent_shape": [3], "method": method, "steps": 8, "dtype": torch.float64}
    result = branchgrpo.rollout(lambda x, *_: -0.7 * x, sigmas=sigmas, **options)
    credit = branchgrpo.credit(result, branchgrpo.score(result, lambda leaves, prompts: -leaves.square().sum(1)))
    edges = branchgrpo.edges(result, credit, step_weight="inverse_dt")
    assert edges.sigma.tolist() == [sigmas[s] for s in edges.step.tolist()]
    plain = branchgrpo.edges(result, credit)
    inverse_dt = torch.tensor([1 / (sigmas[s] - sigmas[s + 1]) for s in edges.step.tolist()], dtype=torch.float64)
    assert torch.allclose(edges.weight, plain.weight * inverse_dt, rtol=1e-12, atol=0)
    log_prob = branchgrpo.transition_log_prob(edges, -0.7 * edges.latent)  # the coefficients are the schedule's
    assert torch.allclose(log_prob, edges.old_log_prob, rtol=1e-12, atol=1e-12)
