#pragma once
#include <concepts>
#include <span>
#include <variant>
#include <vector>

#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// A fusion weighting turns leaf rewards (indexed like tree.leaves()) into a reward for every node
/// (indexed by node; a leaf's fused reward is its own reward). It reads edge log-probs from the tree.
template <class F>
concept Fusion = std::regular<F> &&
    requires(const F& fusion, const rollout_tree& tree, std::span<const double> leaf_rewards) {
  { fusion(tree, leaf_rewards) } -> std::same_as<std::vector<double>>;
};

/// Whether a fusion reads node values (rollout_tree::value), so that the rollout must value every evaluated step:
/// true for a fusion with `static constexpr bool needs_node_values = true` (step_gain), or a run-time choice holding
/// one (any_policy: its `policy` variant).
/// Example: needs_node_values(step_gain{}) == true; needs_node_values(uniform_mean{}) == false.
template <class F>
bool needs_node_values(const F& fusion) {
  if constexpr (requires { fusion.policy.index(); })
    return std::visit([](const auto& held) { return needs_node_values(held); }, fusion.policy);
  else if constexpr (requires { F::needs_node_values; })
    return F::needs_node_values;
  else
    return false;
}

}  // namespace branchgrpo
