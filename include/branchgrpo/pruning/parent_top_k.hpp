#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// BranchGRPO WidPru, Parent-Top-k (the paper's Parent-Top1 with k = 1): below the last split depth L,
/// train only the subtrees of the k best children of each parent at depth L, ranked by the child's fused
/// reward (ties: the lower sibling rank wins). A kept subtree keeps every edge in it, the parent -> child
/// edge included; edges above the last split (edge depth < L) are all kept. Without any split, or with
/// k >= K, every SDE edge is kept. ODE edges are never trained.
///
/// Example: tree {steps 4, splits {0, 2}, K 2} (nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12, L = 2, parents
/// 3 -> {5, 6}, 4 -> {7, 8}, leaf 9 + i under node 5 + i) with fused[5..8] = {0.2, 0.7, 0.5, 0.5}:
///   parent_top_k{.k = 1} keeps child 6 (0.7 > 0.2) and child 7 (tie with 8, lower rank)
///   -> mask {0, 1,1, 1,1, 0,1,1,0, 0,1,1,0};  parent_top_k{.k = 2} -> every edge.
/// @pre k >= 1; context.fused has one finite value per node (only the children of depth-L parents are read).
/// @post mask[n] == 1 only for a non-root SDE edge.
struct parent_top_k {
  int k = 1;

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    require(k >= 1, "parent_top_k k ", k, " is below 1");
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
    const int last = tree.last_split_depth();
    if (last < 0) return trainable_edges(tree);
    require(context.fused.size() == static_cast<std::size_t>(tree.node_count()), "parent_top_k got ",
            context.fused.size(), " fused rewards for ", tree.node_count(), " nodes");

    // selected[n]: n lies in a kept subtree (or above the split). Parents precede children in node order.
    std::vector<std::uint8_t> selected(static_cast<std::size_t>(tree.node_count()), 0);
    std::vector<std::int32_t> order;
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
      const auto parents = tree.nodes_at_depth(t, last);
      for (std::int32_t p = parents.begin; p < parents.end; ++p) {
        const auto children = tree.children(p);
        order.clear();
        for (std::int32_t c = children.begin; c < children.end; ++c) {
          const double value = context.fused[static_cast<std::size_t>(c)];
          require(std::isfinite(value), "parent_top_k fused reward ", c, " is ", value);
          order.push_back(c);
        }
        // Children are stored in sibling-rank order: ties go to the lower node index, the lower rank.
        // (std::sort with the index as tie-break: the order of a stable sort without its temporary buffer.)
        std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
          const double fa = context.fused[static_cast<std::size_t>(a)];
          const double fb = context.fused[static_cast<std::size_t>(b)];
          return fa > fb || (fa == fb && a < b);
        });
        const auto keep = std::min(order.size(), static_cast<std::size_t>(k));
        for (std::size_t i = 0; i < keep; ++i) selected[static_cast<std::size_t>(order[i])] = 1;
      }
    }
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      if (tree.is_root(n)) continue;
      const auto at = static_cast<std::size_t>(n);
      const int depth = tree.depth(n);
      if (depth <= last)
        selected[at] = 1;  // edge depth below the last split
      else if (depth > last + 1)
        selected[at] = selected[static_cast<std::size_t>(tree.parent(n))];
      mask[at] = selected[at] && tree.kind(n) == edge_kind::sde ? 1 : 0;
    }
    return mask;
  }

  friend bool operator==(const parent_top_k&, const parent_top_k&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "parent_top_k",
                                    summary = "width: the k best children of each last-split parent";
  static constexpr auto parameters() {
    return std::tuple{parameter("k", &parent_top_k::k, "children kept per last-split parent (best fused reward first)",
                                rules::at_least{1})};
  }
};

}  // namespace branchgrpo
