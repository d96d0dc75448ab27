#pragma once
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// DanceGRPO: G independent SDE chains per prompt. With shared_root the G chains start from one latent
/// whose first velocity is evaluated once (G children at step 0); without it they are G separate roots.
/// Example: sequential{.group_size = 16} over 20 steps -> 305 evaluations; shared_root false -> 320.
/// @pre 1 <= group_size <= 2^24.
struct sequential {
  int group_size = 16;
  bool shared_root = true;

  tree_plan operator()(int steps) const {
    check_step_count(steps);  // before the plan's vectors of that size
    require(group_size >= 1, "group size ", group_size, " is below 1");
    tree_plan plan{.steps = steps,
                   .roots = shared_root ? 1 : group_size,
                   .branching = std::vector<int>(static_cast<std::size_t>(steps), 1),
                   .kinds = std::vector<edge_kind>(static_cast<std::size_t>(steps), edge_kind::sde)};
    if (shared_root) plan.branching.front() = group_size;
    validate(plan);
    return plan;
  }
  friend bool operator==(const sequential&, const sequential&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "sequential", summary = "DanceGRPO / Flow-GRPO: G independent chains";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("group_size", &sequential::group_size, "independent chains (samples) per prompt", rules::at_least{1}),
        parameter("shared_root", &sequential::shared_root, "the chains start from one shared initial noise (DanceGRPO)",
                  rules::any{})};
  }
};

}  // namespace branchgrpo
