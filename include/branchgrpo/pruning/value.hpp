#pragma once
// Value pruning: width pruning made during the rollout, so that the pruned branches are never sampled.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/rollout/value_cut.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// What becomes of a branch the value pruning stopped:
///   value  its node keeps its value as the reward of the leaves it would have had, and its edge trains (default)
///   drop   its edge leaves the update; fusion and the baselines still see its value at its phantom leaves
enum class pruned_branch : std::uint8_t { value, drop };

inline constexpr std::array<enum_choice<pruned_branch>, 2> pruned_branch_names = {
    {{"value", pruned_branch::value}, {"drop", pruned_branch::drop}}};
constexpr const auto& enum_choices(pruned_branch) { return pruned_branch_names; }

/// Rollout-time pruning by a value estimate (the BranchGRPO paper's "dynamic pruning guided by a value estimate"):
/// at step `step` of the rollout every tree values its frontier nodes by a score of their predicted clean sample
/// x0-hat = x - sigma v (the run's reward on x0-hat in train_iteration; any RolloutValue through rollout()), keeps
/// the `keep` best and stops sampling below the others (rollout_cut, rollout/value_cut.hpp). The survivors' noise,
/// latents and log-probs are those of the unpruned tree bit for bit; the stopped subtrees cost no evaluation.
/// Paper-like default: the decision at the last split (step -1), keeping half of the dense tree's 8 nodes there.
/// Example: the dense tree (splits {0, 3, 6, 9}, K 2, 20 steps) with value_prune{} -> cut {step 9, keep 4}: the 4
///   lowest-valued of the 8 nodes at step 9 stop; 123 evaluations instead of 203; 8 sampled leaves, 8 phantom leaves
///   with their stopped node's value. The mask trains every sampled SDE edge (drop: but the 4 stopped nodes' edges).
/// Tree {steps 2, branching {2, 1}, kinds {sde, sde}} (root 0; 1, 2; leaves 3 under 1, 4 under 2) after
///   stop({1}, {0.4}): mask {0, 1, 1, 0, 1} (node 3 was not sampled); with pruned = drop {0, 0, 1, 0, 1}.
/// @pre step >= -1; keep >= 1; the step is at or before the plan's last split and not a skip step (validate on
///      rollout_cut: else invalid_input naming the key).
/// @post mask[n] == 1 only for a sampled non-root SDE edge.
struct value_prune {
  int step = -1;  ///< the step whose frontier is valued; -1: the last split
  int keep = 4;   ///< frontier nodes each tree keeps at that step
  pruned_branch pruned = pruned_branch::value;

  /// The cut this policy asks of the rollout of `plan`.
  /// Example: value_prune{}.rollout_cut(dense plan, 0) == rollout_cut{.step = 9, .keep = 4}.
  [[nodiscard]] branchgrpo::rollout_cut rollout_cut(const tree_plan& plan, int /*iteration*/) const {
    const std::vector<int> splits = plan.branching_steps();
    const int at = step >= 0 ? step : splits.empty() ? plan.steps : splits.back();
    const branchgrpo::rollout_cut cut{.step = at, .keep = keep};
    validate(cut, plan);
    return cut;
  }

  edge_mask operator()(const rollout_tree& tree, const prune_context& /*context*/) const {
    edge_mask mask = trainable_edges(tree);
    for (std::int32_t n = 0; n < tree.node_count(); ++n)
      if (!tree.sampled(n) || (pruned == pruned_branch::drop && tree.stopped(n))) mask[static_cast<std::size_t>(n)] = 0;
    return mask;
  }

  friend bool operator==(const value_prune&, const value_prune&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "value",
                                    summary = "prune during the rollout: the lowest x0-hat values stop being sampled";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("step", &value_prune::step, "step whose frontier is valued (-1: the last split)",
                  rules::at_least{-1}),
        parameter("keep", &value_prune::keep, "frontier nodes each tree keeps there", rules::at_least{1}),
        parameter("pruned", &value_prune::pruned, "a stopped branch keeps its value as leaf reward, or drops")};
  }
};

}  // namespace branchgrpo
