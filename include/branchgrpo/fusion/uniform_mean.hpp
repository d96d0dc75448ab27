#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

namespace detail {

/// validate(tree_plan) allows at most 255 steps.
inline constexpr std::size_t max_tree_steps = 255;

/// Throws unless there is one finite reward per leaf of `tree`. Shared by every fusion and by the
/// leaf-reward normalizers.
inline void check_leaf_rewards(const rollout_tree& tree, std::span<const double> leaf_rewards) {
  require(leaf_rewards.size() == static_cast<std::size_t>(tree.leaf_count()), "got ", leaf_rewards.size(),
          " leaf rewards for ", tree.leaf_count(), " leaves");
  for (std::size_t i = 0; i < leaf_rewards.size(); ++i)
    if (!std::isfinite(leaf_rewards[i]))
      fail("leaf reward at leaf position ", i, " (node ", tree.leaves()[i], ") is ", leaf_rewards[i]);
}

/// Writes leaf_rewards (leaves() order) into `per_node` at the leaves' node indices. The leaves of tree t
/// are its deepest level, nodes_at_depth(t, steps), in leaves() order.
inline void copy_leaf_rewards(const rollout_tree& tree, std::span<const double> leaf_rewards,
                              std::span<double> per_node) {
  const node_range leaves = tree.nodes_at_depth(0, tree.steps());
  const auto width = static_cast<std::size_t>(leaves.size());
  for (std::int32_t t = 0; t < tree.tree_count(); ++t)
    std::copy_n(leaf_rewards.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * width), width,
                per_node.begin() + leaves.begin + static_cast<std::ptrdiff_t>(t) * tree.nodes_per_tree());
}

/// One level of one tree in a bottom-up pass: the contiguous `parents`, each with `children` children;
/// the children of node parents.begin + j are first_child + j * children + [0, children).
struct tree_level {
  node_range parents;
  std::int32_t first_child = 0;
  int children = 1;
  int depth = 0;  ///< of the parents; depth == steps - 1 starts a tree (its children are the leaves)
};

/// Calls visit(tree_level) for every depth d < steps of every tree, tree by tree (a tree's nodes are
/// contiguous and stay in cache) and deepest first, so children are done before their parents. Walks the
/// documented layout (tree-major, breadth-first, children contiguous, plan().branching[d] children per
/// node of depth d) without per-node lookups: fusion and normalization run in linear time.
template <class Visit>
void for_each_level_bottom_up(const rollout_tree& tree, Visit&& visit) {
  std::array<node_range, max_tree_steps + 1> levels{};  // the levels of tree 0
  for (int d = 0; d <= tree.steps(); ++d) levels[static_cast<std::size_t>(d)] = tree.nodes_at_depth(0, d);
  const std::span<const int> branching = tree.plan().branching;
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
    const std::int32_t offset = t * tree.nodes_per_tree();
    for (int d = tree.steps() - 1; d >= 0; --d) {
      const node_range parents = levels[static_cast<std::size_t>(d)];
      visit(tree_level{.parents = {offset + parents.begin, offset + parents.end},
                       .first_child = offset + levels[static_cast<std::size_t>(d) + 1].begin,
                       .children = branching[static_cast<std::size_t>(d)],
                       .depth = d});
    }
  }
}

}  // namespace detail

/// The official code's default fusion: a node's reward is the plain mean of the leaf rewards under it
/// (paper Eq. 3 with beta = 0).
/// Example: split_schedule{.split_steps = {0, 1}, .branching = {2}} over 2 steps, one tree (root 0;
///   1, 2 at depth 1; leaves 3, 4 under 1 and 5, 6 under 2), leaf rewards {1, 3, 2, 6} ->
///   {3, 2, 4, 1, 3, 2, 6}  (root (1 + 3 + 2 + 6) / 4, node 1 (1 + 3) / 2, node 2 (2 + 6) / 2).
/// @pre leaf_rewards.size() == tree.leaf_count(), every reward finite.
/// @post result.size() == tree.node_count(); a leaf keeps its own reward exactly; a chain node (one
///   child) has exactly its child's reward.
struct uniform_mean {
  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    detail::check_leaf_rewards(tree, leaf_rewards);
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    detail::copy_leaf_rewards(tree, leaf_rewards, fused);
    // Level-uniform trees: the children of a node hold equally many leaves, so the mean of the children's
    // means is the mean of the leaves. Chain levels are plain copies.
    double* const out = fused.data();
    detail::for_each_level_bottom_up(tree, [out](const detail::tree_level& level) {
      if (level.children == 1) {
        std::copy_n(out + level.first_child, level.parents.size(), out + level.parents.begin);
        return;
      }
      for (std::int32_t j = 0; j < level.parents.size(); ++j) {
        const double* const child = out + level.first_child + j * level.children;
        double sum = 0.0;
        for (int i = 0; i < level.children; ++i) sum += child[i];
        out[level.parents.begin + j] = sum / static_cast<double>(level.children);
      }
    });
    return fused;
  }
  friend bool operator==(const uniform_mean&, const uniform_mean&) = default;
};

}  // namespace branchgrpo
