#pragma once
// Level-by-level passes over a rollout forest, for tree policies that combine children into their parent
// (every fusion, the leaf-advantage spreading of the normalizers) in linear time without per-node lookups.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// One level of one tree in a bottom-up pass: the contiguous `parents`, each with `children` children;
/// the children of node parents.begin + j are first_child + j * children + [0, children).
struct tree_level {
  node_range parents;
  std::int32_t first_child = 0;
  int children = 1;
  int depth = 0;  ///< of the parents; depth == steps - 1 starts a tree (its children are the leaves)
  friend bool operator==(const tree_level&, const tree_level&) = default;
};

/// Calls visit(tree_level) for every depth d < steps of every tree, tree by tree (a tree's nodes are
/// contiguous and stay in cache) and deepest first, so children are done before their parents. Walks the
/// documented layout of rollout_tree (tree-major, breadth-first, children contiguous,
/// plan().branching[d] children per node of depth d).
/// Example: split_schedule{.split_steps = {0, 1}, .branching = {2}} over 2 steps, two trees (7 nodes each:
///   root 0; 1, 2; leaves 3, 4 under 1 and 5, 6 under 2; tree 1 is nodes 7..13) -> visits, in order,
///   {.parents = {1, 3}, .first_child = 3, .children = 2, .depth = 1},
///   {.parents = {0, 1}, .first_child = 1, .children = 2, .depth = 0},
///   {.parents = {8, 10}, .first_child = 10, .children = 2, .depth = 1},
///   {.parents = {7, 8}, .first_child = 8, .children = 2, .depth = 0}.
/// @pre tree.steps() <= max_steps (validate(tree_plan) guarantees it for every rollout_tree).
/// @post visit is called tree.tree_count() * tree.steps() times; every non-root node is the child of
///   exactly one visited level, and a node's level is visited after the level of its children.
template <class Visit>
void for_each_level_bottom_up(const rollout_tree& tree, Visit&& visit) {
  std::array<node_range, max_steps + 1> levels{};  // the levels of tree 0
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

}  // namespace branchgrpo
