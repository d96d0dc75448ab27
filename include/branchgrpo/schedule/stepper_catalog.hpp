#pragma once
// The SDE steppers as one list (core/policy_list.hpp), the default first; any_stepper chooses one at run time.
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/schedule/steppers.hpp"

namespace branchgrpo {

using stepper_policies = policy_list<"stepper", dance_sde, flow_grpo_sde>;

/// One of the SDE steppers, chosen at run time. Default: dance_sde{.eta = 0.3}.
using any_stepper = any_policy<stepper_policies>;

}  // namespace branchgrpo
