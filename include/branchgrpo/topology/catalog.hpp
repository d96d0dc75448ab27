#pragma once
// The topologies as one list (core/policy_list.hpp), the default first; any_topology chooses one at run time.
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/topology/adaptive_branching.hpp"
#include "branchgrpo/topology/flow_grpo_fast.hpp"
#include "branchgrpo/topology/sequential.hpp"
#include "branchgrpo/topology/split_schedule.hpp"

namespace branchgrpo {

using topology_policies = policy_list<"topology", split_schedule, sequential, flow_grpo_fast, adaptive_branching>;

/// One of the topologies, chosen at run time. Example: any_topology{sequential{.group_size = 4}}(20) is
/// sequential{.group_size = 4}(20). Default: split_schedule{}, the paper's dense tree.
using any_topology = any_policy<topology_policies>;

}  // namespace branchgrpo
