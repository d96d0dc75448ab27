#pragma once
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// Flow-GRPO-Fast: a shared deterministic ODE prefix up to split_step, one SDE split into G children,
/// sde_steps SDE transitions in all (the split included), then ODE to the end. Only the SDE edges train.
/// Example: flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2} over 5 steps ->
///   kinds {ode, ode, sde, sde, ode}, branching {1, 1, 4, 1, 1}, 4 leaves, 1 + 1 + 1 + 4 + 4 = 11 evaluations.
/// @pre 0 <= split_step, split_step + sde_steps <= steps, sde_steps >= 1, group_size >= 1.
struct flow_grpo_fast {
  int group_size = 16;
  int split_step = 0;
  int sde_steps = 1;

  tree_plan operator()(int steps) const {
    check_step_count(steps);  // before the plan's vectors of that size
    require(group_size >= 1, "group size ", group_size, " is below 1");
    require(split_step >= 0 && split_step < steps, "split step ", split_step, " is not in [0, ", steps, ")");
    require(sde_steps >= 1, "sde_steps ", sde_steps, " is below 1 (the split itself is an SDE step)");
    require(split_step + sde_steps <= steps, "sde_steps ", sde_steps, " from split step ", split_step, " runs past ",
            steps, " steps");
    tree_plan plan{.steps = steps,
                   .roots = 1,
                   .branching = std::vector<int>(static_cast<std::size_t>(steps), 1),
                   .kinds = std::vector<edge_kind>(static_cast<std::size_t>(steps), edge_kind::ode)};
    plan.branching[static_cast<std::size_t>(split_step)] = group_size;
    for (int s = split_step; s < split_step + sde_steps; ++s) plan.kinds[static_cast<std::size_t>(s)] = edge_kind::sde;
    validate(plan);
    return plan;
  }
  friend bool operator==(const flow_grpo_fast&, const flow_grpo_fast&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "flow_grpo_fast", summary = "ODE prefix, one SDE split into G, ODE after";
  static constexpr auto parameters() {
    return std::tuple{parameter("group_size", &flow_grpo_fast::group_size, "samples per prompt, split at split_step",
                                rules::at_least{1}),
                      parameter("split_step", &flow_grpo_fast::split_step,
                                "the step at which the group splits from one ODE prefix", rules::at_least{0}),
                      parameter("sde_steps", &flow_grpo_fast::sde_steps,
                                "SDE (trained) steps from split_step on; ODE after", rules::at_least{1})};
  }
};

}  // namespace branchgrpo
