#pragma once
// Steppers: one denoising transition x_i -> x_{i+1} as an affine Gaussian step
//   mean = x_coeff * x + velocity_coeff * v,   next = mean + noise_std * eps.
// Every sampler used by GRPO for flow models has this form, so the engine, the backends and the policy
// update share one representation; a stepper only computes the coefficients of step i (and, for CPS, the std
// its edges are scored with).
//
// Policies (see docs/steppers.md):
//   dance_sde      DanceGRPO / BranchGRPO SDE (eta, default 0.3). The default of BranchGRPO.
//   flow_grpo_sde  Flow-GRPO SDE, sigma_t = a sqrt(t / (1 - t)) (noise_level a, default 0.7).
//   cps            coefficients-preserving sampling (Flow-CPS, eta in (0, 1], default 0.8), scored as Flow-CPS does.
//   per_layer_eta  dance_sde or cps with eta chosen per tree layer (Dynamic-TreeRPO's depth-dependent noise).
//   euler_ode      deterministic Euler step for ODE edges (noise_std = 0, never trained).
// ODE edges: ode_step(solver, schedule, jump), euler or DPM-Solver++(2M) over one or more steps (tree_plan::ode).
#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// Coefficients of one transition: mean = x_coeff * x + velocity_coeff * v + previous_x0_coeff * x0_prev; the
/// sample is drawn with std noise_std. x0_prev is the data prediction x - sigma v that the same path made at its
/// previous evaluated step (a multistep ODE solver's memory, ode_step; 0 for every one-step stepper). Its edge
/// log-prob is log N(next; mean, s^2) averaged over elements, with s = log_prob_std when that is positive (a
/// stepper whose log-prob is not its sampling density's: cps), else the std the sample was drawn with (noise_std
/// times the correlator's factor).
struct affine_step {
  double x_coeff = 1.0;
  double velocity_coeff = 0.0;
  double noise_std = 0.0;
  double log_prob_std = 0.0;       ///< 0: score with the drawn std; > 0: score every edge of the step with this std
  double previous_x0_coeff = 0.0;  ///< weight of the previous data prediction (ODE edges of a multistep solver)

  friend bool operator==(const affine_step&, const affine_step&) = default;
};

/// The std an edge of `step` is scored with when its sample was drawn with std `drawn_std`.
/// Example: {.noise_std = 0.2} drawn at 0.8 (scaled{4}) -> 0.8; {.noise_std = 0.2, .log_prob_std = 0.5} -> 0.5.
inline double scoring_std(const affine_step& step, double drawn_std) {
  return step.log_prob_std > 0.0 ? step.log_prob_std : drawn_std;
}

/// A plain stepper maps (schedule, step index) to the coefficients of that transition.
template <class S>
concept PlainStepper = std::regular<S> && requires(const S& stepper, const sigma_schedule& schedule, int step) {
  { stepper(schedule, step) } -> std::same_as<affine_step>;
};

/// A layered stepper also needs the tree layer of the step's edges (tree_plan::layer: the splits above the
/// parents), e.g. per_layer_eta. It offers only the three-argument call, so a caller that ignores layers does not
/// compile instead of silently using one layer's noise everywhere.
template <class S>
concept LayeredStepper = std::regular<S> &&
    requires(const S& stepper, const sigma_schedule& schedule, int step, int layer) {
  { stepper(schedule, step, layer) } -> std::same_as<affine_step>;
};

/// Either kind; callers go through step_coefficients, which passes the layer to a stepper that takes it.
template <class S>
concept Stepper = PlainStepper<S> || LayeredStepper<S>;

/// The coefficients of `step` whose edges lie at tree layer `layer`: stepper(schedule, step, layer) for a
/// layered stepper, stepper(schedule, step) otherwise (the layer is then irrelevant).
template <Stepper S>
affine_step step_coefficients(const S& stepper, const sigma_schedule& schedule, int step, int layer) {
  if constexpr (LayeredStepper<S>)
    return stepper(schedule, step, layer);
  else
    return stepper(schedule, step);
}

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

