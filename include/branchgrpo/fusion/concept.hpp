#pragma once
#include <concepts>
#include <span>
#include <vector>

#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// A fusion weighting turns leaf rewards (indexed like tree.leaves()) into a reward for every node
/// (indexed by node; a leaf's fused reward is its own reward). It reads edge log-probs from the tree.
template <class F>
concept Fusion = std::regular<F> && requires(const F& fusion, const rollout_tree& tree,
                                             std::span<const double> leaf_rewards) {
  { fusion(tree, leaf_rewards) } -> std::same_as<std::vector<double>>;
};

}  // namespace branchgrpo
