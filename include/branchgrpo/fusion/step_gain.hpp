#pragma once
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
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Dense step rewards beside leaf fusion (DenseGRPO, arXiv 2601.20218; Stepwise-Flow-GRPO, arXiv 2603.28718): every
/// evaluated node's predicted clean sample x0-hat = x - sigma v is scored during the rollout (its value, recorded on
/// the tree: rollout_tree::value), and an edge is credited with the reward its step gained:
///   V(n)     = the leaf reward at a leaf, the value of n elsewhere
///   gain(n)  = V(n) - V(a), a the nearest valued ancestor of n (its parent, but above skip steps); 0 at a root and at
///              a node without a value (a skip-step node, a node below a stopped node)
///   fused(n) = (1 - weight) * (mean of the leaf rewards under n) + weight * gain(n)
/// weight 0 is uniform_mean; weight 1 credits the step gains alone (Stepwise-Flow-GRPO's r_{t-1} - r_t). The values
/// cost one reward call per evaluated step of the rollout (on the frontier's x0-hat rows); train_iteration makes them
/// with the run's reward whenever the fusion is step_gain.
/// Example: tree {steps 2, branching {2, 1}} (root 0; 1, 2; leaves 3 under 1, 4 under 2), values {0.5, 0.2, 0.8} at
///   nodes 0, 1, 2, leaf rewards {0.4, 1.0}, weight 0.5: means {0.7, 0.4, 1.0, 0.4, 1.0}, gains {0, -0.3, 0.3, 0.2,
///   0.2} -> {0.35, 0.05, 0.65, 0.3, 0.6}.
/// @pre leaf_rewards.size() == tree.leaf_count(), every reward finite; the tree has values (else invalid_input: dense
///      rewards without a value function); weight in [0, 1].
/// @post result.size() == tree.node_count(); with weight 0 the result is uniform_mean's.
struct step_gain {
  double weight = 0.5;  ///< share of the step gain in a node's reward

  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    require(weight >= 0.0 && weight <= 1.0, "step_gain weight ", weight, " is not in [0, 1]");
    check_leaf_rewards(tree, leaf_rewards);
    require(tree.has_values(),
            "step_gain fusion (dense rewards) without a value function: the rollout valued no node "
            "(train_iteration values every step for it; rollout() needs rollout_cut"
            "{.value_every_step = true} and a RolloutValue)");
    std::vector<double> fused = mean_of_leaves_under(tree, leaf_rewards);
    std::vector<double> own(static_cast<std::size_t>(tree.node_count()));
    for (std::int32_t n = 0; n < tree.node_count(); ++n) own[static_cast<std::size_t>(n)] = tree.value(n);
    copy_leaf_rewards(tree, leaf_rewards, own);
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      const bool has_own = tree.is_leaf(n) ? tree.sampled(n) : tree.valued(n);
      double gain = 0.0;
      if (has_own && !tree.is_root(n)) {
        std::int32_t above = tree.parent(n);
        while (above != no_parent && !tree.valued(above)) above = tree.parent(above);
        if (above != no_parent) gain = own[static_cast<std::size_t>(n)] - tree.value(above);
      }
      double& out = fused[static_cast<std::size_t>(n)];
      out = (1.0 - weight) * out + weight * gain;
    }
    return fused;
  }

  /// The rollout must value every evaluated step (rollout_cut::value_every_step): train_iteration asks.
  static constexpr bool needs_node_values = true;

  friend bool operator==(const step_gain&, const step_gain&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "step_gain",
                                    summary = "dense rewards: leaf mean mixed with each step's gain in x0-hat reward";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("weight", &step_gain::weight, "share of the step gain in a node's reward", rules::unit_interval{})};
  }
};

}  // namespace branchgrpo