/// Coefficients-preserving sampling (CPS; Wang & Yu, arXiv 2509.05952; Flow-GRPO's sde_type "cps"), with
/// sig = sig[i], nxt = sig[i+1]:
///   std = nxt sin(eta pi / 2);  x0 = x - sig v;  x1 = x + (1 - sig) v;
///   mean = (1 - nxt) x0 + sqrt(nxt^2 - std^2) x1 = (1 - nxt) x0 + nxt cos(eta pi / 2) x1;  next = mean + std eps,
/// so next keeps the schedule's coefficients: (1 - nxt) on x0 and nxt^2 = (nxt cos)^2 + std^2 on the noise. With
/// c = nxt cos(eta pi / 2) the affine form is
///   x_coeff = 1 - nxt + c,  velocity_coeff = -(1 - nxt) sig + c (1 - sig),  noise_std = nxt sin(eta pi / 2).
/// Its log-prob is Flow-CPS's -mean_i (next_i - mean_i)^2, which is log N(next; mean, 1/2) averaged over elements
/// up to a constant (that cancels in every ratio and KL): log_prob_std = 1 / sqrt(2), whatever the correlator.
/// At the last step (nxt = 0) std = 0: the step is deterministic (next = x0) and an SDE plan makes it an ODE edge
/// (ode_where_noiseless, rollout/engine.hpp), as Flow-CPS never trains it (timestep_fraction 0.99).
/// Example: schedule {1, 0.5, 0}, eta 0.5, step 0 (sig 1, nxt 0.5, c = 0.5 cos(pi / 4) = 0.353553) ->
///   {x_coeff 0.853553, velocity_coeff -0.5, noise_std 0.353553, log_prob_std 0.707107};
///   step 1 (sig 0.5, nxt 0) -> {1, -0.5, 0, 0.707107}.
/// @pre 0 <= step < schedule.steps(); 0 < eta <= 1 (else invalid_input naming eta).
/// @post noise_std^2 + c^2 == nxt^2; log_prob_std == 1 / sqrt(2).
struct cps {
  double eta = 0.8;

  affine_step operator()(const sigma_schedule& schedule, int step) const {
    detail::check_step(schedule, step);
    require(std::isfinite(eta) && eta > 0.0 && eta <= 1.0, "cps eta must be in (0, 1], got ", eta);
    const double sig = schedule.sigma(step);
    const double nxt = schedule.sigma(step + 1);
    const double angle = eta * std::numbers::pi / 2.0;
    const double c = nxt * std::cos(angle);
    return {.x_coeff = 1.0 - nxt + c,
            .velocity_coeff = -(1.0 - nxt) * sig + c * (1.0 - sig),
            .noise_std = nxt * std::sin(angle),
            .log_prob_std = 1.0 / std::numbers::sqrt2};
  }
  friend bool operator==(const cps&, const cps&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "cps", summary = "coefficients-preserving sampling (Flow-CPS, eta)";
  static constexpr auto parameters() {
    return std::tuple{parameter("eta", &cps::eta, "CPS noise angle: std = sigma[i+1] sin(eta pi / 2)",
                                rules::in_range{.low = 1e-4, .high = 1})};
  }
};

/// The sampler per_layer_eta applies at each layer.
enum class layer_sampler : std::uint8_t { dance_sde, cps };

inline constexpr std::array<enum_choice<layer_sampler>, 2> layer_sampler_names = {
    {{"dance_sde", layer_sampler::dance_sde}, {"cps", layer_sampler::cps}}};
constexpr const auto& enum_choices(layer_sampler) { return layer_sampler_names; }

/// Depth-dependent noise (Dynamic-TreeRPO, arXiv 2509.23352: a noise intensity per tree layer): dance_sde or cps
/// with eta = etas[min(layer, etas.size() - 1)], where the layer of step s's edges is the number of splits above
/// their parents (tree_plan::layer; the edges of the l-th split are at layer l, the chain after it at l + 1).
/// A layer beyond the list takes the last value, so {0.5, 0.3} means 0.5 at the first split, 0.3 below it.
/// Example: split_schedule{.split_steps = {0, 2}} over shifted_linear_schedule(4) has layers {0, 1, 1, 2};
///   per_layer_eta{.etas = {0.5, 0.3}}(schedule, 3, 2) == dance_sde{.eta = 0.3}(schedule, 3) and
///   per_layer_eta{.etas = {0.5, 0.3}}(schedule, 0, 0) == dance_sde{.eta = 0.5}(schedule, 0).
/// @pre etas non-empty, each positive and finite (cps: in (0, 1]); layer >= 0; else invalid_input naming the value.
/// @post the result is the sampler's at that layer's eta, bit for bit.
struct per_layer_eta {
  std::vector<double> etas = {0.3};
  layer_sampler sampler = layer_sampler::dance_sde;

