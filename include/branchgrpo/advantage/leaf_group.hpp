#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/advantage/scale_guards.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// DanceGRPO's group advantage: z-score the raw leaf rewards within each prompt group (the trees sharing
/// info(t).prompt), A_l = (r_l - mu) / (sigma + epsilon) with sigma the unbiased std, A_l = 0 when the
/// group holds one leaf or sigma < min_std. Every edge on a leaf's path gets that leaf's advantage; an
/// edge shared by several leaves (a tree) gets the mean of theirs. Fused rewards are not read.
/// Example: the 7-node tree of uniform_mean (leaves 3, 4 under 1; 5, 6 under 2), leaf rewards
///   {1, 3, 2, 6}: mu 3, sigma sqrt(14 / 3) = 2.16025, leaf advantages {-0.92582, 0, -0.46291, 1.38873} ->
///   {0, -0.46291, 0.46291, -0.92582, 0, -0.46291, 1.38873}.
/// @pre epsilon, min_std finite and >= 0, not both 0; rewards.leaf.size() == tree.leaf_count(), finite.
/// @post result.size() == tree.node_count(); roots 0; an edge with one leaf under it has that leaf's
///   advantage.
struct leaf_group {
  double epsilon = 1e-8;
  double min_std = 1e-6;

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) const {
    detail::check_scale_guards("leaf_group", epsilon, min_std);
    const std::span<const double> leaf = rewards.leaf;
    check_leaf_rewards(tree, leaf);
    // Trees sorted by prompt: each run of equal prompts is one group. A tree's leaves are the
    // contiguous positions [t * per_tree, (t + 1) * per_tree) of leaves().
    std::vector<std::pair<std::int64_t, std::int32_t>> order(static_cast<std::size_t>(tree.tree_count()));
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) order[static_cast<std::size_t>(t)] = {tree.info(t).prompt, t};
    std::sort(order.begin(), order.end());
    const auto per_tree = static_cast<std::size_t>(tree.leaves_per_tree());
    std::vector<double> leaf_advantages(leaf.size(), 0.0);
    for (std::size_t begin = 0; begin < order.size();) {
      std::size_t end = begin + 1;
      while (end < order.size() && order[end].first == order[begin].first) ++end;
      const auto for_each_leaf = [&](auto&& visit) {
        for (std::size_t g = begin; g < end; ++g) {
          const std::size_t first = static_cast<std::size_t>(order[g].second) * per_tree;
          for (std::size_t i = first; i < first + per_tree; ++i) visit(i);
        }
      };
      const std::size_t m = (end - begin) * per_tree;
      double sum = 0.0;
      for_each_leaf([&](std::size_t i) { sum += leaf[i]; });
      const double mean = sum / static_cast<double>(m);
      double squares = 0.0;
      for_each_leaf([&](std::size_t i) { squares += (leaf[i] - mean) * (leaf[i] - mean); });
      const double sigma = m > 1 ? std::sqrt(squares / static_cast<double>(m - 1)) : 0.0;
      if (m > 1 && sigma >= min_std)
        for_each_leaf([&](std::size_t i) { leaf_advantages[i] = (leaf[i] - mean) / (sigma + epsilon); });
      begin = end;
    }
    return spread_leaf_advantages(tree, leaf_advantages);
  }
  friend bool operator==(const leaf_group&, const leaf_group&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "leaf_group", summary = "z-score of the leaves per prompt group (DanceGRPO)";
  static constexpr auto parameters() {
    return std::tuple{parameter("epsilon", &leaf_group::epsilon, "added to the std before dividing",
                                rules::in_range{.low = 0, .high = 1}),
                      parameter("min_std", &leaf_group::min_std, "a group whose std is below this gets advantage 0",
                                rules::in_range{.low = 0, .high = 1})};
  }
};

}  // namespace branchgrpo
