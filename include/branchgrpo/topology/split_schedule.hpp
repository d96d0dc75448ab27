#pragma once
#include <algorithm>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// BranchGRPO: one root; at each split step every node branches into K children; chains elsewhere.
/// `branching` holds one factor for every split, or one factor per split (in the order of split_steps).
/// Example: split_schedule::dense() over 20 steps -> 16 leaves, 219 nodes, 203 evaluations, 218 edges.
/// @pre split steps distinct and in [0, steps); factors >= 1; at most 2^24 leaves.
struct split_schedule {
  std::vector<int> split_steps = {0, 3, 6, 9};
  std::vector<int> branching = {2};

  static split_schedule dense(int factor = 2) { return {.split_steps = {0, 3, 6, 9}, .branching = {factor}}; }
  static split_schedule mixed(int factor = 2) { return {.split_steps = {0, 4, 8, 12}, .branching = {factor}}; }
  static split_schedule sparse(int factor = 2) { return {.split_steps = {0, 5, 10, 15}, .branching = {factor}}; }

  tree_plan operator()(int steps) const {
    check_step_count(steps);  // before the plan's vectors of that size
    require(branching.size() == 1 || branching.size() == split_steps.size(), "split_schedule has ", branching.size(),
            " branching factors for ", split_steps.size(), " split steps");
    require(!branching.empty(), "split_schedule needs at least one branching factor");
    tree_plan plan{.steps = steps,
                   .roots = 1,
                   .branching = std::vector<int>(static_cast<std::size_t>(steps), 1),
                   .kinds = std::vector<edge_kind>(static_cast<std::size_t>(steps), edge_kind::sde)};
    for (std::size_t i = 0; i < split_steps.size(); ++i) {
      const int step = split_steps[i];
      const int factor = branching.size() == 1 ? branching.front() : branching[i];
      require(step >= 0 && step < steps, "split step ", step, " is not in [0, ", steps, ")");
      require(factor >= 1, "branching factor ", factor, " at split step ", step, " is below 1");
      require(std::count(split_steps.begin(), split_steps.end(), step) == 1, "split step ", step,
              " is given more than once");
      plan.branching[static_cast<std::size_t>(step)] = factor;
    }
    validate(plan);
    return plan;
  }
  friend bool operator==(const split_schedule&, const split_schedule&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view
      name = "split_schedule",
      summary = "BranchGRPO tree: split steps and branching factors (the dense tree by default)";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("split_steps", &split_schedule::split_steps, "denoising steps at which every node splits, ascending",
                  rules::non_empty{.low = 0}),
        parameter("branching", &split_schedule::branching,
                  "children per split: one factor for every split, or one per split", rules::non_empty{.low = 1})};
  }
};

}  // namespace branchgrpo