  affine_step operator()(const sigma_schedule& schedule, int step, int layer) const {
    require(!etas.empty(), "per_layer_eta needs at least one eta");
    require(layer >= 0, "per_layer_eta layer ", layer, " is negative");
    const bool with_cps = sampler == layer_sampler::cps;
    for (std::size_t i = 0; i < etas.size(); ++i)
      require(std::isfinite(etas[i]) && etas[i] > 0.0 && (!with_cps || etas[i] <= 1.0), "per_layer_eta etas[", i,
              "] = ", etas[i], with_cps ? " is not in (0, 1] (cps)" : " is not positive and finite");
    const double eta = etas[std::min(static_cast<std::size_t>(layer), etas.size() - 1)];
    return with_cps ? cps{.eta = eta}(schedule, step) : dance_sde{.eta = eta}(schedule, step);
  }
  friend bool operator==(const per_layer_eta&, const per_layer_eta&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "per_layer_eta",
                                    summary = "eta per tree layer on dance_sde or cps (Dynamic-TreeRPO)";
  static constexpr auto parameters() {
    return std::tuple{parameter("etas", &per_layer_eta::etas,
                                "eta of each tree layer (splits above the parents); the last repeats below",
                                rules::non_empty{.low = 1e-4}),
                      parameter("sampler", &per_layer_eta::sampler, "the stepper each layer's eta is given to")};
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

/// One ODE edge: it leaves step `from` and lands on sigma(to) (to > from + 1 when skip steps follow it,
/// tree_plan::ode_target); `previous` is the step at which the same deterministic path last predicted its data
/// x0 = x - sigma v (an evaluated ODE step right before `from`'s run position), or -1 when there is none (the path
/// just left a root or an SDE edge).
struct ode_jump {
  int from = 0;
  int to = 1;
  int previous = -1;

  friend bool operator==(const ode_jump&, const ode_jump&) = default;
};

/// The coefficients of an ODE edge as `solver` integrates it (no noise; never trained):
///   euler:          mean = x + (sig_to - sig_from) v.
///   dpm_solver_2m:  DPM-Solver++(2M) (Lu et al., arXiv 2211.01095, Algorithm 2; MixGRPO-Flash, arXiv 2507.21802,
///                   on the ODE steps outside its SDE window) in the data prediction of a flow (alpha = 1 - sigma,
///                   lambda = ln(alpha / sigma)): with rho = sig_to / sig_from, h = lambda_to - lambda_from,
///                   r = (lambda_from - lambda_prev) / h,
///                     D = (1 + 1/(2r)) x0 - x0_prev / (2r),   mean = rho x + (1 - rho) D,
///                   where alpha_to (1 - e^-h) = 1 - rho for a flow. With x0 = x - sig_from v the affine form is
///                     x_coeff = rho + (1 - rho)(1 + 1/(2r)),  velocity_coeff = -(1 - rho)(1 + 1/(2r)) sig_from,
///                     previous_x0_coeff = -(1 - rho) / (2r).
///                   First order, i.e. Euler, when previous is -1 or any of the three lambdas is infinite (sigma 1 at
///                   the first step, 0 at the last: DPM-Solver's lower order at the ends).
/// Example: schedule {1, 0.75, 0.5, 0.25, 0}, dpm_solver_2m, {.from = 2, .to = 3, .previous = 1}: lambdas
///   -ln 3, 0, ln 3, r = 1, rho 0.5 -> {x_coeff 1.25, velocity_coeff -0.375, previous_x0_coeff -0.25} (exact on a
///   straight path: x = (1 - t) x0 + t eps gives 0.75 x0 + 0.25 eps); {.from = 2, .to = 4, .previous = 1} ->
///   Euler {1, -0.5}; euler, {.from = 1, .to = 3} -> {1, -0.5}.
/// @pre 0 <= from < to <= schedule.steps(), -1 <= previous < from (else invalid_input naming the value).
/// @post noise_std == 0; x_coeff + previous_x0_coeff == 1 (the solver keeps a constant data prediction's x0).
inline affine_step ode_step(ode_solver solver, const sigma_schedule& schedule, const ode_jump& jump) {
  require(jump.from >= 0 && jump.from < jump.to && jump.to <= schedule.steps(), "ODE edge from step ", jump.from,
          " to ", jump.to, " is outside [0, ", schedule.steps(), "]");
  require(jump.previous >= -1 && jump.previous < jump.from, "ODE edge from step ", jump.from,
          " has its previous data prediction at step ", jump.previous);
  const double sig_from = schedule.sigma(jump.from), sig_to = schedule.sigma(jump.to);
  const affine_step euler{.x_coeff = 1.0, .velocity_coeff = sig_to - sig_from};
  if (solver == ode_solver::euler || jump.previous < 0) return euler;
  const double sig_prev = schedule.sigma(jump.previous);
  const auto lambda = [](double sigma) { return std::log((1.0 - sigma) / sigma); };
  const double lambda_prev = lambda(sig_prev), lambda_from = lambda(sig_from), lambda_to = lambda(sig_to);
  if (!std::isfinite(lambda_prev) || !std::isfinite(lambda_from) || !std::isfinite(lambda_to)) return euler;
  const double r = (lambda_from - lambda_prev) / (lambda_to - lambda_from);
  const double rho = sig_to / sig_from, half_inverse = 1.0 / (2.0 * r);
  return {.x_coeff = rho + (1.0 - rho) * (1.0 + half_inverse),
          .velocity_coeff = -(1.0 - rho) * (1.0 + half_inverse) * sig_from,
          .previous_x0_coeff = -(1.0 - rho) * half_inverse};
}

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
