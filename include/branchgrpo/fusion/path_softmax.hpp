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

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Paper Eq. 3: r(n) = sum over leaves l under n of w_l r_l, w = softmax_l(beta * log p(path n -> l)),
/// log p(path n -> l) the sum of the edge log-probs from n (exclusive) down to l (inclusive).
/// beta = 0 is uniform_mean (bit for bit); beta = 1 weights each leaf by its path probability.
/// Example: the 7-node tree of uniform_mean, leaf rewards {1, 3, 2, 6}, edge log-probs of nodes 1..6
///   {0, -ln 2, 0, -ln 3, 0, 0}, beta 1 -> {18/7, 1.5, 4, 1, 3, 2, 6}:
///   node 1: weights 1 : 1/3 = 3/4, 1/4 -> 3/4 + 3/4 = 1.5; node 2: equal weights -> 4;
///   root: path probabilities 1, 1/3, 1/2, 1/2 -> weights 3/7, 1/7, 3/14, 3/14 -> 18/7 = 2.5714.
/// @pre beta finite; leaf_rewards.size() == tree.leaf_count(); rewards and edge log-probs finite.
/// @post result.size() == tree.node_count(); a leaf keeps its own reward; each result lies between the
///   smallest and the largest leaf reward under its node.
struct path_softmax {
  double beta = 1.0;

  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    require(std::isfinite(beta), "path_softmax beta ", beta, " is not finite");
    check_leaf_rewards(tree, leaf_rewards);
    // Bottom-up log-sum-exp. For node n and the leaves l under it, with v_l = beta * log p(path n -> l):
    // top = max_l v_l, mass = mean_l exp(v_l - top), fused = sum_l exp(v_l - top) r_l / sum_l exp(v_l - top).
    // Child c shifts its values by beta * log_prob(c), so a parent rescales each child by one exp. Children
    // hold equally many leaves (level-uniform plan), so the parent's mass is the mean of theirs; mass stays
    // in [1 / leaves, 1], and with beta = 0 every factor is exactly 1 (hence uniform_mean bit for bit).
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    copy_leaf_rewards(tree, leaf_rewards, fused);
    // top and mass live only for the level being combined and the one below it, indexed by position in
    // the level: four rows as wide as the widest level of a tree, its leaves. child_* hold the level done
    // last.
    const auto width = static_cast<std::size_t>(tree.leaves_per_tree());
    std::vector<double> scratch(4 * width);
    double* child_top = scratch.data();
    double* child_mass = child_top + width;
    double* parent_top = child_mass + width;
    double* parent_mass = parent_top + width;
    double* const out = fused.data();
    const double* const log_probs = tree.log_probs().data();
    const double scale = beta;
    bool finite = true;  // NaN or overflowing log-probs; diagnosed after the pass
    for_each_level_bottom_up(tree, [&](const tree_level& level) {
      if (level.depth == tree.steps() - 1) {  // a new tree: its leaves have top 0, mass 1
        std::fill_n(child_top, width, 0.0);
        std::fill_n(child_mass, width, 1.0);
      }
      const std::int32_t parents = level.parents.size();
      const int children = level.children;
      const double* const lp = log_probs + level.first_child;  // child k of the level: lp[k], in[k]
      const double* const in = out + level.first_child;
      double* const up = out + level.parents.begin;
      if (children == 1) {  // a chain: parent j's only child is j, so top is updated in place, mass kept
        for (std::int32_t j = 0; j < parents; ++j) child_top[j] += scale * lp[j];
        std::copy_n(in, parents, up);
      } else {
        bool level_finite = true;
        for (std::int32_t j = 0; j < parents; ++j) {
          const std::int32_t first = j * children;
          double best = scale * lp[first] + child_top[first];
          for (std::int32_t k = first; k < first + children; ++k) {
            const double value = scale * lp[k] + child_top[k];
            level_finite = level_finite && std::isfinite(value);
            best = std::max(best, value);
          }
          double sum = 0.0;
          double weight = 0.0;
          for (std::int32_t k = first; k < first + children; ++k) {
            const double value = scale * lp[k] + child_top[k];
            const double w = (value == best ? 1.0 : std::exp(value - best)) * child_mass[k];
            sum += w * in[k];
            weight += w;
          }
          parent_top[j] = best;
          parent_mass[j] = weight / static_cast<double>(children);
          up[j] = sum / weight;
        }
        finite = finite && level_finite;
        std::swap(child_top, parent_top);
        std::swap(child_mass, parent_mass);
      }
      // A NaN or overflow on a chain reaches the next split's values or, at the end, the roots' top.
      if (level.depth == 0)
        for (std::int32_t j = 0; j < parents; ++j) finite = finite && std::isfinite(child_top[j]);
    });
    if (!finite) {
      for (std::int32_t n = 0; n < tree.node_count(); ++n)
        if (!std::isfinite(beta * log_probs[n]))
          fail("path_softmax: edge log-prob ", log_probs[n], " of node ", n, " (child of node ", tree.parent(n),
               ") gives a non-finite scaled path log-prob ", beta * log_probs[n]);
      fail("path_softmax: a path log-prob times beta ", beta, " overflows");
    }
    return fused;
  }
  friend bool operator==(const path_softmax&, const path_softmax&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "path_softmax",
                                    summary = "leaves weighted by softmax(beta * path log-prob) (paper Eq. 3)";
  static constexpr auto parameters() {
    return std::tuple{parameter("beta", &path_softmax::beta,
                                "inverse temperature of the path log-probabilities (paper Eq. 3; 0 = uniform)",
                                rules::in_range{.low = -1e3, .high = 1e3})};
  }
};

}  // namespace branchgrpo
