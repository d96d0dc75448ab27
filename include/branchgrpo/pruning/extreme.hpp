#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// BranchGRPO WidPru, Extreme-b: per tree, train only the chains of the b best and the b worst leaves
/// (raw leaf reward) below the last split depth L: an edge of edge depth >= L is kept when it lies on the
/// path of a kept leaf; edges above the last split (edge depth < L) are all kept. Without splits every
/// edge has edge depth >= L, so whole chains are selected (DanceGRPO-style groups of separate roots).
/// If 2b >= the leaves of a tree, the tree keeps every edge. Ties: the lower leaf position ranks higher.
/// ODE edges are never trained.
///
/// Example: tree {steps 4, splits {0, 2}, K 2} (nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12, L = 2, leaf
/// 9 + i under node 5 + i) with leaf rewards {0.1, 0.5, 0.9, 0.3} and extreme{.b = 1}:
///   best leaf 11 (0.9), worst leaf 9 (0.1) -> chains 7 -> 11 and 5 -> 9
///   -> mask {0, 1,1, 1,1, 1,0,1,0, 1,0,1,0};  extreme{.b = 2} (2b = 4 leaves) -> every edge.
/// @pre b >= 1; context.leaf_rewards has one finite value per leaf (indexed like tree.leaves()).
/// @post mask[n] == 1 only for a non-root SDE edge.
struct extreme {
  int b = 1;

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    require(b >= 1, "extreme b ", b, " is below 1");
    require(context.leaf_rewards.size() == static_cast<std::size_t>(tree.leaf_count()), "extreme got ",
            context.leaf_rewards.size(), " leaf rewards for ", tree.leaf_count(), " leaves");
    for (std::size_t i = 0; i < context.leaf_rewards.size(); ++i)
      require(std::isfinite(context.leaf_rewards[i]), "extreme leaf reward ", i, " is ", context.leaf_rewards[i]);

    const int last = tree.last_split_depth();
    const std::int32_t per_tree = tree.leaves_per_tree();
    const auto leaves = tree.leaves();
    std::vector<std::uint8_t> selected(static_cast<std::size_t>(tree.node_count()), 0);
    std::vector<std::int32_t> order(static_cast<std::size_t>(per_tree));
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
      const std::int32_t first = t * per_tree;  // leaves of tree t are a contiguous run of leaves()
      std::iota(order.begin(), order.end(), first);
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t c) {
        return context.leaf_rewards[static_cast<std::size_t>(a)] > context.leaf_rewards[static_cast<std::size_t>(c)];
      });
      const bool all = 2 * static_cast<std::int64_t>(b) >= per_tree;
      for (std::int32_t i = 0; i < per_tree; ++i) {
        if (!all && i >= b && i < per_tree - b) continue;
        // Walk up while the edge into `node` has edge depth >= last, i.e. depth(node) > last.
        for (std::int32_t node = leaves[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
             !tree.is_root(node) && tree.depth(node) > last; node = tree.parent(node))
          selected[static_cast<std::size_t>(node)] = 1;
      }
    }
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      if (tree.is_root(n) || tree.kind(n) != edge_kind::sde) continue;
      const bool above = tree.depth(n) <= last;
      mask[static_cast<std::size_t>(n)] = above || selected[static_cast<std::size_t>(n)] ? 1 : 0;
    }
    return mask;
  }

  friend bool operator==(const extreme&, const extreme&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "extreme", summary = "width: the b best and b worst leaves of each tree";
  static constexpr auto parameters() {
    return std::tuple{parameter("b", &extreme::b, "best and worst leaves kept per tree", rules::at_least{1})};
  }
};

}  // namespace branchgrpo
