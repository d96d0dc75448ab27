#pragma once
// Per-leaf values on a rollout forest (leaf rewards, leaf advantages), indexed like tree.leaves(): checking
// them, placing them at their nodes, and averaging them up the tree. Shared by the fusions and the
// leaf-reward normalizers.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Throws invalid_input unless there is one finite reward per leaf of `tree`.
/// Example: a forest of 4 leaves (leaves() == {3, 4, 5, 6}): {1, 3, 2, 6} passes; {1, 3} throws
///   "got 2 leaf rewards for 4 leaves"; {1, NaN, 2, 6} throws "leaf reward at leaf position 1 (node 4) is nan".
/// @pre none.
/// @post leaf_rewards.size() == tree.leaf_count() and every reward is finite (else invalid_input).
inline void check_leaf_rewards(const rollout_tree& tree, std::span<const double> leaf_rewards) {
  require(leaf_rewards.size() == static_cast<std::size_t>(tree.leaf_count()), "got ", leaf_rewards.size(),
          " leaf rewards for ", tree.leaf_count(), " leaves");
  for (std::size_t i = 0; i < leaf_rewards.size(); ++i)
    if (!std::isfinite(leaf_rewards[i]))
      fail("leaf reward at leaf position ", i, " (node ", tree.leaves()[i], ") is ", leaf_rewards[i]);
}

/// Writes leaf_rewards (leaves() order) into `per_node` at the leaves' node indices; other nodes are left
/// as they are. The leaves of tree t are its deepest level, nodes_at_depth(t, steps), in leaves() order.
/// Example: the 7-node tree of split_schedule{.split_steps = {0, 1}, .branching = {2}} over 2 steps
///   (leaves 3, 4, 5, 6), leaf rewards {1, 3, 2, 6}, per_node all 0 -> {0, 0, 0, 1, 3, 2, 6}.
/// @pre leaf_rewards.size() == tree.leaf_count(), per_node.size() == tree.node_count() (else invalid_input).
/// @post per_node[tree.leaves()[i]] == leaf_rewards[i] for every i.
inline void copy_leaf_rewards(const rollout_tree& tree, std::span<const double> leaf_rewards,
                              std::span<double> per_node) {
  require(leaf_rewards.size() == static_cast<std::size_t>(tree.leaf_count()), "got ", leaf_rewards.size(),
          " leaf rewards for ", tree.leaf_count(), " leaves");
  require(per_node.size() == static_cast<std::size_t>(tree.node_count()), "got room for ", per_node.size(),
          " node values for ", tree.node_count(), " nodes");
  const node_range leaves = tree.nodes_at_depth(0, tree.steps());
  const auto width = static_cast<std::size_t>(leaves.size());
  for (std::int32_t t = 0; t < tree.tree_count(); ++t)
    std::copy_n(leaf_rewards.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * width), width,
                per_node.begin() + leaves.begin + static_cast<std::ptrdiff_t>(t) * tree.nodes_per_tree());
}

/// Every node's mean of the leaf values under it (a leaf: exactly its own value), written into `means`, which
/// a caller may reuse across calls (every element is overwritten). Level-uniform trees give every child of a
/// node equally many leaves, so the mean of the children's means is the mean of the leaves; a chain node (one
/// child) copies its child exactly. Values are not checked for finiteness.
/// Example: the 7-node tree of copy_leaf_rewards, leaf values {1, 3, 2, 6} -> means {3, 2, 4, 1, 3, 2, 6}
///   (root (1 + 3 + 2 + 6) / 4, node 1 (1 + 3) / 2, node 2 (2 + 6) / 2).
/// @pre leaf_values.size() == tree.leaf_count(), means.size() == tree.node_count() (else invalid_input);
///   means does not overlap leaf_values.
/// @post means[n] == the mean of leaf_values over tree.leaves_under(n), for every node n.
inline void mean_of_leaves_under(const rollout_tree& tree, std::span<const double> leaf_values,
                                 std::span<double> means) {
  copy_leaf_rewards(tree, leaf_values, means);
  double* const out = means.data();
  for_each_level_bottom_up(tree, [out](const tree_level& level) {
    if (level.children == 1) {  // a chain level: a plain loop (a call to memmove costs more than 16 copies)
      const double* const child = out + level.first_child;
      double* const parent = out + level.parents.begin;
      for (std::int32_t j = 0; j < level.parents.size(); ++j) parent[j] = child[j];
      return;
    }
    if (level.children == 2) {  // the common split: the same sum and division as the general loop
      for (std::int32_t j = 0; j < level.parents.size(); ++j) {
        const double* const child = out + level.first_child + 2 * j;
        double sum = 0.0;
        sum += child[0];
        sum += child[1];
        out[level.parents.begin + j] = sum / 2.0;
      }
      return;
    }
    for (std::int32_t j = 0; j < level.parents.size(); ++j) {
      const double* const child = out + level.first_child + j * level.children;
      double sum = 0.0;
      for (int i = 0; i < level.children; ++i) sum += child[i];
      out[level.parents.begin + j] = sum / static_cast<double>(level.children);
    }
  });
}

/// Every node's mean of the leaf values under it, in a new vector (see the overload above, which it calls).
/// Example: the 7-node tree of copy_leaf_rewards, leaf values {1, 3, 2, 6} -> {3, 2, 4, 1, 3, 2, 6}
///   (root (1 + 3 + 2 + 6) / 4, node 1 (1 + 3) / 2, node 2 (2 + 6) / 2).
/// @pre leaf_values.size() == tree.leaf_count() (else invalid_input).
/// @post result.size() == tree.node_count(); result[n] == the mean of leaf_values over tree.leaves_under(n).
inline std::vector<double> mean_of_leaves_under(const rollout_tree& tree, std::span<const double> leaf_values) {
  std::vector<double> means(static_cast<std::size_t>(tree.node_count()));
  mean_of_leaves_under(tree, leaf_values, means);
  return means;
}

/// Per-edge advantages from per-leaf ones: every edge takes the mean advantage of the leaves under it (one
/// leaf: exactly its advantage); roots, which have no edge, get 0. The leaf-reward normalizers (leaf_group,
/// per_prompt_running) end with it.
/// Example: the 7-node tree of copy_leaf_rewards, leaf advantages {-0.9, 0, -0.5, 1.4} ->
///   {0, -0.45, 0.45, -0.9, 0, -0.5, 1.4}.
/// @pre leaf_advantages.size() == tree.leaf_count(), every value finite (else invalid_input, worded as
///   check_leaf_rewards).
/// @post result.size() == tree.node_count(); roots 0; result[n] == mean_of_leaves_under(tree,
///   leaf_advantages)[n] for every other node.
inline std::vector<double> spread_leaf_advantages(const rollout_tree& tree, std::span<const double> leaf_advantages) {
  check_leaf_rewards(tree, leaf_advantages);
  std::vector<double> advantages = mean_of_leaves_under(tree, leaf_advantages);
  for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
    const node_range roots = tree.nodes_at_depth(t, 0);
    for (std::int32_t n = roots.begin; n < roots.end; ++n) advantages[static_cast<std::size_t>(n)] = 0.0;
  }
  return advantages;
}

}  // namespace branchgrpo
