#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

namespace detail {

/// Siblings wider than this are sorted instead of ranked by counting (K^2 comparisons).
inline constexpr int top_rank_limit = 64;

/// selected[i] = 1 for the `keep` best of the `width` siblings `value` (higher first; ties: the lower
/// rank), 0 for the others. The order is the strict total order "value greater, or equal and a lower
/// index", so counting the siblings that precede a child gives its place in the sorted order.
/// @pre 1 <= keep; width >= 1; the values are not NaN.
/// @post exactly min(keep, width) flags are 1.
inline void select_top(const double* value, std::uint8_t* selected, int width, int keep,
                       std::vector<std::int32_t>& order) {
  if (keep >= width) {
    std::fill(selected, selected + width, std::uint8_t{1});
    return;
  }
  if (keep == 1) {  // the first maximum
    int best = 0;
    for (int i = 1; i < width; ++i)
      if (value[i] > value[best]) best = i;
    for (int i = 0; i < width; ++i) selected[i] = i == best ? 1 : 0;
    return;
  }
  if (width <= top_rank_limit) {
    for (int i = 0; i < width; ++i) {
      int before = 0;
      for (int b = 0; b < width; ++b) before += value[b] > value[i] || (value[b] == value[i] && b < i) ? 1 : 0;
      selected[i] = before < keep ? 1 : 0;
    }
    return;
  }
  order.resize(static_cast<std::size_t>(width));
  for (int i = 0; i < width; ++i) order[static_cast<std::size_t>(i)] = i;
  std::sort(order.begin(), order.end(),
            [value](std::int32_t a, std::int32_t b) { return value[a] > value[b] || (value[a] == value[b] && a < b); });
  std::fill(selected, selected + width, std::uint8_t{0});
  for (int i = 0; i < keep; ++i) selected[order[static_cast<std::size_t>(i)]] = 1;
}

}  // namespace detail

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
/// The overload with `out` writes the same mask into a caller's buffer (reused across iterations, no
/// allocation): @pre out.size() == tree.node_count(); @post out == the vector overload's mask, every flag
/// written.
struct parent_top_k {
  int k = 1;

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 0);
    (*this)(tree, context, mask);
    return mask;
  }

  void operator()(const rollout_tree& tree, const prune_context& context, std::span<std::uint8_t> out) const {
    require(k >= 1, "parent_top_k k ", k, " is below 1");
    require(out.size() == static_cast<std::size_t>(tree.node_count()), "parent_top_k got room for ", out.size(),
            " mask flags for ", tree.node_count(), " nodes");
    const int last = tree.last_split_depth();
    if (last < 0) return trainable_edges(tree, out);
    require(context.fused.size() == static_cast<std::size_t>(tree.node_count()), "parent_top_k got ",
            context.fused.size(), " fused rewards for ", tree.node_count(), " nodes");

    // Level by level, tree by tree. Below depth L every node has one child, so every level deeper than L
    // has as many nodes as level L + 1, and node j of such a level lies in the subtree of node j of level
    // L + 1: it is selected when that node is. Level L + 1 first holds the selection itself, then the mask.
    const tree_plan& plan = tree.plan();
    const auto sde = [&plan](int depth) -> std::uint8_t {  // the edges into depth >= 1 share one kind
      return plan.kinds[static_cast<std::size_t>(depth) - 1] == edge_kind::sde ? 1 : 0;
    };
    const int width = plan.branching[static_cast<std::size_t>(last)];  // children per depth-L parent
    const auto keep = static_cast<int>(std::min(k, width));
    const double* const fused = context.fused.data();
    std::uint8_t* const mask = out.data();
    std::vector<std::int32_t> order;  // only for splits wider than detail::top_rank_limit
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
      for (int d = 0; d <= last; ++d) {  // roots 0; edge depth <= L: every SDE edge
        const node_range level = tree.nodes_at_depth(t, d);
        std::fill(mask + level.begin, mask + level.end, d == 0 ? std::uint8_t{0} : sde(d));
      }
      const node_range parents = tree.nodes_at_depth(t, last);
      const std::int32_t first_child = tree.nodes_at_depth(t, last + 1).begin;
      for (std::int32_t j = 0; j < parents.size(); ++j) {
        const std::int32_t begin = first_child + j * width;  // the children of parent parents.begin + j
        for (std::int32_t c = begin; c < begin + width; ++c)
          if (!std::isfinite(fused[c])) fail("parent_top_k fused reward ", c, " is ", fused[c]);
        detail::select_top(fused + begin, mask + begin, width, keep, order);
      }
      const node_range selection = tree.nodes_at_depth(t, last + 1);
      for (int d = last + 2; d <= tree.steps(); ++d) {
        const std::uint8_t flag = sde(d);
        const std::int32_t begin = tree.nodes_at_depth(t, d).begin;
        for (std::int32_t j = 0; j < selection.size(); ++j) mask[begin + j] = mask[selection.begin + j] & flag;
      }
      const std::uint8_t flag = sde(last + 1);
      for (std::int32_t n = selection.begin; n < selection.end; ++n) mask[n] &= flag;
    }
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
