#pragma once
// The advantage normalizers as one list (core/policy_list.hpp), the default first; any_normalizer chooses one at
// run time.
#include "branchgrpo/advantage/depth_wise.hpp"
#include "branchgrpo/advantage/leaf_group.hpp"
#include "branchgrpo/advantage/per_prompt_running.hpp"
#include "branchgrpo/core/policy_list.hpp"

namespace branchgrpo {

using advantage_policies = policy_list<"advantage", depth_wise, leaf_group, per_prompt_running>;

/// One of the advantage normalizers, chosen at run time; per_prompt_running's buffers reach a checkpoint through
/// its save_state / load_state (concept Stateful). Default: depth_wise per tree.
using any_normalizer = any_policy<advantage_policies>;

}  // namespace branchgrpo
