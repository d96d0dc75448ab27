#pragma once
#include <string_view>

#include "branchgrpo/pruning/concept.hpp"

namespace branchgrpo {

/// No pruning: every trainable (non-root SDE) edge is trained (DanceGRPO, plain BranchGRPO).
/// Example: a dense tree of 219 nodes -> a mask of 218 ones (the root 0).
struct keep_all {
  edge_mask operator()(const rollout_tree& tree, const prune_context&) const { return trainable_edges(tree); }
  friend bool operator==(const keep_all&, const keep_all&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "keep_all", summary = "train every SDE edge";
};

}  // namespace branchgrpo
