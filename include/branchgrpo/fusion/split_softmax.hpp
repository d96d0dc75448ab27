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
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// The official code's weighted fusion: recursive, r(n) = sum over children c of
/// softmax_c(alpha * log_prob(edge c)) r(c); a single child passes its reward through. Only the edges
/// leaving a split count; the chain edges below a split do not (unlike path_softmax).
/// Example: the 7-node tree of uniform_mean, leaf rewards {1, 3, 2, 6}, edge log-probs of nodes 1..6
///   {0, -ln 2, 0, -ln 3, 0, 0}, alpha 1 -> {7/3, 1.5, 4, 1, 3, 2, 6}:
///   node 1: weights 3/4, 1/4 -> 1.5; node 2: 1/2, 1/2 -> 4; root: weights 1 : 1/2 = 2/3, 1/3 over
///   r(1), r(2) -> 1 + 4/3 = 7/3 = 2.3333.
/// @pre alpha finite; leaf_rewards.size() == tree.leaf_count(); rewards and edge log-probs finite.
/// @post result.size() == tree.node_count(); a leaf keeps its own reward; a chain node has exactly its
///   child's reward.
struct split_softmax {
  double alpha = 1.0;

  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    require(std::isfinite(alpha), "split_softmax alpha ", alpha, " is not finite");
    check_leaf_rewards(tree, leaf_rewards);
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    copy_leaf_rewards(tree, leaf_rewards, fused);
    double* const out = fused.data();
    const double* const log_probs = tree.log_probs().data();
    for_each_level_bottom_up(tree, [&](const tree_level& level) {
      if (level.children == 1) {  // chains pass rewards through; their log-probs are not read
        std::copy_n(out + level.first_child, level.parents.size(), out + level.parents.begin);
        return;
      }
      for (std::int32_t j = 0; j < level.parents.size(); ++j) {
        const std::int32_t first = level.first_child + j * level.children;
        double best = alpha * log_probs[first];
        for (std::int32_t c = first; c < first + level.children; ++c) {
          const double value = alpha * log_probs[c];
          if (!std::isfinite(value))
            fail("split_softmax: edge log-prob ", log_probs[c], " of node ", c, " (child of node ",
                 level.parents.begin + j, ") times alpha ", alpha, " is not finite");
          best = std::max(best, value);
        }
        double sum = 0.0;
        double weight = 0.0;
        for (std::int32_t c = first; c < first + level.children; ++c) {
          const double value = alpha * log_probs[c];
          const double w = value == best ? 1.0 : std::exp(value - best);  // the best child needs no exp
          sum += w * out[c];
          weight += w;
        }
        out[level.parents.begin + j] = sum / weight;
      }
    });
    return fused;
  }
  friend bool operator==(const split_softmax&, const split_softmax&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "split_softmax",
                                    summary = "softmax over each split's child edges (the official code's)";
  static constexpr auto parameters() {
    return std::tuple{parameter("alpha", &split_softmax::alpha,
                                "inverse temperature of each split's child-edge softmax",
                                rules::in_range{.low = -1e3, .high = 1e3})};
  }
};

}  // namespace branchgrpo
