#pragma once
// The SDE steppers as one list (core/policy_list.hpp), the default first; any_stepper chooses one at run time.
#include <variant>

#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/schedule/steppers.hpp"

namespace branchgrpo {

using stepper_policies = policy_list<"stepper", dance_sde, flow_grpo_sde, cps, per_layer_eta>;

/// One of the SDE steppers, chosen at run time. Default: dance_sde{.eta = 0.3}.
/// It is a LayeredStepper: the list holds per_layer_eta, so the call takes the layer and passes it on to the held
/// stepper when that stepper takes one (step_coefficients).
/// Example: any_stepper{cps{.eta = 0.5}}(schedule, 0, 3) == cps{.eta = 0.5}(schedule, 0).
struct any_stepper : any_policy<stepper_policies> {
  using any_policy<stepper_policies>::any_policy;
  affine_step operator()(const sigma_schedule& schedule, int step, int layer) const {
    return std::visit([&](const auto& held) { return step_coefficients(held, schedule, step, layer); }, policy);
  }
  friend bool operator==(const any_stepper&, const any_stepper&) = default;
};

}  // namespace branchgrpo
