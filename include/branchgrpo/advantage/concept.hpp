#pragma once
#include <concepts>
#include <span>
#include <vector>

#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// The rewards a normalizer may read: raw leaf rewards (indexed like tree.leaves()) and fused node
/// rewards (indexed by node).
struct reward_view {
  std::span<const double> leaf = {};
  std::span<const double> fused = {};
};

/// An advantage normalizer returns one advantage per node: the advantage of the edge into that node
/// (0 for roots). Stateful normalizers (running statistics) take a non-const call operator.
template <class N>
concept Normalizer = std::copyable<N> && requires(N& normalizer, const rollout_tree& tree, const reward_view& rewards) {
  { normalizer(tree, rewards) } -> std::same_as<std::vector<double>>;
};

}  // namespace branchgrpo
