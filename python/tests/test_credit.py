"""score() and credit(): the leaf rewards and the method's credit, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import branchgrpo


def pull(x, sigma, step, prompts, trees):
    return -x


def test_dance_advantages_are_each_prompt_groups_z_scores() -> None:
    # DanceGRPO's leaf_group: A = (r - mean) / (unbiased std + 1e-8) over the leaves of one prompt; every edge on a
    # chain gets its leaf's advantage (the shared root's first step: the mean of its 16 chains', 0).
    result = branchgrpo.rollout(pull, method="dance", prompts=[5, 7], latent_shape=[3], seed=1)
    rewards = branchgrpo.score(result, lambda leaves, prompts: leaves.sum(1) + prompts)
    tree = result.tree
    credit = branchgrpo.credit(result, rewards)
    assert credit.kept_trees.tolist() == [0, 1]
    for t in range(2):
        r = rewards[16 * t : 16 * (t + 1)]
        want = (r - r.mean()) / (r.std(ddof=1) + 1e-8)
        leaves = tree.leaves[16 * t : 16 * (t + 1)]
        assert np.allclose(credit.advantages[leaves], want, rtol=1e-12, atol=1e-12)
        # The chain's first edge below the root carries the same advantage as its leaf.
        firsts = [
            node for node in range(tree.nodes_per_tree * t, tree.nodes_per_tree * (t + 1)) if tree.step[node] == 1
        ]
        assert np.allclose(credit.advantages[firsts], want, rtol=1e-12, atol=1e-12)
    assert len(credit.trained) == 2 * 320  # every SDE edge: 16 chains x 20 steps per tree
    assert np.count_nonzero(credit.edge_advantage) <= 2 * 320


def test_groupwise_rewards_see_each_leafs_tree() -> None:
    result = branchgrpo.rollout(pull, prompts=[2, 2, 3], latent_shape=[2])
    seen = {}

    def rank_in_tree(leaves, prompts, groups):
        seen["prompts"], seen["groups"] = prompts.tolist(), groups.tolist()
        return torch.arange(leaves.shape[0], dtype=torch.float64) % 16

    rewards = branchgrpo.score(result, rank_in_tree, groupwise=True)
    assert seen["groups"] == [t for t in range(3) for _ in range(16)]
    assert seen["prompts"] == [2] * 32 + [3] * 16
    assert rewards.tolist() == [float(i % 16) for i in range(48)]


def test_a_nan_reward_drops_its_tree_as_the_trainer_does() -> None:
    result = branchgrpo.rollout(pull, prompts=[0, 1], latent_shape=[2])
    rewards = np.arange(32, dtype=np.float64)
    rewards[20] = np.nan
    credit = branchgrpo.credit(result, rewards)
    assert credit.kept_trees.tolist() == [0]
    assert all(node < result.tree.nodes_per_tree for node in credit.trained.tolist())


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (lambda leaves, prompts: leaves.sum(1)[:3], "reward returned 3 scores for 16 leaves"),
        (lambda leaves, prompts: leaves.sum(1) / 0 * 0, "reward returned NaN or inf for leaves 0, 1, 2"),
    ],
)
def test_a_bad_reward_is_one_exception(reward, message) -> None:
    result = branchgrpo.rollout(pull, prompts=[0], latent_shape=[2])
    with pytest.raises(ValueError) as raised:
        branchgrpo.score(result, reward)
    assert message in str(raised.value)


def test_bad_credit_input() -> None:
    result = branchgrpo.rollout(pull, prompts=[0], latent_shape=[2])
    with pytest.raises(ValueError, match="reward returned 3 scores for 16 leaves"):
        branchgrpo.credit(result, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="every tree has a non-finite leaf reward"):
        branchgrpo.credit(result, [float("nan")] * 16)
    with pytest.raises(ValueError, match="iteration = 3, total_iterations = 2"):
        branchgrpo.credit(result, [1.0] * 16, iteration=3, total_iterations=2)


def z_scores(r: np.ndarray) -> np.ndarray:
    return (r - r.mean()) / (r.std(ddof=1) + 1e-8)


def test_per_reward_advantages_normalize_each_part_on_its_own() -> None:
    # MixGRPO's advantage_aggr as the config's [advantage] per_reward = true: each part's leaf_group z-scores, summed
    # with the parts' weights.
    method = branchgrpo.Method("dance", advantage={"per_reward": True})
    result = branchgrpo.rollout(pull, method=method, prompts=[5, 7], latent_shape=[3], seed=2)

    def reward(leaves, prompts):
        return {"sum": leaves.sum(1), "first": (0.25, leaves[:, 0].square())}

    rewards = branchgrpo.score(result, reward)
    total = rewards.components["sum"][1] + 0.25 * rewards.components["first"][1]
    assert np.allclose(rewards, total, rtol=0, atol=1e-15)
    credit = branchgrpo.credit(result, rewards)
    leaves = result.tree.leaves
    for t in range(2):
        part = slice(16 * t, 16 * (t + 1))
        want = z_scores(rewards.components["sum"][1][part]) + 0.25 * z_scores(rewards.components["first"][1][part])
        assert np.allclose(credit.advantages[leaves[part]], want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="per_reward"):
        branchgrpo.credit(result, np.asarray(rewards))  # no parts to normalize


def test_win_rates_rank_each_leaf_within_its_tree() -> None:
    result = branchgrpo.rollout(pull, method="dance", prompts=[0, 1], latent_shape=[3], seed=2)
    values = np.arange(32, dtype=np.float64) % 16  # leaf i of each tree beats the i lower ones
    values[3] = values[4] = 4.0  # a tie in tree 0: each counts a half
    rewards = branchgrpo.score(result, lambda leaves, prompts: torch.from_numpy(values), win_rate=True)
    want = np.concatenate([np.arange(16), np.arange(16)]) / 15.0
    want[3] = want[4] = 3.5 / 15.0
    assert np.allclose(rewards, want, rtol=0, atol=1e-15)


def test_a_bad_part_names_it() -> None:
    result = branchgrpo.rollout(pull, method="dance", prompts=[0], latent_shape=[3])
    with pytest.raises(ValueError, match="reward, part 'b', returned NaN or inf for leaves 0"):
        branchgrpo.score(result, lambda leaves, prompts: {"a": leaves.sum(1), "b": leaves.sum(1) / 0.0})
    with pytest.raises(TypeError, match="part 'a' must be named by a string and weighted by a number"):
        branchgrpo.score(result, lambda leaves, prompts: {"a": ("heavy", leaves.sum(1))})
