#pragma once
// Per-denoising-step weights of the policy loss (docs/loss.md): every trained edge of step t has its loss, hence its
// d loss / d log-prob, multiplied by w_t. Two published choices besides none, and one for trees:
//   inverse_dt   w_t = 1 / (sigma_t - sigma_{t+1})          GRPO-Guard's gradient reweighting (arXiv 2510.22319)
//   noise_std    w_t = std_t / mean_s std_s (mean 1 over the  TempFlow-GRPO's noise-aware weighting (arXiv 2508.04324)
//                schedule's steps), std_t the step's noise std
//   equal_steps  w_t = (E / S) / E_t: E trained edges over S   new here: every trained step weighs as much as in
//                steps, E_t of them at step t                  DanceGRPO's chains, however many nodes the tree has
//                there
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"

namespace branchgrpo {

/// How the policy loss weighs the denoising steps (ppo_options::step_weight).
enum class step_weighting { none, inverse_dt, noise_std, equal_steps };

/// The names configs use, in enum order.
inline constexpr std::array<enum_choice<step_weighting>, 4> step_weighting_choices = {
    {{"none", step_weighting::none},
     {"inverse_dt", step_weighting::inverse_dt},
     {"noise_std", step_weighting::noise_std},
     {"equal_steps", step_weighting::equal_steps}}};
constexpr const auto& enum_choices(step_weighting) { return step_weighting_choices; }

namespace detail {
/// "none, inverse_dt, noise_std or equal_steps".
inline std::string step_weighting_list() {
  std::vector<std::string_view> names;
  for (const auto& choice : step_weighting_choices) names.push_back(choice.name);
  return name_list(names);
}
}  // namespace detail

/// Example: step_weighting_name(step_weighting::inverse_dt) == "inverse_dt".
/// @pre mode is one of the enumerators (else invalid_input naming its number).
inline std::string_view step_weighting_name(step_weighting mode) {
  for (const auto& choice : step_weighting_choices)
    if (choice.value == mode) return choice.name;
  fail("ppo step_weight ", static_cast<std::size_t>(mode), " is not ", detail::step_weighting_list());
}

/// Example: parse_step_weighting("noise_std") == step_weighting::noise_std; parse_step_weighting("dt") throws
///   "ppo step_weight \"dt\" is not none, inverse_dt, noise_std or equal_steps".
inline step_weighting parse_step_weighting(std::string_view name) {
  for (const auto& choice : step_weighting_choices)
    if (choice.name == name) return choice.value;
  fail("ppo step_weight \"", name, "\" is not ", detail::step_weighting_list());
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

/// equal_steps' weights: a step with E_t trained edges gets w_t = (E / S) / E_t, E the trained edges of all steps and
/// S the steps that have any, so every trained step carries the same total weight, as each step does in DanceGRPO's
/// chains (G edges at every step), while a tree has 2 nodes per tree at its first steps and 16 at its last. The
/// weights of the edges sum to E, as without weights. Steps without trained edges get 0.
/// Example: edges per step {2, 4, 0, 10} -> E 16, S 3 -> {2.666667, 1.333333, 0, 0.533333}; {16, 16} -> {1, 1}.
/// @pre some step has an edge; counts >= 0.
/// @post sum_t w_t E_t == E.
inline std::vector<double> equal_step_weights(std::span<const double> edges_per_step) {
  double edges = 0, steps = 0;
  for (const double count : edges_per_step) {
    require(count >= 0.0 && std::isfinite(count), "equal_steps weights: an edge count of ", count);
    edges += count;
    steps += count > 0 ? 1 : 0;
  }
  require(edges > 0, "equal_steps weights: no step has a trained edge");
  std::vector<double> weights(edges_per_step.size(), 0.0);
  for (std::size_t t = 0; t < weights.size(); ++t)
    if (edges_per_step[t] > 0) weights[t] = edges / steps / edges_per_step[t];
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
    case step_weighting::equal_steps:
      fail("ppo step_weight equal_steps depends on the trained edges: equal_step_weights, not step_loss_weights");
  }
  fail("ppo step_weight ", static_cast<int>(mode), " is not none, inverse_dt, noise_std or equal_steps");
}

}  // namespace branchgrpo
