#pragma once
// Steppers: one denoising transition x_i -> x_{i+1} as an affine Gaussian step
//   mean = x_coeff * x + velocity_coeff * v,   next = mean + noise_std * eps.
// Every sampler used by GRPO for flow models has this form, so the engine, the backends and the policy
// update share one representation; a stepper only computes the three coefficients of step i.
//
// Policies (see docs/steppers.md):
//   dance_sde      DanceGRPO / BranchGRPO SDE (eta, default 0.3). The default of BranchGRPO.
//   flow_grpo_sde  Flow-GRPO SDE, sigma_t = a sqrt(t / (1 - t)) (noise_level a, default 0.7).
//   euler_ode      deterministic Euler step for ODE edges (noise_std = 0, never trained).
#include <cmath>
#include <concepts>
#include <numbers>
#include <span>
#include <string_view>
#include <tuple>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"

namespace branchgrpo {

/// Coefficients of one transition: mean = x_coeff * x + velocity_coeff * v; std = noise_std.
struct affine_step {
  double x_coeff = 1.0;
  double velocity_coeff = 0.0;
  double noise_std = 0.0;

  friend bool operator==(const affine_step&, const affine_step&) = default;
};

/// A stepper maps (schedule, step index) to the coefficients of that transition.
template <class S>
concept Stepper = std::regular<S> && requires(const S& stepper, const sigma_schedule& schedule, int step) {
  { stepper(schedule, step) } -> std::same_as<affine_step>;
};

namespace detail {
inline void check_step(const sigma_schedule& schedule, int step) {
  require(step >= 0 && step < schedule.steps(), "step ", step, " is outside [0, ", schedule.steps(), ")");
}
}  // namespace detail

/// DanceGRPO SDE with d = sig[i+1] - sig[i]:
///   x0 = x - sig v;  score = -(x - (1 - sig) x0) / sig^2;  mean = x + d v - 0.5 eta^2 score d;
///   std = eta sqrt(sig[i] - sig[i+1]).
/// Substituting score = -(x + (1 - sig) v) / sig gives the affine form below.
/// Example: schedule {1, 0.5, 0}, eta 0.3, step 0 (sig 1, d -0.5) ->
///   {x_coeff 0.9775, velocity_coeff -0.5, noise_std 0.3 sqrt(0.5)}.
/// @pre 0 <= step < schedule.steps().
struct dance_sde {
  double eta = 0.3;

  affine_step operator()(const sigma_schedule& schedule, int step) const {
    detail::check_step(schedule, step);
    require(std::isfinite(eta) && eta > 0.0, "dance_sde eta must be positive and finite, got ", eta);
    const double sig = schedule.sigma(step);
    const double d = schedule.sigma(step + 1) - sig;
    const double drift = 0.5 * eta * eta * d / sig;
    return {.x_coeff = 1.0 + drift, .velocity_coeff = d + drift * (1.0 - sig), .noise_std = eta * std::sqrt(-d)};
  }
  friend bool operator==(const dance_sde&, const dance_sde&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "dance_sde", summary = "DanceGRPO's SDE (eta); BranchGRPO's default";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("eta", &dance_sde::eta, "SDE noise scale (DanceGRPO eta)", rules::in_range{.low = 1e-4, .high = 10})};
  }
};

/// Flow-GRPO SDE: s_t = a sqrt(sig / (1 - sig)) (at sig = 1 the denominator uses sig[1], as Flow-GRPO does),
///   dt = sig[i+1] - sig[i];  mean = x (1 + s_t^2 dt / (2 sig)) + v (1 + s_t^2 (1 - sig) / (2 sig)) dt;
///   std = s_t sqrt(-dt).
/// Example: schedule {1, 0.5, 0}, a 0.7, step 1 (sig 0.5, dt -0.5, s_t 0.7) ->
///   {x_coeff 0.755, velocity_coeff -0.6225, noise_std 0.7 sqrt(0.5)}.
/// @pre 0 <= step < schedule.steps().
struct flow_grpo_sde {
  double noise_level = 0.7;

  affine_step operator()(const sigma_schedule& schedule, int step) const {
    detail::check_step(schedule, step);
    require(std::isfinite(noise_level) && noise_level > 0.0,
            "flow_grpo_sde noise_level must be positive and finite, got ", noise_level);
    const double sig = schedule.sigma(step);
    const double dt = schedule.sigma(step + 1) - sig;
    const double denominator = 1.0 - (sig == 1.0 ? schedule.sigma(1) : sig);
    const double std_t = noise_level * std::sqrt(sig / denominator);
    const double drift = std_t * std_t / (2.0 * sig);
    return {.x_coeff = 1.0 + drift * dt,
            .velocity_coeff = (1.0 + drift * (1.0 - sig)) * dt,
            .noise_std = std_t * std::sqrt(-dt)};
  }
  friend bool operator==(const flow_grpo_sde&, const flow_grpo_sde&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "flow_grpo_sde", summary = "Flow-GRPO's SDE (noise level a)";
  static constexpr auto parameters() {
    return std::tuple{parameter("noise_level", &flow_grpo_sde::noise_level, "SDE noise level (Flow-GRPO a)",
                                rules::in_range{.low = 1e-4, .high = 10})};
  }
};

/// Deterministic Euler step: mean = x + (sig[i+1] - sig[i]) v, no noise.
/// Example: schedule {1, 0.5, 0}, step 0 -> {1, -0.5, 0}.
struct euler_ode {
  affine_step operator()(const sigma_schedule& schedule, int step) const {
    detail::check_step(schedule, step);
    return {.x_coeff = 1.0, .velocity_coeff = schedule.sigma(step + 1) - schedule.sigma(step), .noise_std = 0.0};
  }
  friend bool operator==(const euler_ode&, const euler_ode&) = default;
};

/// log N(next; mean, std^2) averaged over the elements of one row: the edge log-prob of GRPO.
/// Example: next {1, 3}, mean {1, 1}, std 2 -> mean of {-log 2 - log sqrt(2 pi), -0.5 - log 2 - log sqrt(2 pi)}
///   = -0.25 - log 2 - 0.5 log(2 pi).
/// @pre next.size() == mean.size() > 0, std > 0.
inline double gaussian_log_prob_mean(std::span<const double> next, std::span<const double> mean, double std) {
  require(next.size() == mean.size() && !next.empty(), "log-prob needs equal non-empty rows, got ", next.size(),
          " and ", mean.size(), " elements");
  require(std::isfinite(std) && std > 0.0, "log-prob standard deviation must be positive, got ", std);
  double squares = 0.0;
  for (std::size_t i = 0; i < next.size(); ++i) squares += (next[i] - mean[i]) * (next[i] - mean[i]);
  const double n = static_cast<double>(next.size());
  return -squares / (2.0 * std * std * n) - std::log(std) - 0.5 * std::log(2.0 * std::numbers::pi);
}

}  // namespace branchgrpo
