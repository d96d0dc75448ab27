#pragma once
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/rollout/value_cut.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// One flag per node: 1 when the edge into that node is trained. Roots are always 0.
using edge_mask = std::vector<std::uint8_t>;

/// What a pruner may read. Pruning acts on back-propagation; a RolloutShaper also shapes the rollout's plan and a
/// RolloutCutter cuts it (the tree then holds stopped nodes: rollout_tree::stop).
struct prune_context {
  int iteration = 0;                          ///< 0-based training iteration
  int total_iterations = 1;                   ///< planned iterations of the run (for "active for the first fraction")
  std::span<const double> leaf_rewards = {};  ///< indexed like tree.leaves()
  std::span<const double> fused = {};         ///< fused reward per node
  std::span<const double> advantages = {};    ///< advantage per node (edge into it)
};

/// A pruner returns the mask of edges to train. Composition intersects masks.
template <class P>
concept Pruner = std::copyable<P> && requires(const P& pruner, const rollout_tree& tree, const prune_context& context) {
  { pruner(tree, context) } -> std::same_as<edge_mask>;
};

/// A pruner that also shapes the rollout (MixGRPO's sliding SDE window turns edges outside it into ODE).
template <class P>
concept RolloutShaper = Pruner<P> && requires(const P& pruner, const tree_plan& plan, int iteration) {
  { pruner.shape(plan, iteration) } -> std::same_as<tree_plan>;
};

/// A pruner that also cuts the rollout: value_prune (pruning/value.hpp) stops sampling the lowest-valued branches.
template <class P>
concept RolloutCutter = Pruner<P> && requires(const P& pruner, const tree_plan& plan, int iteration) {
  { pruner.rollout_cut(plan, iteration) } -> std::same_as<rollout_cut>;
};

/// Every non-root edge, ODE edges included.
inline edge_mask all_edges(const rollout_tree& tree) {
  edge_mask mask(static_cast<std::size_t>(tree.node_count()), 1);
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    if (tree.is_root(n)) mask[static_cast<std::size_t>(n)] = 0;
  return mask;
}

/// Every edge that can be trained: the non-root SDE edges, written into a caller's buffer (every flag is
/// overwritten). Walks the levels of each tree: the roots are depth 0, and the edges into depth d all have
/// kind plan().kinds[d - 1].
/// Example: plan {steps 2, branching {2, 1}, kinds {sde, ode}}, one tree (root 0; 1, 2; leaves 3, 4) ->
///   mask {0, 1, 1, 0, 0}.
/// @pre mask.size() == tree.node_count() (else invalid_input).
/// @post mask[n] == 1 exactly when n is not a root and tree.kind(n) == edge_kind::sde.
inline void trainable_edges(const rollout_tree& tree, std::span<std::uint8_t> mask) {
  require(mask.size() == static_cast<std::size_t>(tree.node_count()), "got room for ", mask.size(), " mask flags for ",
          tree.node_count(), " nodes");
  const std::span<const edge_kind> kinds = tree.plan().kinds;
  for (std::int32_t t = 0; t < tree.tree_count(); ++t)
    for (int d = 0; d <= tree.steps(); ++d) {
      const node_range level = tree.nodes_at_depth(t, d);
      const std::uint8_t flag = d > 0 && kinds[static_cast<std::size_t>(d) - 1] == edge_kind::sde ? 1 : 0;
      std::fill(mask.begin() + level.begin, mask.begin() + level.end, flag);
    }
}

/// Every edge that can be trained: the non-root SDE edges. The mask of "no pruning".
inline edge_mask trainable_edges(const rollout_tree& tree) {
  edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
  trainable_edges(tree, mask);
  return mask;
}

}  // namespace branchgrpo
