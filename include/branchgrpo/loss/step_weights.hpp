#pragma once
// Per-denoising-step weights of the policy loss (docs/loss.md): every trained edge of step t has its loss, hence its
// d loss / d log-prob, multiplied by w_t. Two published choices besides none:
//   inverse_dt  w_t = 1 / (sigma_t - sigma_{t+1})           GRPO-Guard's gradient reweighting (arXiv 2510.22319)
//   noise_std   w_t = std_t / mean_s std_s (mean 1 over the   TempFlow-GRPO's noise-aware weighting (arXiv 2508.04324)
//               schedule's steps), std_t the step's noise std
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"

namespace branchgrpo {

/// How the policy loss weighs the denoising steps (ppo_options::step_weight).
enum class step_weighting { none, inverse_dt, noise_std };

/// The names configs use, in enum order.
inline constexpr std::string_view step_weighting_names[] = {"none", "inverse_dt", "noise_std"};

/// Example: step_weighting_name(step_weighting::inverse_dt) == "inverse_dt".
/// @pre mode is one of the enumerators (else invalid_input naming its number).
inline std::string_view step_weighting_name(step_weighting mode) {
  const auto index = static_cast<std::size_t>(mode);
  require(index < std::size(step_weighting_names), "ppo step_weight ", index, " is not none, inverse_dt or noise_std");
  return step_weighting_names[index];
}

/// Example: parse_step_weighting("noise_std") == step_weighting::noise_std; parse_step_weighting("dt") throws
///   "ppo step_weight \"dt\" is not none, inverse_dt or noise_std".
inline step_weighting parse_step_weighting(std::string_view name) {
  for (std::size_t i = 0; i < std::size(step_weighting_names); ++i)
    if (name == step_weighting_names[i]) return static_cast<step_weighting>(i);
  fail("ppo step_weight \"", name, "\" is not none, inverse_dt or noise_std");
}

/// GRPO-Guard's gradient reweighting of step t: 1 / dt with dt = sigma_t - sigma_{t+1}. The transition mean moves
/// with the velocity by a coefficient proportional to dt (flow_grpo_sde: (1 + a^2 / 2) dt), so the gradient of a
/// step's ratio-normalized loss is proportional to dt; dividing by dt gives every step the same scale.
/// Example: inverse_dt_weight(1.0, 0.75) == 4; inverse_dt_weight(0.75, 0.0) == 1.333333.
/// @pre 0 <= sigma_next < sigma <= 1 (a step of a sigma_schedule).
inline double inverse_dt_weight(double sigma, double sigma_next) {
  require(sigma_next >= 0.0 && sigma_next < sigma && sigma <= 1.0, "inverse_dt weight of the step from sigma ", sigma,
          " to ", sigma_next, " is undefined (needs 0 <= next < sigma <= 1)");
  return 1.0 / (sigma - sigma_next);
}

/// TempFlow-GRPO's noise-aware weights: w_t = std_t / mean_s std_s over every step of the schedule, so the weights
/// average 1 and a noisier (earlier, more exploratory) step counts more.
/// Example: noise_aware_weights({0.3, 0.2, 0.1}) == {1.5, 1.0, 0.5}.
/// @pre non-empty; every std finite and >= 0; their mean > 0.
/// @post same size; mean 1 (to rounding); w_t proportional to std_t.
inline std::vector<double> noise_aware_weights(std::span<const double> step_noise_std) {
  require(!step_noise_std.empty(), "noise_std weights of no steps");
  double sum = 0;
  for (std::size_t t = 0; t < step_noise_std.size(); ++t) {
    require(std::isfinite(step_noise_std[t]) && step_noise_std[t] >= 0.0, "noise_std weight: step ", t, " has std ",
            step_noise_std[t]);
    sum += step_noise_std[t];
  }
  require(sum > 0.0, "noise_std weights: every step has std 0 (an ODE stepper)");
  const double mean = sum / static_cast<double>(step_noise_std.size());
  std::vector<double> weights(step_noise_std.size());
  for (std::size_t t = 0; t < weights.size(); ++t) weights[t] = step_noise_std[t] / mean;
  return weights;
}

/// The loss weight of every step of `schedule` under `mode`; step_noise_std[t] is the noise std of step t (the
/// stepper's, read only by noise_std).
/// Example: schedule {1, 0.75, 0}, stds {0.3, 0.1}: none -> {1, 1}; inverse_dt -> {4, 1.333333};
///   noise_std -> {1.5, 0.5}.
/// @pre step_noise_std.size() == schedule.steps().
/// @post one weight per step, each finite and >= 0.
inline std::vector<double> step_loss_weights(step_weighting mode, const sigma_schedule& schedule,
                                             std::span<const double> step_noise_std) {
  const auto steps = static_cast<std::size_t>(schedule.steps());
  require(step_noise_std.size() == steps, "step weights got ", step_noise_std.size(), " noise stds for ", steps,
          " steps");
  switch (mode) {
    case step_weighting::none:
      return std::vector<double>(steps, 1.0);
    case step_weighting::inverse_dt: {
      std::vector<double> weights(steps);
      for (std::size_t t = 0; t < steps; ++t)
        weights[t] = inverse_dt_weight(schedule.sigma(static_cast<int>(t)), schedule.sigma(static_cast<int>(t) + 1));
      return weights;
    }
    case step_weighting::noise_std:
      return noise_aware_weights(step_noise_std);
  }
  fail("ppo step_weight ", static_cast<int>(mode), " is not none, inverse_dt or noise_std");
}

}  // namespace branchgrpo
