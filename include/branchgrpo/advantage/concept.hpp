#pragma once
#include <concepts>
#include <span>
#include <string_view>
#include <vector>

#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// One part of a reward made of weighted parts, at the leaves: its weight and its unweighted leaf scores (indexed
/// like tree.leaves()). The reward is sum_c weight_c leaf_c.
struct leaf_component {
  std::string_view name = {};
  double weight = 1.0;
  std::span<const double> leaf = {};
};

/// The rewards a normalizer may read: raw leaf rewards (indexed like tree.leaves()), fused node rewards (indexed
/// by node), and, when the reward reports its parts, each part's leaf scores (per_reward normalizes each on its
/// own; other normalizers read the total).
struct reward_view {
  std::span<const double> leaf = {};
  std::span<const double> fused = {};
  std::span<const leaf_component> components = {};
};

/// An advantage normalizer returns one advantage per node: the advantage of the edge into that node
/// (0 for roots). Stateful normalizers (running statistics) take a non-const call operator.
template <class N>
concept Normalizer = std::copyable<N> && requires(N& normalizer, const rollout_tree& tree, const reward_view& rewards) {
  { normalizer(tree, rewards) } -> std::same_as<std::vector<double>>;
};

}  // namespace branchgrpo
