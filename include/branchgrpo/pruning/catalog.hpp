#pragma once
// The pruners as one list (core/policy_list.hpp), the default first; a run-time list of them is any_pruner.
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/depth_window.hpp"
#include "branchgrpo/pruning/extreme.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/pruning/parent_top_k.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/pruning/value.hpp"

namespace branchgrpo {

using pruner_policies = policy_list<"pruner", keep_all, parent_top_k, depth_window, sde_window, extreme, value_prune>;

/// One pruner chosen at run time; it shapes rollouts when the held pruner does (sde_window) and cuts them when it
/// does (value).
struct any_pruner_choice : any_policy<pruner_policies> {
  using any_policy<pruner_policies>::any_policy;
  [[nodiscard]] tree_plan shape(const tree_plan& plan, int iteration) const {
    return std::visit([&](const auto& p) { return shape_plan(p, plan, iteration); }, policy);
  }
  [[nodiscard]] branchgrpo::rollout_cut rollout_cut(const tree_plan& plan, int iteration) const {
    return std::visit([&](const auto& p) { return rollout_cut_of(p, plan, iteration); }, policy);
  }
};

/// A run-time list of pruners on the generic combinators, active for the first fraction of the run:
/// any_pruner{.pruner = {.pruners = {parent_top_k{}}}, .fraction = 0.5}. Default: no pruner, always active.
using any_pruner = active_for<all_in<any_pruner_choice>>;

}  // namespace branchgrpo
