#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Optimistic fusion: a node's reward is the best leaf reward under it (what the node can still reach).
/// Example: the 7-node tree of uniform_mean (leaves 3, 4 under 1; 5, 6 under 2), leaf rewards
///   {1, 3, 2, 6} -> {6, 3, 6, 1, 3, 2, 6}.
/// @pre leaf_rewards.size() == tree.leaf_count(), every reward finite.
/// @post result.size() == tree.node_count(); result[n] == max of the leaf rewards under n.
struct max_reward {
  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    check_leaf_rewards(tree, leaf_rewards);
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    copy_leaf_rewards(tree, leaf_rewards, fused);
    double* const out = fused.data();
    for_each_level_bottom_up(tree, [out](const tree_level& level) {
      for (std::int32_t j = 0; j < level.parents.size(); ++j) {
        const double* const child = out + level.first_child + j * level.children;
        out[level.parents.begin + j] = *std::max_element(child, child + level.children);
      }
    });
    return fused;
  }
  friend bool operator==(const max_reward&, const max_reward&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "max_reward", summary = "the best leaf below";
};

}  // namespace branchgrpo
