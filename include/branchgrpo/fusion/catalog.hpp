#pragma once
// The fusion weightings as one list (core/policy_list.hpp), the default first; any_fusion chooses one at run time.
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/fusion/max_reward.hpp"
#include "branchgrpo/fusion/path_softmax.hpp"
#include "branchgrpo/fusion/split_softmax.hpp"
#include "branchgrpo/fusion/step_gain.hpp"
#include "branchgrpo/fusion/uniform_mean.hpp"

namespace branchgrpo {

using fusion_policies = policy_list<"fusion", uniform_mean, path_softmax, split_softmax, max_reward, step_gain>;

/// One of the fusion weightings, chosen at run time. Default: uniform_mean.
using any_fusion = any_policy<fusion_policies>;

}  // namespace branchgrpo
