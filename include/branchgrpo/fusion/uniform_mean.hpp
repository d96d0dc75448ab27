#pragma once
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// The official code's default fusion: a node's reward is the plain mean of the leaf rewards under it
/// (paper Eq. 3 with beta = 0).
/// Example: split_schedule{.split_steps = {0, 1}, .branching = {2}} over 2 steps, one tree (root 0;
///   1, 2 at depth 1; leaves 3, 4 under 1 and 5, 6 under 2), leaf rewards {1, 3, 2, 6} ->
///   {3, 2, 4, 1, 3, 2, 6}  (root (1 + 3 + 2 + 6) / 4, node 1 (1 + 3) / 2, node 2 (2 + 6) / 2).
/// @pre leaf_rewards.size() == tree.leaf_count(), every reward finite.
/// @post result.size() == tree.node_count(); a leaf keeps its own reward exactly; a chain node (one
///   child) has exactly its child's reward.
/// The overload with `out` writes the same values into a caller's buffer (reused across iterations, no
/// allocation): @pre out.size() == tree.node_count(), out does not overlap leaf_rewards; @post out[n] ==
/// the vector overload's result[n] bit for bit, every element written.
struct uniform_mean {
  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    (*this)(tree, leaf_rewards, fused);
    return fused;
  }
  void operator()(const rollout_tree& tree, std::span<const double> leaf_rewards, std::span<double> out) const {
    check_leaf_rewards(tree, leaf_rewards);
    mean_of_leaves_under(tree, leaf_rewards, out);
  }
  friend bool operator==(const uniform_mean&, const uniform_mean&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "uniform_mean",
                                    summary = "mean of the leaves below (paper Eq. 3, beta 0); the default";
};

}  // namespace branchgrpo
